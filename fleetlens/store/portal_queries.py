"""Reads the web portal draws, bound to one tenant by the reader: the run page's step executions,
scalars and heatmap cells, the fleet page's events, and the rank page's phases, placements and
GPU samples. Each statement buckets in the engine (a chart is a few hundred pixels wide), so what
comes back is small; the services shape it for the pages. Aliases are prefixed (``b_``, ``h_``...):
ClickHouse resolves a bare column name inside an aggregate to a same-named alias.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from .ddl import COMPUTE_SQL
from .reader import TenantReader

__all__ = ["PortalStoreQueries", "RankStoreQueries", "RecentCompute"]


@dataclass(frozen=True)
class RecentCompute:
    """The last steps' mean slowest-rank and mean-rank compute (seconds), over ``steps`` steps."""

    steps: int
    max_compute: float | None
    mean_compute: float | None


class PortalStoreQueries:
    """The run page's and the fleet page's reads."""

    def __init__(self, reader: TenantReader) -> None:
        self.r = reader

    def step_bounds(self, run_id: str) -> tuple[int, int] | None:
        """The run's first and last step in the rollup (None: no step)."""
        row = self.r.table(
            "SELECT min(step) AS r_lo, max(step) AS r_hi, count() AS r_n FROM {db}.steps_by_step"
            " WHERE run_id = {run:String}",
            run=run_id,
        ).to_pylist()[0]
        if not row["r_n"]:
            return None
        return int(row["r_lo"]), int(row["r_hi"])

    def ranks_at(self, run_id: str, step: int) -> int:
        """The ranks of ``step``'s latest attempt, its partial rollup rows added up (0: none)."""
        rows = self.r.table(
            "SELECT sum(ranks) AS w_ranks, max(`end`) AS w_end FROM {db}.steps_by_step"
            " WHERE run_id = {run:String} AND step = {hi:Int64}"
            " GROUP BY job_id ORDER BY w_end DESC LIMIT 1",
            run=run_id,
            hi=step,
        ).to_pylist()
        return int(rows[0]["w_ranks"]) if rows else 0

    def executions(self, run_id: str, lo: int | None = None, hi: int | None = None) -> pa.Table:
        """Every step execution of the run, or of its steps in [lo, hi], merged by ``FINAL``:
        step, job_id, e_start, e_end, e_dur, e_dmean, e_cmax, e_cmean, e_ranks, e_tokens,
        e_wait."""
        window, bounds = "", {}
        if lo is not None and hi is not None:
            window, bounds = " AND step BETWEEN {lo:Int64} AND {hi:Int64}", {"lo": lo, "hi": hi}
        return self.r.table(
            "SELECT step, job_id, start AS e_start, `end` AS e_end, max_duration AS e_dur,"
            " sum_duration / ranks AS e_dmean, max_compute AS e_cmax,"
            " sum_compute / ranks AS e_cmean, ranks AS e_ranks, tokens AS e_tokens,"
            " max_data_wait AS e_wait FROM {db}.steps_by_step FINAL"
            " WHERE run_id = {run:String}" + window,
            run=run_id,
            **bounds,
        )

    def latest_scalars(self, run_id: str, limit: int) -> pa.Table:
        """Each scalar's latest value (highest step, then time): name, value."""
        return self.r.table(
            "SELECT name, value FROM {db}.scalars WHERE run_id = {run:String}"
            " ORDER BY name, step DESC, time DESC LIMIT 1 BY name LIMIT {limit:UInt32}",
            run=run_id,
            limit=limit,
        )

    def scalar_buckets(
        self, run_id: str, names: list[str], lo: int, hi: int, width: int
    ) -> pa.Table:
        """Per scalar and bucket of ``width`` steps in [lo, hi], of the lowest rank's value at
        each step: name, b, v_step, v_first, v_min, v_max, v_mean, v_bad (not finite)."""
        return self.r.table(
            "SELECT name, intDiv(step - {lo:Int64}, {w:Int64}) AS b, min(step) AS v_step,"
            " argMin(v, step) AS v_first, min(v) AS v_min, max(v) AS v_max, avg(v) AS v_mean,"
            " countIf(NOT isFinite(v)) AS v_bad FROM ("
            "  SELECT name, step, value AS v FROM {db}.scalars"
            "  WHERE run_id = {run:String}"
            "  AND name IN {names:Array(String)} AND step BETWEEN {lo:Int64} AND {hi:Int64}"
            "  ORDER BY name, step, rank LIMIT 1 BY name, step)"
            " GROUP BY name, b ORDER BY name, b",
            run=run_id,
            names=names,
            lo=lo,
            hi=hi,
            w=width,
        )

    def compute_cells(self, run_id: str, lo: int, hi: int, rw: int, sw: int) -> pa.Table:
        """Per cell of ``rw`` ranks x ``sw`` steps in [lo, hi]: h_rb, h_sb, the maximum compute
        (h_max, seconds) and the rank that had it (h_rank)."""
        return self.r.table(
            f"SELECT intDiv(rank, {{rw:Int64}}) AS h_rb, intDiv(step - {{lo:Int64}}, {{sw:Int64}})"
            f" AS h_sb, max({COMPUTE_SQL}) AS h_max, argMax(rank, {COMPUTE_SQL}) AS h_rank"
            " FROM {db}.steps"
            " WHERE run_id = {run:String}"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64} GROUP BY h_rb, h_sb",
            run=run_id,
            lo=lo,
            hi=hi,
            rw=rw,
            sw=sw,
        )

    def slowest_rank(self, run_id: str, lo: int, hi: int, r0: int, r1: int) -> int | None:
        """The rank in [r0, r1] with the highest median compute over steps [lo, hi]."""
        rows = self.r.table(
            f"SELECT rank, quantile(0.5)({COMPUTE_SQL}) AS k_c FROM {{db}}.steps"
            " WHERE run_id = {run:String}"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64} AND rank BETWEEN {r0:Int64} AND {r1:Int64}"
            " GROUP BY rank ORDER BY k_c DESC, rank LIMIT 1",
            run=run_id,
            lo=lo,
            hi=hi,
            r0=r0,
            r1=r1,
        ).to_pylist()
        return int(rows[0]["rank"]) if rows else None

    def recent_compute(self, run_id: str, window: int) -> RecentCompute:
        """The slowest and the mean rank's compute averaged over the last ``window`` steps."""
        row = self.r.table(
            "SELECT avg(s_cmax) AS x_max, avg(s_cmean) AS x_mean, count() AS x_n FROM ("
            " SELECT step, max(max_compute) AS s_cmax, sum(sum_compute) / sum(ranks) AS s_cmean"
            " FROM {db}.steps_by_step WHERE run_id = {run:String}"
            " AND step > (SELECT max(step) FROM {db}.steps_by_step WHERE"
            " run_id = {run:String}) - {window:Int64} GROUP BY step)",
            run=run_id,
            window=window,
        ).to_pylist()[0]
        return RecentCompute(
            int(row["x_n"]),
            None if row["x_max"] is None else float(row["x_max"]),
            None if row["x_mean"] is None else float(row["x_mean"]),
        )

    def events(
        self, kinds: tuple[str, ...], since: float, run_id: str | None, limit: int
    ) -> pa.Table:
        """Events of the given kinds after ``since`` (all runs, or one), newest first: time,
        run_id, job_id, step, rank, kind, node_id, gpu, message."""
        return self.r.table(
            "SELECT time, run_id, job_id, step, rank, kind, node_id, gpu, message FROM {db}.events"
            " WHERE kind IN {kinds:Array(String)}"
            " AND time >= {since:Float64}"
            + (" AND run_id = {run:String}" if run_id else "")
            + " ORDER BY time DESC LIMIT {limit:UInt32}",
            kinds=list(kinds),
            since=since,
            run=run_id or "",
            limit=limit,
        )

    def node_events(self, kinds: tuple[str, ...], since: float, limit: int) -> pa.Table:
        """Node events of the given kinds after ``since``, newest first, every tenant's for a
        cross-tenant scope: time, n_tenant, run_id, kind, node_id, gpu, message."""
        return self.r.infra_table(
            "SELECT time, tenant AS n_tenant, run_id, kind, node_id, gpu, message FROM {db}.events"
            " WHERE kind IN {kinds:Array(String)} AND time >= {since:Float64} AND node_id != ''"
            " ORDER BY time DESC LIMIT {limit:UInt32}",
            kinds=list(kinds),
            since=since,
            limit=limit,
        )

    def nodes_of(self, runs: list[str]) -> pa.Table:
        """Per node, the given runs placed on it: p_node, p_runs."""
        return self.r.table(
            "SELECT node_id AS p_node, groupUniqArray(run_id) AS p_runs FROM {db}.placement"
            " WHERE run_id IN {runs:Array(String)}"
            " AND node_id != '' GROUP BY node_id",
            runs=runs,
        )


