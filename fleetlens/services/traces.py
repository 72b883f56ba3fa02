"""Read queries over profiler-trace findings (``trace_steps``), bound to the caller's tenant.

As in :mod:`fleetlens.services.runs`, the scope is given at construction and the reader scopes
every read to its tenant; the API checks the run against the scope's project first.
"""

from __future__ import annotations

import math
from typing import Any

from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from ..store.trace_queries import TRACE_LINES, TraceStepQueries

__all__ = ["TRACE_LINES", "TraceQueries"]

_CAMEL = {"exposed_comm": "exposedComm"}


def _ms(x: Any) -> float | None:
    if x is None:
        return None
    v = float(x)
    return round(v * 1000.0, 3) if math.isfinite(v) else None


class TraceQueries:
    def __init__(self, telemetry: TelemetryStore, scope: Scope) -> None:
        self.q = TraceStepQueries(TenantReader(telemetry, scope))

    def window(self, run_id: str) -> tuple[int, int] | None:
        return self.q.step_span(run_id)

    def steps(
        self, run_id: str, lo: int, hi: int, limit: int, rank: int | None = None
    ) -> list[dict[str, Any]]:
        """One row per (step, rank), of one rank when given: a re-imported trace (another
        batch) counts once."""
        out = []
        for r in self.q.steps(run_id, lo, hi, limit, rank).to_pylist():
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
        colls = self.q.rank_collectives(run_id, lo, hi)
        out = []
        for r in self.q.rank_sums(run_id, lo, hi).to_pylist():
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
        step_time = self.q.step_time(run_id, lo, hi)
        rows = self.q.top_kernels(run_id, lo, hi, limit).to_pylist()
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
        rows = self.q.top_collectives(run_id, lo, hi, limit).to_pylist()
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
