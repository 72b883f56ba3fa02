"""What the telemetry holds of one run, bound to one tenant: its steps (totals, the recent ones,
the span of a window, per-rank figures), the latest value of its scalars, its events, the shares
of step time the monitor samples, and the steps remediation asks about. The services
(:mod:`fleetlens.services.runs`, ``run_signals``, ``monitor``) and remediation's repository turn
these into summaries, alert inputs and decisions. :func:`job_extents` is the one read here across
every tenant: the run registry's recovery at startup.

Aliases carry a prefix where a column of the same name is aggregated: ClickHouse resolves a bare
column name inside an aggregate to a same-named alias.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ..scalars import DATA_SCALARS
from .ddl import COMPUTE_SQL
from .reader import TenantReader
from .telemetry import TelemetryStore

__all__ = ["RANK_SORT_KEYS", "RunTelemetryQueries", "StepTotals", "job_extents"]

RANK_SORT_KEYS = {
    "compute": "r_compute",
    "step_time": "r_step_time",
    "max_step_time": "r_max_step_time",
    "data_wait": "r_data_wait",
    "comm": "r_comm",
    "rank": "rank",
}
"""The sort keys of :meth:`RunTelemetryQueries.rank_figures`, by the figure's column."""

PER_STEP = (
    "SELECT step, argMax(s_tokens, s_start) AS tokens, max(s_start) AS start,"
    " argMax(s_end, s_start) AS end, argMax(s_max, s_start) AS max_duration,"
    " argMax(s_ranks, s_start) AS ranks, argMax(s_sum, s_start) AS sum_duration,"
    " argMax(job_id, s_start) AS job_id FROM ("
    " SELECT step, job_id, sum(ranks) AS s_ranks, sum(tokens) AS s_tokens,"
    " min(start) AS s_start, max(end) AS s_end, max(max_duration) AS s_max,"
    " sum(sum_duration) AS s_sum FROM {db}.steps_by_step WHERE run_id = {run:String}"
    " GROUP BY step, job_id) GROUP BY step"
)
"""Per step of a run, the latest attempt's figures (a restart replays steps; the replay counts)."""


@dataclass(frozen=True)
class StepTotals:
    """A run's steps (each counted once), its last step and the tokens of all of them."""

    steps: int
    last_step: int
    tokens: int


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


