"""The reads behind a run comparison and a run's infrastructure lineage, bound to one tenant.

Everything per step is aggregated in the engine from the ``steps_by_step`` rollup and the scalars
table; what comes back is a row per run (speed, health) or per run, metric and bucket of the
matched step range (loss curves), so comparing twenty 100,000-step runs moves kilobytes.
Aliases differ from the column names used inside aggregates (ClickHouse resolves an alias that
shadows a column inside another aggregate to the alias).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from .reader import TenantReader

__all__ = ["ComparisonQueries"]

_PER_STEP = (
    # one row per (run, step): its last execution's duration, tokens and rank spread
    "SELECT run_id, step, argMax(x_dur, x_start) AS s_dur, argMax(x_tok, x_start) AS s_tok,"
    " argMax(x_spread, x_start) AS s_spread, argMax(x_ranks, x_start) AS s_ranks,"
    " min(x_start) AS s_start, max(x_end) AS s_end, count() AS s_exec FROM ("
    "  SELECT run_id, step, job_id, max(max_duration) AS x_dur, sum(tokens) AS x_tok,"
    "  if(sum(sum_compute) > 0, max(max_compute) * sum(ranks) / sum(sum_compute) - 1, nan)"
    "  AS x_spread, sum(ranks) AS x_ranks, min(start) AS x_start, max(`end`) AS x_end"
    "  FROM {db}.steps_by_step WHERE run_id IN {runs:Array(String)}"
    "  GROUP BY run_id, step, job_id"
    ") GROUP BY run_id, step"
)


class ComparisonQueries:
    def __init__(self, reader: TenantReader) -> None:
        self.r = reader

    def speed(self, runs: list[str]) -> pa.Table:
        """Per run: steps, median/mean step time, tokens/s, rank spread, slow-step share, the
        productive share of wall-clock, replayed steps, first start and last end."""
        return self.r.table(
            f"WITH per AS ({_PER_STEP}), med AS (SELECT run_id, median(s_dur) AS m_dur FROM per"
            " GROUP BY run_id) SELECT per.run_id AS run_id, count() AS n_steps,"
            " max(per.step) AS last_step, any(med.m_dur) AS median_step_s,"
            " avg(per.s_dur) AS mean_step_s, sum(per.s_tok) / sum(per.s_dur) AS tokens_per_s,"
            " avgIf(per.s_spread, isFinite(per.s_spread)) AS spread, max(per.s_ranks) AS ranks,"
            " countIf(per.s_dur > 2 * med.m_dur) / count() AS slow_share,"
            " sum(per.s_dur) / (max(per.s_end) - min(per.s_start)) AS productive_share,"
            " sum(per.s_exec) - count() AS replayed_steps,"
            " min(per.s_start) AS t_first, max(per.s_end) AS t_last"
            " FROM per INNER JOIN med ON per.run_id = med.run_id GROUP BY per.run_id",
            runs=runs,
        )

    def matched_scalar_buckets(self, runs: list[str], names: list[str], buckets: int) -> pa.Table:
        """Per run, metric and bucket of the steps every run logged: the mean, the bucket's and
        the matched range's steps, and the matched steps per run."""
        # One pass with window functions: a CTE used three times would be computed three times.
        return self.r.table(
            "SELECT run_id, name AS metric, bucket, avg(v) AS x_mean, min(step) AS x_from,"
            " max(step) AS x_to, any(lo) AS x_lo, any(hi) AS x_hi, any(cnt) AS x_cnt FROM ("
            " SELECT run_id, name, step, v, lo, hi, cnt, intDiv((step - lo) * {buckets:UInt8},"
            " (hi - lo + 1)) AS bucket FROM ("
            "  SELECT run_id, name, step, v, min(step) OVER (PARTITION BY name) AS lo,"
            "  max(step) OVER (PARTITION BY name) AS hi,"
            "  intDiv(count() OVER (PARTITION BY name), {n:UInt32}) AS cnt FROM ("
            "   SELECT run_id, name, step, v, count() OVER (PARTITION BY name, step) AS nruns"
            "   FROM (SELECT run_id, name, step, avg(value) AS v FROM {db}.scalars"
            "    WHERE run_id IN {runs:Array(String)}"
            "    AND name IN {names:Array(String)} AND isFinite(value)"
            "    GROUP BY run_id, name, step)"
            "  ) WHERE nruns = {n:UInt32}))"
            " GROUP BY run_id, metric, bucket ORDER BY metric, bucket, run_id",
            runs=runs,
            names=names,
            n=len(runs),
            buckets=buckets,
        )

    def events_by_kind(self, runs: list[str], kinds: list[str]) -> pa.Table:
        """Per run and event kind of ``kinds``: the count and the nodes named."""
        return self.r.table(
            "SELECT run_id, kind, count() AS n, groupUniqArray(node_id) AS nodes FROM {db}.events"
            " WHERE run_id IN {runs:Array(String)}"
            " AND kind IN {kinds:Array(String)} GROUP BY run_id, kind",
            runs=runs,
            kinds=kinds,
        )

    def placement_counts(self, runs: list[str]) -> pa.Table:
        """Per run: the distinct nodes and (node, GPU) pairs it was placed on."""
        return self.r.table(
            "SELECT run_id, uniqExact(node_id) AS n_nodes, uniqExact(node_id, gpu) AS n_gpus"
            " FROM {db}.placement WHERE run_id IN {runs:Array(String)}"
            " GROUP BY run_id",
            runs=runs,
        )

    def step_times(self, run_id: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The run's steps in order and each one's last execution's duration."""
        t = self.r.table(
            f"SELECT step, s_dur FROM ({_PER_STEP}) ORDER BY step",
            runs=[run_id],
        )
        if t.num_rows == 0:
            return np.zeros(0, np.int64), np.zeros(0)
        return (
            t.column("step").to_numpy().astype(np.int64),
            t.column("s_dur").to_numpy(zero_copy_only=False).astype(np.float64),
        )

    def gpus_used(self, run_id: str) -> pa.Table:
        """Per (node, GPU) the run was placed on: its UUID, rack, job attempts and first rank."""
        return self.r.table(
            "SELECT node_id, gpu, any(gpu_uuid) AS uuid, any(rack) AS rk, groupUniqArray(job_id)"
            " AS jobs, min(rank) AS first_rank FROM {db}.placement"
            " WHERE run_id = {run:String} GROUP BY node_id, gpu ORDER BY node_id, gpu",
            run=run_id,
        )

    def events_of_run_or_nodes(
        self, run_id: str, kinds: list[str], nodes: list[str], t0: float, t1: float
    ) -> pa.Table:
        """Events of ``kinds`` of the run, or of any run on ``nodes`` within [t0, t1], by time."""
        return self.r.table(
            "SELECT time, kind, run_id AS of_run, job_id, step, node_id, gpu, message, attrs"
            " FROM {db}.events WHERE kind IN {kinds:Array(String)}"
            " AND (run_id = {run:String} OR (node_id IN {nodes:Array(String)}"
            " AND time BETWEEN {t0:Float64} AND {t1:Float64})) ORDER BY time",
            run=run_id,
            kinds=kinds,
            nodes=nodes,
            t0=t0,
            t1=t1,
        )

    def xid_samples(self, nodes: list[str], t0: float, t1: float) -> pa.Table:
        """GPU samples on ``nodes`` within [t0, t1] that carry an XID error, by time (at most
        100,000)."""
        return self.r.table(
            "SELECT node_id, gpu, time, xid FROM {db}.gpu_samples WHERE"
            " node_id IN {nodes:Array(String)} AND time BETWEEN "
            "{t0:Float64} AND {t1:Float64} AND xid > 0 ORDER BY time LIMIT 100000",
            nodes=nodes,
            t0=t0,
            t1=t1,
        )
