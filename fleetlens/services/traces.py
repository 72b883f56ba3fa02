"""Read queries over profiler-trace findings (``trace_steps``), bound to the caller's tenant.

As in :mod:`fleetlens.services.runs`, the scope is given at construction and every statement
filters on it; the API checks the run against the scope's project first.
"""

from __future__ import annotations

import math
from typing import Any

from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore

__all__ = ["TRACE_LINES", "TraceQueries"]

TRACE_LINES = ("compute", "comm", "exposed_comm", "overlap", "memcpy", "idle")
"""Per-step lines of a ``trace_step`` record, seconds; all but ``comm``/``overlap`` sum to it."""

_CAMEL = {"exposed_comm": "exposedComm"}


def _ms(x: Any) -> float | None:
    if x is None:
        return None
    v = float(x)
    return round(v * 1000.0, 3) if math.isfinite(v) else None


class TraceQueries:
    def __init__(self, telemetry: TelemetryStore, scope: Scope) -> None:
        self.r = TenantReader(telemetry, scope)

    def _where(self) -> str:
        return (
            "tenant = {tenant:String} AND run_id = {run:String} "
            "AND step BETWEEN {lo:Int64} AND {hi:Int64}"
        )

    def window(self, run_id: str) -> tuple[int, int] | None:
        row = self.r.rows(
            "SELECT min(step) AS lo, max(step) AS hi, count() AS n FROM {db}.trace_steps "
            "WHERE tenant = {tenant:String} AND run_id = {run:String}",
            run=run_id,
        )[0]
        return (int(row["lo"]), int(row["hi"])) if row["n"] else None

    def steps(
        self, run_id: str, lo: int, hi: int, limit: int, rank: int | None = None
    ) -> list[dict[str, Any]]:
        """One row per (step, rank), of one rank when given: a re-imported trace (another
        batch) counts once."""
        lines = ", ".join(f"any({c}) AS {c}" for c in TRACE_LINES)
        one = "" if rank is None else " AND rank = {rank:Int32}"
        rows = self.r.rows(
            f"SELECT step, rank, any(time) AS time, any(duration) AS duration, {lines}, "
            "any(kernels) AS kernels, any(source) AS source FROM {db}.trace_steps "
            f"WHERE {self._where()}{one} GROUP BY step, rank ORDER BY step, rank "
            "LIMIT {limit:UInt64}",
            run=run_id,
            lo=lo,
            hi=hi,
            limit=limit,
            **({} if rank is None else {"rank": rank}),
        )
        out = []
        for r in rows:
            item: dict[str, Any] = {
                "step": int(r["step"]),
                "rank": int(r["rank"]),
                "time": float(r["time"]),
                "durationMs": _ms(r["duration"]),
            }
            for c in TRACE_LINES:
                item[f"{_CAMEL.get(c, c)}Ms"] = _ms(r[c])
            item["kernels"] = int(r["kernels"])
            item["source"] = r["source"]
            out.append(item)
        return out

    def ranks(self, run_id: str, lo: int, hi: int) -> list[dict[str, Any]]:
        """Per rank over the window: totals, mean step time, and each line as % of step time."""
        sums = ", ".join(f"sum({c}) AS s_{c}" for c in TRACE_LINES)
        rows = self.r.rows(
            f"SELECT rank, count() AS n, sum(duration) AS s_duration, {sums}, "
            "sum(kernels) AS s_kernels FROM ("
            f" SELECT step, rank, any(duration) AS duration, "
            + ", ".join(f"any({c}) AS {c}" for c in TRACE_LINES)
            + ", any(kernels) AS kernels FROM {db}.trace_steps"
            f" WHERE {self._where()} GROUP BY step, rank) GROUP BY rank ORDER BY rank",
            run=run_id,
            lo=lo,
            hi=hi,
        )
        colls = {
            int(r["rank"]): int(r["n"])
            for r in self.r.rows(
                "SELECT rank, count() AS n FROM {db}.collectives "
                f"WHERE {self._where()} GROUP BY rank",
                run=run_id,
                lo=lo,
                hi=hi,
            )
        }
        out = []
        for r in rows:
            total = float(r["s_duration"])
            item: dict[str, Any] = {
                "rank": int(r["rank"]),
                "steps": int(r["n"]),
                "durationMs": _ms(total),
                "meanStepMs": _ms(total / int(r["n"])) if r["n"] else None,
            }
            for c in TRACE_LINES:
                name = _CAMEL.get(c, c)
                item[f"{name}Ms"] = _ms(r[f"s_{c}"])
                item[f"{name}Pct"] = (
                    round(100.0 * float(r[f"s_{c}"]) / total, 2) if total > 0 else None
                )
            item["kernels"] = int(r["s_kernels"])
            item["collectives"] = colls.get(int(r["rank"]), 0)
            out.append(item)
        return out

    def top_kernels(self, run_id: str, lo: int, hi: int, limit: int = 10) -> list[dict[str, Any]]:
        """The kernels with the most device time over the window, every traced rank summed
        (each rank's step keeps its ten heaviest, so a kernel light everywhere is not here),
        with their share of the ranks' summed step time."""
        total = self.r.rows(
            "SELECT sum(duration) AS d FROM (SELECT any(duration) AS duration FROM "
            f"{{db}}.trace_steps WHERE {self._where()} GROUP BY step, rank)",
            run=run_id,
            lo=lo,
            hi=hi,
        )[0]["d"]
        rows = self.r.rows(
            "SELECT name, any(category) AS category, sum(calls) AS calls, sum(total) AS total, "
            "uniqExact(rank) AS ranks FROM (SELECT step, rank, name, any(category) AS category, "
            "any(calls) AS calls, any(total) AS total FROM {db}.trace_kernels "
            f"WHERE {self._where()} GROUP BY step, rank, name) "
            "GROUP BY name ORDER BY total DESC, name LIMIT {limit:UInt64}",
            run=run_id,
            lo=lo,
            hi=hi,
            limit=limit,
        )
        step_time = float(total or 0.0)
        return [
            {
                "name": r["name"],
                "category": r["category"],
                "calls": int(r["calls"]),
                "totalMs": _ms(r["total"]),
                "pctOfStepTime": (
                    round(100.0 * float(r["total"]) / step_time, 2) if step_time > 0 else None
                ),
                "ranks": int(r["ranks"]),
            }
            for r in rows
        ]

    def top_collectives(
        self, run_id: str, lo: int, hi: int, limit: int = 10
    ) -> list[dict[str, Any]]:
        """The collective operations with the most time between enter and exit over the
        window, every rank summed."""
        rows = self.r.rows(
            "SELECT op, count() AS calls, sum(exit - enter) AS total, sum(bytes) AS bytes, "
            "uniqExact(rank) AS ranks FROM {db}.collectives "
            f"WHERE {self._where()} GROUP BY op ORDER BY total DESC, op LIMIT {{limit:UInt64}}",
            run=run_id,
            lo=lo,
            hi=hi,
            limit=limit,
        )
        return [
            {
                "op": r["op"],
                "calls": int(r["calls"]),
                "totalMs": _ms(r["total"]),
                "bytes": int(r["bytes"]),
                "ranks": int(r["ranks"]),
            }
            for r in rows
        ]
