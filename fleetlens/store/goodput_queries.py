"""The reads goodput is computed from, bound to one tenant: a run's step executions and events,
a pool's allocations and capacity.

The rank -> step aggregation is the store's (the ``steps_by_step`` rollup, merged per step and
attempt in the engine); what comes back is one row per step execution, per event, per
allocation or per capacity snapshot.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from .reader import TenantReader

__all__ = ["GoodputInputQueries"]


class GoodputInputQueries:
    def __init__(self, reader: TenantReader) -> None:
        self.r = reader

    def step_executions(
        self, run_id: str, t0: float | None = None, t1: float | None = None
    ) -> pa.Table:
        """One row per (step, attempt) of the run, merged from the rollup (those overlapping
        [t0, t1] when both are given): its span, slowest and mean rank's compute, longest input
        wait, tokens and ranks."""
        where = ""
        params: dict[str, Any] = {"run": run_id}
        if t0 is not None and t1 is not None:
            where = " AND `end` >= {t0:Float64} AND `start` <= {t1:Float64}"
            params.update(t0=t0, t1=t1)
        # FINAL merges the rollup's partial rows per (step, attempt) in the engine -- what a
        # GROUP BY step, job_id would do, several times cheaper; the window applies after it.
        return self.r.table(
            "SELECT step, job_id, start AS x_start, `end` AS x_end, max_compute AS x_max,"
            " sum_compute / ranks AS x_mean, max_data_wait AS x_wait, tokens AS x_tokens,"
            " ranks AS x_ranks FROM {db}.steps_by_step FINAL"
            " WHERE run_id = {run:String}" + where,
            **params,
        )

    def runs_inputs(self, run_ids: list[str], t0: float, t1: float) -> tuple[pa.Table, pa.Table]:
        """:meth:`step_executions` over ``[t0, t1]`` and :meth:`events` of many runs in two
        reads, each row with its ``run_id``, ordered by run (the capacity page weighs thousands
        of runs: two statements, not two a run)."""
        executions = self.r.table(
            "SELECT run_id, step, job_id, start AS x_start, `end` AS x_end, max_compute AS x_max,"
            " sum_compute / ranks AS x_mean, max_data_wait AS x_wait, tokens AS x_tokens,"
            " ranks AS x_ranks FROM {db}.steps_by_step FINAL"
            " WHERE run_id IN {runs:Array(String)}"
            " AND `end` >= {t0:Float64} AND `start` <= {t1:Float64} ORDER BY run_id",
            runs=run_ids,
            t0=t0,
            t1=t1,
        )
        events = self.r.table(
            "SELECT run_id, time, kind, job_id, step, rank, attrs FROM {db}.events"
            " WHERE run_id IN {runs:Array(String)} ORDER BY run_id, time",
            runs=run_ids,
        )
        return executions, events

    def events(self, run_id: str) -> pa.Table:
        """The run's events (time, kind, job, step, rank, attributes) in time order."""
        return self.r.table(
            "SELECT time, kind, job_id, step, rank, attrs FROM {db}.events"
            " WHERE run_id = {run:String} ORDER BY time",
            run=run_id,
        )

    def allocations(self, pool: str, t0: float, t1: float) -> pa.Table:
        """The pool's allocations submitted by ``t1`` and not ended before ``t0``: GPUs, submit,
        start, gang-complete and end times."""
        return self.r.table(
            "SELECT gpus, submit, start, gang_complete, `end` FROM {db}.sched_allocations FINAL"
            " WHERE pool = {pool:String}"
            " AND submit <= {t1:Float64} AND (isNaN(`end`) OR `end` >= {t0:Float64})",
            pool=pool,
            t0=t0,
            t1=t1,
        )

    def capacity(self, pool: str) -> pa.Table:
        """The pool's capacity snapshots (time, capacity and in-service GPUs) in time order."""
        return self.r.table(
            "SELECT time, capacity_gpus, in_service_gpus FROM {db}.sched_pool"
            " WHERE pool = {pool:String} ORDER BY time",
            pool=pool,
        )

    def pool_jobs(self, pool: str) -> tuple[set[str], set[str]]:
        """The run ids and scheduler job ids of the pool's allocations (a run is the pool's when
        an allocation names it, or names one of its job attempts)."""
        t = self.r.table(
            "SELECT DISTINCT run_id, job_id FROM {db}.sched_allocations FINAL"
            " WHERE pool = {pool:String}",
            pool=pool,
        ).to_pydict()
        return {r for r in t.get("run_id", []) if r}, set(t.get("job_id", []))

    def pools(self) -> list[str]:
        """The pools with capacity snapshots, by name."""
        rows = self.r.rows("SELECT DISTINCT pool FROM {db}.sched_pool ORDER BY pool")
        return [r["pool"] for r in rows]

    def time_span(self, pool: str | None) -> tuple[float, float] | None:
        """The first and last time the pool's (or, for None, every pool's) allocations and
        capacity snapshots speak of; None without any."""
        where = " WHERE pool = {pool:String}" if pool else ""
        row = self.r.rows(
            "SELECT min(a) AS lo, max(b) AS hi, sum(c) AS n FROM ("
            "SELECT min(submit) AS a, max(greatest(submit, if(isNaN(`end`), start, `end`)))"
            " AS b, count() AS c FROM {db}.sched_allocations FINAL" + where + " UNION ALL "
            "SELECT min(time) AS a, max(time) AS b, count() AS c FROM {db}.sched_pool"
            + where
            + ") WHERE c > 0",
            pool=pool or "",
        )[0]
        if not row["n"]:
            return None
        return float(row["lo"]), float(row["hi"])
