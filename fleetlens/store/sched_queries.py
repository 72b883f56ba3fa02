"""Scheduler records as stored (``sched_allocations``, ``sched_pool``) and the job ids a run's
ranks reported, bound to one tenant by the reader."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from .reader import TenantReader

__all__ = ["SchedQueries"]


def _where(
    run_id: str | None, jobs: Iterable[str], job_id: str | None, pool: str | None
) -> tuple[str, dict[str, Any]]:
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if run_id is not None:
        clauses.append(
            "(run_id = {run:String} OR job_id IN {ids:Array(String)}"
            " OR splitByChar('/', job_id)[-1] IN {ids:Array(String)})"
        )
        params.update(run=run_id, ids=sorted({run_id, *jobs}))
    if job_id is not None:
        clauses.append("job_id = {job:String}")
        params["job"] = job_id
    if pool is not None:
        clauses.append("pool = {pool:String}")
        params["pool"] = pool
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


class SchedQueries:
    def __init__(self, reader: TenantReader) -> None:
        self.r = reader

    def job_starts(self, run_id: str) -> pa.Table:
        """The run's distinct ``job_start`` events (``job_id``, ``attrs``), at most 1000."""
        return self.r.table(
            "SELECT DISTINCT job_id, attrs FROM {db}.events"
            " WHERE run_id = {run:String} AND kind = 'job_start' LIMIT 1000",
            run=run_id,
        )

    def allocations(
        self,
        limit: int,
        *,
        run_id: str | None = None,
        jobs: Iterable[str] = (),
        job_id: str | None = None,
        pool: str | None = None,
    ) -> pa.Table:
        """Allocations, oldest submit first; ``run_id`` matches those imported with it and those
        whose job id (or its last ``/`` part) is the run id or one of ``jobs``."""
        where, params = _where(run_id, jobs, job_id, pool)
        return self.r.table(
            "SELECT pool, job_id, run_id, gpus, submit, start, gang_complete, `end`, state"
            " FROM {db}.sched_allocations FINAL"
            + where
            + " ORDER BY submit, job_id LIMIT {limit:UInt32}",
            limit=limit,
            **params,
        )

    def pool_waits(self, pool: str, before: float, gpus: int, limit: int) -> pa.Table:
        """The newest ``limit`` allocations of ``pool`` submitted before ``before`` with half
        to twice ``gpus`` GPUs that completed their gang: ``job_id`` and ``wait``, submission
        to gang completion (an allocation without one completed at its start), oldest first."""
        return self.r.table(
            "SELECT job_id, submit, wait FROM (SELECT job_id, submit,"
            " if(isNaN(gang_complete), start, gang_complete) - submit AS wait"
            " FROM {db}.sched_allocations FINAL WHERE pool = {pool:String}"
            " AND submit < {before:Float64} AND gpus BETWEEN {lo:Float64} AND {hi:Float64})"
            " WHERE isFinite(wait) AND wait >= 0"
            " ORDER BY submit DESC, job_id LIMIT {limit:UInt32}",
            pool=pool,
            before=before,
            lo=gpus / 2,
            hi=gpus * 2,
            limit=limit,
        ).sort_by([("submit", "ascending"), ("job_id", "ascending")])

    def capacity(self, pool: str | None = None) -> pa.Table:
        """Each pool's capacity records (or one pool's), by pool then time, at most 100000."""
        where, params = _where(None, (), None, pool)
        return self.r.table(
            "SELECT pool, time, capacity_gpus, in_service_gpus FROM {db}.sched_pool"
            + where
            + " ORDER BY pool, time LIMIT 100000",
            **params,
        )

    def capacity_records(self, pool: str) -> int:
        """How many capacity records the pool has."""
        rows = self.r.rows(
            "SELECT count() AS n FROM {db}.sched_pool WHERE pool = {pool:String}", pool=pool
        )
        return int(rows[0]["n"])
