"""Read queries over profiler-trace findings (``trace_steps``), bound to the caller's tenant.

As in :mod:`fleetlens.services.runs`, the scope is given at construction and the reader scopes
every read to its tenant; the API checks the run against the scope's project first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from ..store.trace_queries import TRACE_LINES, TraceStepQueries

__all__ = [
    "TRACE_LINES",
    "TraceCollective",
    "TraceKernel",
    "TraceLines",
    "TraceQueries",
    "TraceRank",
    "TraceStep",
]


@dataclass(frozen=True, slots=True)
class TraceLines:
    """Where step time went, one value per line of :data:`TRACE_LINES` (milliseconds, or %
    of step time; None: not finite, or no step time)."""

    compute: float | None
    comm: float | None
    exposed_comm: float | None
    overlap: float | None
    memcpy: float | None
    idle: float | None


@dataclass(frozen=True, slots=True)
class TraceStep:
    """One rank's ProfilerStep: its start, duration and lines (ms), kernels and source."""

    step: int
    rank: int
    time: float
    duration_ms: float | None
    ms: TraceLines
    kernels: int
    source: str


@dataclass(frozen=True, slots=True)
class TraceRank:
    """One rank's totals over a window: steps, duration and mean step (ms), each line in ms
    and as % of step time, kernels and collectives."""

    rank: int
    steps: int
    duration_ms: float | None
    mean_step_ms: float | None
    ms: TraceLines
    pct: TraceLines
    kernels: int
    collectives: int


@dataclass(frozen=True, slots=True)
class TraceKernel:
    """A kernel with much device time over a window, every traced rank summed."""

    name: str
    category: str
    calls: int
    total_ms: float | None
    pct_of_step_time: float | None
    ranks: int


@dataclass(frozen=True, slots=True)
class TraceCollective:
    """A collective operation with much time between enter and exit, every rank summed."""

    op: str
    calls: int
    total_ms: float | None
    bytes: int
    ranks: int


def _lines(values: dict[str, float | None]) -> TraceLines:
    return TraceLines(**{c: values[c] for c in TRACE_LINES})


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
    ) -> list[TraceStep]:
        """One row per (step, rank), of one rank when given: a re-imported trace (another
        batch) counts once."""
        return [
            TraceStep(
                step=int(r["step"]),
                rank=int(r["rank"]),
                time=float(r["time"]),
                duration_ms=_ms(r["duration"]),
                ms=_lines({c: _ms(r[c]) for c in TRACE_LINES}),
                kernels=int(r["kernels"]),
                source=r["source"],
            )
            for r in self.q.steps(run_id, lo, hi, limit, rank).to_pylist()
        ]

    def ranks(self, run_id: str, lo: int, hi: int) -> list[TraceRank]:
        """Per rank over the window: totals, mean step time, and each line as % of step time."""
        colls = self.q.rank_collectives(run_id, lo, hi)
        out = []
        for r in self.q.rank_sums(run_id, lo, hi).to_pylist():
            total = float(r["s_duration"])
            pct = {
                c: round(100.0 * float(r[f"s_{c}"]) / total, 2) if total > 0 else None
                for c in TRACE_LINES
            }
            item = TraceRank(
                rank=int(r["rank"]),
                steps=int(r["n"]),
                duration_ms=_ms(total),
                mean_step_ms=_ms(total / int(r["n"])) if r["n"] else None,
                ms=_lines({c: _ms(r[f"s_{c}"]) for c in TRACE_LINES}),
                pct=_lines(pct),
                kernels=int(r["s_kernels"]),
                collectives=colls.get(int(r["rank"]), 0),
            )
            out.append(item)
        return out

    def top_kernels(self, run_id: str, lo: int, hi: int, limit: int = 10) -> list[TraceKernel]:
        """The kernels with the most device time over the window, every traced rank summed
        (each rank's step keeps its ten heaviest, so a kernel light everywhere is not here),
        with their share of the ranks' summed step time."""
        step_time = self.q.step_time(run_id, lo, hi)
        rows = self.q.top_kernels(run_id, lo, hi, limit).to_pylist()
        return [
            TraceKernel(
                name=r["name"],
                category=r["category"],
                calls=int(r["calls"]),
                total_ms=_ms(r["total"]),
                pct_of_step_time=(
                    round(100.0 * float(r["total"]) / step_time, 2) if step_time > 0 else None
                ),
                ranks=int(r["ranks"]),
            )
            for r in rows
        ]

    def top_collectives(
        self, run_id: str, lo: int, hi: int, limit: int = 10
    ) -> list[TraceCollective]:
        """The collective operations with the most time between enter and exit over the
        window, every rank summed."""
        rows = self.q.top_collectives(run_id, lo, hi, limit).to_pylist()
        return [
            TraceCollective(
                op=r["op"],
                calls=int(r["calls"]),
                total_ms=_ms(r["total"]),
                bytes=int(r["bytes"]),
                ranks=int(r["ranks"]),
            )
            for r in rows
        ]
