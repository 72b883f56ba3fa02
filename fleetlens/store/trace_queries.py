"""Profiler-trace findings of a run (``trace_steps``, ``trace_kernels``) and its collectives,
bound to one tenant by the reader.

A trace imported again (another batch) stores its rows twice: each read takes one row per
(step, rank) before it sums.
"""

from __future__ import annotations

import pyarrow as pa

from .reader import TenantReader

__all__ = ["TRACE_LINES", "TraceStepQueries"]

TRACE_LINES = ("compute", "comm", "exposed_comm", "overlap", "memcpy", "idle")
"""Per-step lines of a ``trace_step`` record, seconds; all but ``comm``/``overlap`` sum to it."""

_WINDOW = "run_id = {run:String} AND step BETWEEN {lo:Int64} AND {hi:Int64}"


class TraceStepQueries:
    def __init__(self, reader: TenantReader) -> None:
        self.r = reader

    def step_span(self, run_id: str) -> tuple[int, int] | None:
        """The first and last traced step of the run; None when none is traced."""
        row = self.r.rows(
            "SELECT min(step) AS lo, max(step) AS hi, count() AS n FROM {db}.trace_steps "
            "WHERE run_id = {run:String}",
            run=run_id,
        )[0]
        return (int(row["lo"]), int(row["hi"])) if row["n"] else None

    def steps(self, run_id: str, lo: int, hi: int, limit: int, rank: int | None) -> pa.Table:
        """One row per (step, rank) of steps ``lo..hi``, of one rank when given, in order."""
        lines = ", ".join(f"any({c}) AS {c}" for c in TRACE_LINES)
        one = "" if rank is None else " AND rank = {rank:Int32}"
        return self.r.table(
            f"SELECT step, rank, any(time) AS time, any(duration) AS duration, {lines}, "
            "any(kernels) AS kernels, any(source) AS source FROM {db}.trace_steps "
            f"WHERE {_WINDOW}{one} GROUP BY step, rank ORDER BY step, rank "
            "LIMIT {limit:UInt64}",
            run=run_id,
            lo=lo,
            hi=hi,
            limit=limit,
            **({} if rank is None else {"rank": rank}),
        )

    def rank_sums(self, run_id: str, lo: int, hi: int) -> pa.Table:
        """Per rank over steps ``lo..hi``: steps ``n``, ``s_duration``, ``s_<line>`` of each
        trace line and ``s_kernels``, in rank order."""
        sums = ", ".join(f"sum({c}) AS s_{c}" for c in TRACE_LINES)
        lines = ", ".join(f"any({c}) AS {c}" for c in TRACE_LINES)
        return self.r.table(
            f"SELECT rank, count() AS n, sum(duration) AS s_duration, {sums}, "
            "sum(kernels) AS s_kernels FROM ("
            f" SELECT step, rank, any(duration) AS duration, {lines}, any(kernels) AS kernels"
            f" FROM {{db}}.trace_steps WHERE {_WINDOW} GROUP BY step, rank)"
            " GROUP BY rank ORDER BY rank",
            run=run_id,
            lo=lo,
            hi=hi,
        )

    def rank_collectives(self, run_id: str, lo: int, hi: int) -> dict[int, int]:
        """Rank -> the collectives it recorded over steps ``lo..hi``."""
        rows = self.r.rows(
            f"SELECT rank, count() AS n FROM {{db}}.collectives WHERE {_WINDOW} GROUP BY rank",
            run=run_id,
            lo=lo,
            hi=hi,
        )
        return {int(r["rank"]): int(r["n"]) for r in rows}

    def step_time(self, run_id: str, lo: int, hi: int) -> float:
        """The traced ranks' step times over steps ``lo..hi``, summed (seconds)."""
        total = self.r.rows(
            "SELECT sum(duration) AS d FROM (SELECT any(duration) AS duration FROM "
            f"{{db}}.trace_steps WHERE {_WINDOW} GROUP BY step, rank)",
            run=run_id,
            lo=lo,
            hi=hi,
        )[0]["d"]
        return float(total or 0.0)

    def top_kernels(self, run_id: str, lo: int, hi: int, limit: int) -> pa.Table:
        """The ``limit`` kernels with the most device time over steps ``lo..hi``, every rank
        summed: name, category, calls, total (seconds), ranks."""
        return self.r.table(
            "SELECT name, any(category) AS category, sum(calls) AS calls, sum(total) AS total, "
            "uniqExact(rank) AS ranks FROM (SELECT step, rank, name, any(category) AS category, "
            "any(calls) AS calls, any(total) AS total FROM {db}.trace_kernels "
            f"WHERE {_WINDOW} GROUP BY step, rank, name) "
            "GROUP BY name ORDER BY total DESC, name LIMIT {limit:UInt64}",
            run=run_id,
            lo=lo,
            hi=hi,
            limit=limit,
        )

    def top_collectives(self, run_id: str, lo: int, hi: int, limit: int) -> pa.Table:
        """The ``limit`` collective operations with the most time between enter and exit over
        steps ``lo..hi``, every rank summed: op, calls, total (seconds), bytes, ranks."""
        return self.r.table(
            "SELECT op, count() AS calls, sum(exit - enter) AS total, sum(bytes) AS bytes, "
            "uniqExact(rank) AS ranks FROM {db}.collectives "
            f"WHERE {_WINDOW} GROUP BY op ORDER BY total DESC, op LIMIT {{limit:UInt64}}",
            run=run_id,
            lo=lo,
            hi=hi,
            limit=limit,
        )