class RankStoreQueries:
    """The rank page's reads: one rank's phases and placements, its GPU's samples."""

    def __init__(self, reader: TenantReader) -> None:
        self.r = reader

    def placements(self, run_id: str, rank: int) -> pa.Table:
        """Where ``rank`` ran per job attempt, oldest first: p_job, p_node, p_gpu, p_time."""
        return self.r.table(
            "SELECT job_id AS p_job, argMax(node_id, time) AS p_node, argMax(gpu, time) AS p_gpu,"
            " min(time) AS p_time FROM {db}.placement"
            " WHERE run_id = {run:String} AND rank = {rank:Int32} GROUP BY job_id ORDER BY p_time",
            run=run_id,
            rank=rank,
        )

    def phase_buckets(self, run_id: str, rank: int, lo: int, hi: int, width: int) -> pa.Table:
        """Per bucket of ``width`` steps in [lo, hi], the rank's means (seconds): b, k_step,
        k_t, k_dur, k_fw, k_bw, k_opt, k_comm, k_wait, k_compute."""
        return self.r.table(
            "SELECT intDiv(step - {lo:Int64}, {w:Int64}) AS b, min(step) AS k_step,"
            " min(time) AS k_t, avg(duration) AS k_dur, avgIf(forward, isFinite(forward)) AS k_fw,"
            " avgIf(backward, isFinite(backward)) AS k_bw,"
            " avgIf(optimizer, isFinite(optimizer)) AS k_opt,"
            " avgIf(comm, isFinite(comm)) AS k_comm,"
            " avgIf(data_wait, isFinite(data_wait)) AS k_wait,"
            f" avg({COMPUTE_SQL}) AS k_compute FROM {{db}}.steps"
            " WHERE run_id = {run:String} AND rank = {rank:Int32}"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64} GROUP BY b ORDER BY b",
            run=run_id,
            rank=rank,
            lo=lo,
            hi=hi,
            w=width,
        )

    def mean_compute_buckets(self, run_id: str, lo: int, hi: int, width: int) -> pa.Table:
        """Per bucket of ``width`` steps in [lo, hi], the mean rank's compute: b, m_c."""
        return self.r.table(
            "SELECT intDiv(step - {lo:Int64}, {w:Int64}) AS b,"
            " sum(sum_compute) / sum(ranks) AS m_c FROM {db}.steps_by_step"
            " WHERE run_id = {run:String}"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64} GROUP BY b",
            run=run_id,
            lo=lo,
            hi=hi,
            w=width,
        )

    def gpu_sample_buckets(self, node: str, gpu: int, t0: float, t1: float, width: int) -> pa.Table:
        """Per bucket of ``width`` seconds in [t0, t1], the GPU's DCGM samples: b, g_t, g_clock,
        g_clock_max, g_temp, g_power, g_fb, g_xid."""
        return self.r.table(
            "SELECT intDiv(toInt64(time - {t0:Float64}), {w:Int64}) AS b, min(time) AS g_t,"
            " avgIf(sm_clock, isFinite(sm_clock)) AS g_clock,"
            " maxIf(sm_clock_max, isFinite(sm_clock_max)) AS g_clock_max,"
            " avgIf(gpu_temp, isFinite(gpu_temp)) AS g_temp,"
            " avgIf(power_usage, isFinite(power_usage)) AS g_power,"
            " avgIf(fb_used, isFinite(fb_used)) AS g_fb, maxIf(xid, isFinite(xid)) AS g_xid"
            " FROM {db}.gpu_samples WHERE node_id = {node:String}"
            " AND gpu = {gpu:Int32} AND time BETWEEN {t0:Float64} AND {t1:Float64}"
            " GROUP BY b ORDER BY b",
            node=node,
            gpu=gpu,
            t0=t0,
            t1=t1,
            w=width,
        )

    def time_span(self, run_id: str, lo: int, hi: int) -> tuple[float, float] | None:
        """The first start and last end of steps [lo, hi] (None: no step)."""
        row = self.r.table(
            "SELECT min(start) AS s_t0, max(`end`) AS s_t1, count() AS s_n FROM {db}.steps_by_step"
            " WHERE run_id = {run:String}"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64}",
            run=run_id,
            lo=lo,
            hi=hi,
        ).to_pylist()[0]
        if not row["s_n"]:
            return None
        return float(row["s_t0"]), float(row["s_t1"])

    def latest_placements(self, run_id: str, ranks: list[int]) -> pa.Table:
        """Each of ``ranks``'s latest placement: rank, x_node, x_gpu."""
        return self.r.table(
            "SELECT rank, argMax(node_id, time) AS x_node, argMax(gpu, time) AS x_gpu"
            " FROM {db}.placement WHERE run_id = {run:String}"
            " AND rank IN {ranks:Array(Int32)} GROUP BY rank",
            run=run_id,
            ranks=ranks,
        )