class RunTelemetryQueries:
    def __init__(self, reader: TenantReader) -> None:
        self.r = reader

    def _one(self, sql: str, **params: Any) -> dict[str, Any]:
        return self.r.rows(sql, **params)[0]

    # -- progress ------------------------------------------------------------------------------

    def step_totals(self, run_id: str) -> StepTotals:
        """The run's step count, last step and tokens, a replayed step counted once."""
        row = self._one(
            "SELECT count() AS steps, max(step) AS last_step, sum(tokens) AS total_tokens"
            f" FROM ({PER_STEP})",
            run=run_id,
        )
        if not row["steps"]:
            return StepTotals(0, 0, 0)
        return StepTotals(int(row["steps"]), int(row["last_step"]), int(row["total_tokens"]))

    def recent_steps(self, run_id: str, last: int, window: int) -> pa.Table:
        """The steps after ``last - window``, one row each (its latest attempt), in step order:
        step, start, end, max_duration, mean_duration, tokens, ranks."""
        return self.r.table(
            "SELECT step, start, end, max_duration, sum_duration / ranks AS mean_duration,"
            f" tokens, ranks FROM ({PER_STEP}) WHERE step > {{last:Int64}} - {{window:Int64}}"
            " ORDER BY step",
            run=run_id,
            last=last,
            window=window,
        )

    def latest_scalars(self, run_id: str, limit: int = 200) -> pa.Table:
        """Each scalar's latest value (by step, then time), by name: name, latest."""
        return self.r.table(
            "SELECT name, argMax(value, (step, time)) AS latest, max(step) AS latest_step"
            " FROM {db}.scalars WHERE run_id = {run:String}"
            " GROUP BY name ORDER BY name LIMIT {limit:UInt32}",
            run=run_id,
            limit=limit,
        )

    def last_step(self, run_id: str) -> int | None:
        """The run's last step; None when it has none."""
        row = self._one(
            "SELECT max(step) AS s, count() AS n FROM {db}.steps_by_step"
            " WHERE run_id = {run:String}",
            run=run_id,
        )
        return int(row["s"]) if row["n"] else None

    def step_range(self, run_id: str) -> tuple[int | None, int | None]:
        """The run's first and last step."""
        row = self._one(
            "SELECT min(step) AS s0, max(step) AS s1 FROM {db}.steps_by_step"
            " WHERE run_id = {run:String}",
            run=run_id,
        )
        return _int(row["s0"]), _int(row["s1"])

    def step_span(self, run_id: str, lo: int, hi: int) -> tuple[float | None, float | None]:
        """When steps ``lo..hi`` ran: the first one's start, the last one's end."""
        row = self._one(
            "SELECT min(start) AS t0, max(end) AS t1 FROM {db}.steps_by_step"
            " WHERE run_id = {run:String} AND step BETWEEN {lo:Int64} AND {hi:Int64}",
            run=run_id,
            lo=lo,
            hi=hi,
        )
        return _float(row["t0"]), _float(row["t1"])

    def last_step_end(self, run_id: str) -> float | None:
        """When the run's newest step ended."""
        return _float(
            self._one(
                "SELECT max(`end`) AS t FROM {db}.steps_by_step WHERE run_id = {run:String}",
                run=run_id,
            )["t"]
        )

    def step_durations(self, run_id: str, n: int) -> npt.NDArray[np.float64]:
        """The wall time of the run's last ``n`` steps (per step and job attempt), oldest
        first."""
        tab = self.r.table(
            "SELECT max(`end`) - min(start) AS s FROM {db}.steps_by_step"
            " WHERE run_id = {run:String} GROUP BY step, job_id"
            " ORDER BY step DESC LIMIT {n:UInt32}",
            run=run_id,
            n=n,
        )
        durations = [float(s) for s in reversed(tab.column("s").to_pylist()) if s is not None]
        return np.asarray(durations, dtype=np.float64)

    def attempt_last_step(self, run_id: str, job_id: str) -> int | None:
        """The last step job attempt ``job_id`` ran."""
        return _int(
            self._one(
                "SELECT max(step) AS s FROM {db}.steps_by_step"
                " WHERE run_id = {run:String} AND job_id = {job:String}",
                run=run_id,
                job=job_id,
            )["s"]
        )

    def others_last_step(self, run_id: str, job_id: str) -> int | None:
        """The last step any job attempt but ``job_id`` ran."""
        return _int(
            self._one(
                "SELECT max(step) AS s FROM {db}.steps_by_step"
                " WHERE run_id = {run:String} AND job_id != {job:String}",
                run=run_id,
                job=job_id,
            )["s"]
        )

    # -- ranks ---------------------------------------------------------------------------------

    def window_job(self, run_id: str, lo: int, hi: int) -> str:
        """The latest job attempt that ran steps ``lo..hi`` ("": none)."""
        job = self._one(
            "SELECT argMax(job_id, start) AS j FROM {db}.steps_by_step"
            " WHERE run_id = {run:String} AND step BETWEEN {lo:Int64} AND {hi:Int64}",
            run=run_id,
            lo=lo,
            hi=hi,
        )["j"]
        return str(job or "")

    def rank_figures(
        self,
        run_id: str,
        lo: int,
        hi: int,
        job_id: str,
        sort: str,
        descending: bool,
        limit: int,
    ) -> pa.Table:
        """Per rank over steps ``lo..hi``, the first ``limit`` by ``sort``
        (:data:`RANK_SORT_KEYS`): steps (r_steps), mean and max step time (r_step_time,
        r_max_step_time), mean data wait and communication (r_data_wait, r_comm), median
        compute (r_compute), the medians over all ranks (median_all, median_compute), and where
        job attempt ``job_id`` placed it (p_node, p_gpu, p_uuid, p_rack)."""
        order = f"{RANK_SORT_KEYS[sort]} {'DESC' if descending else 'ASC'}, rank ASC"
        # Step time is the window's mean (in a synchronous job every rank's is the job's);
        # compute, where ranks differ, is the median.
        return self.r.table(
            "WITH per_rank AS ("
            " SELECT rank, count() AS r_steps, avg(duration) AS r_step_time,"
            " max(duration) AS r_max_step_time,"
            " avgIf(data_wait, isFinite(data_wait)) AS r_data_wait,"
            " avgIf(comm, isFinite(comm)) AS r_comm,"
            f" quantile(0.5)({COMPUTE_SQL}) AS r_compute"
            " FROM {db}.steps WHERE run_id = {run:String}"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64} GROUP BY rank),"
            " place AS ("
            " SELECT rank AS p_rank, argMax(node_id, time) AS p_node,"
            " argMax(gpu, time) AS p_gpu, argMax(gpu_uuid, time) AS p_uuid,"
            " argMax(rack, time) AS p_rack"
            " FROM {db}.placement WHERE run_id = {run:String}"
            " AND job_id = {job:String} GROUP BY rank)"
            # Window functions, not subqueries: a CTE is inlined, and would run once per use.
            " SELECT * FROM (SELECT per_rank.*, median(r_step_time) OVER () AS median_all,"
            " median(r_compute) OVER () AS median_compute FROM per_rank"
            f" ORDER BY {order} LIMIT {{limit:UInt32}}) AS top"
            " LEFT JOIN place ON p_rank = rank"
            f" ORDER BY {order}",
            run=run_id,
            lo=lo,
            hi=hi,
            limit=limit,
            job=job_id,
        )

    # -- events and scalars --------------------------------------------------------------------

    def window_events(self, run_id: str, lo: int, hi: int, t0: float, t1: float) -> pa.Table:
        """The run's events of steps ``lo..hi``, and those of no step within [t0, t1], in time
        order (at most 10,000): time, step, rank, kind, node_id, gpu, message, attrs."""
        return self.r.table(
            "SELECT time, step, rank, kind, node_id, gpu, message, attrs FROM {db}.events"
            " WHERE run_id = {run:String} AND ("
            " (step BETWEEN {lo:Int64} AND {hi:Int64})"
            " OR (step < 0 AND time BETWEEN {t0:Float64} AND {t1:Float64}))"
            " ORDER BY time, step LIMIT 10000",
            run=run_id,
            lo=lo,
            hi=hi,
            t0=t0,
            t1=t1,
        )

    def events_of_kinds(self, run_id: str, kinds: tuple[str, ...]) -> pa.Table:
        """The run's events of ``kinds``: time, node_id, kind."""
        return self.r.table(
            "SELECT time, node_id, kind FROM {db}.events"
            " WHERE run_id = {run:String} AND kind IN {kinds:Array(String)}",
            run=run_id,
            kinds=list(kinds),
        )

    def scalar_steps(self, run_id: str, lo: int, hi: int) -> pa.Table:
        """Every scalar per step of ``lo..hi`` (the lowest rank's value, the first time), by
        name then step: name, step, v, t."""
        return self.r.table(
            "SELECT name, step, argMin(value, rank) AS v, min(time) AS t FROM {db}.scalars"
            " WHERE run_id = {run:String} AND step BETWEEN {lo:Int64} AND {hi:Int64}"
            " GROUP BY name, step ORDER BY name, step",
            run=run_id,
            lo=lo,
            hi=hi,
        )

    # -- the monitor's samples -----------------------------------------------------------------

    def recent_shares(self, run_id: str, lo: int) -> tuple[float | None, float | None]:
        """The share of the ranks' step time from step ``lo`` on spent in collectives and in
        data waits; None where no rank-step measured it."""
        row = self._one(
            "SELECT sum(if(isFinite(comm), comm, 0)) / sum(duration) AS c,"
            " sum(if(isFinite(data_wait), data_wait, 0)) / sum(duration) AS d,"
            " countIf(isFinite(comm)) AS nc, countIf(isFinite(data_wait)) AS nd"
            " FROM {db}.steps WHERE run_id = {run:String}"
            " AND step >= {lo:Int64} AND duration > 0",
            run=run_id,
            lo=lo,
        )
        return (_float(row["c"]) if row["nc"] else None, _float(row["d"]) if row["nd"] else None)

    def recent_data(self, run_id: str, lo: int) -> tuple[float | None, float | None]:
        """From step ``lo`` on, the share of rank-steps whose prefetch queue was empty and the
        p99 storage read latency (``Run.data``'s scalars); None where the run sent none."""
        depth, latency = DATA_SCALARS["queue_depth"], DATA_SCALARS["read_latency_s"]
        row = self._one(
            "SELECT avgIf(value < 1, name = {depth:String}) AS empty,"
            " countIf(name = {depth:String}) AS nq,"
            " quantileExactIf(0.99)(value, name = {lat:String}) AS p99,"
            " countIf(name = {lat:String}) AS nl"
            " FROM {db}.scalars WHERE run_id = {run:String}"
            " AND name IN ({depth:String}, {lat:String}) AND step >= {lo:Int64}",
            run=run_id,
            lo=lo,
            depth=depth,
            lat=latency,
        )
        return (
            _float(row["empty"]) if row["nq"] else None,
            _float(row["p99"]) if row["nl"] else None,
        )

    def hottest_gpu(self, run_id: str, since: float) -> float | None:
        """The highest GPU temperature since ``since`` on the nodes the run's latest job attempt
        is placed on; None where none was measured."""
        row = self._one(
            "SELECT maxIf(gpu_temp, isFinite(gpu_temp)) AS t, countIf(isFinite(gpu_temp)) AS n"
            " FROM {db}.gpu_samples WHERE time >= {since:Float64}"
            " AND node_id IN (SELECT node_id FROM {db}.placement"
            "  WHERE run_id = {run:String} AND job_id = (SELECT argMax(job_id, time)"
            "  FROM {db}.placement WHERE run_id = {run:String}))",
            run=run_id,
            since=since,
        )
        return _float(row["t"]) if row["n"] else None

    # -- time to result ----------------------------------------------------------------------

    def reached_step(self, run_ids: list[str], step: int) -> dict[str, float]:
        """When each run first finished step ``step`` or a later one (UNIX seconds: the
        earliest end among those steps' ranks), for the runs that did."""
        rows = self.r.rows(
            "SELECT run_id, min(end) AS at FROM {db}.steps_by_step"
            " WHERE run_id IN {runs:Array(String)} AND step >= {step:Int64} GROUP BY run_id",
            runs=run_ids,
            step=step,
        )
        return {str(r["run_id"]): float(r["at"]) for r in rows}

    def reached_loss(self, run_ids: list[str], loss: float) -> dict[str, tuple[int, float]]:
        """The first step at which each run logged a ``loss`` at or under ``loss``, and when:
        (step, UNIX seconds), for the runs that did."""
        rows = self.r.rows(
            "SELECT run_id, argMin(step, time) AS s, min(time) AS at FROM {db}.scalars"
            " WHERE run_id IN {runs:Array(String)} AND name = 'loss' AND value <= {loss:Float64}"
            " GROUP BY run_id",
            runs=run_ids,
            loss=loss,
        )
        return {str(r["run_id"]): (int(r["s"]), float(r["at"])) for r in rows}


def job_extents(telemetry: TelemetryStore) -> pa.Table:
    """Every tenant's job attempts, read across tenants on purpose (the run registry rebuilt at
    startup): r_tenant, r_run, r_job, last step (r_step), first start (r_first), last end
    (r_last)."""
    return telemetry.query(
        "SELECT tenant AS r_tenant, run_id AS r_run, job_id AS r_job, max(step) AS r_step,"
        " min(start) AS r_first, max(end) AS r_last"
        f" FROM {telemetry.database}.steps_by_step GROUP BY tenant, run_id, job_id"
    )
