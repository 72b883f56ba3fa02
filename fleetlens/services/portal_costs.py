"""The run page's "What's wrong" panel: the run's findings ranked by what they cost.

Each finding gets its share of the goodput breakdown's loss lines
(:func:`fleetlens.analysis.attribution.attribute`), in seconds, GPU-hours and goodput points,
and when it began (its first step's start time); the findings come back most costly first, and
what no finding explains comes back as ``unattributed`` in the same units. Per loss line, the
findings' seconds plus ``unattributed`` equal the breakdown's seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis.attribution import FindingWindow, attribute, severity
from ..analysis.breakdown import Breakdown
from ..store.findings import FindingRow
from .portal import Executions

__all__ = ["Cost", "RankedFinding", "finding_costs"]


@dataclass(frozen=True, slots=True)
class Cost:
    """What a finding (or what no finding explains) cost: seconds per loss line (rounded to
    the millisecond), their total, in GPU-hours and in goodput points."""

    seconds: dict[str, float]
    total_seconds: float
    gpu_hours: float
    goodput_points: float


@dataclass(frozen=True, slots=True)
class RankedFinding:
    """A finding with its cost, its first step and when that step first started (UNIX
    seconds; None: no execution), and its place (1: the most costly)."""

    finding: FindingRow
    cost: Cost
    since_step: int
    since_time: float | None
    rank: int


def _cost(seconds: dict[str, float], devices: float, wall: float) -> Cost:
    total = sum(seconds.values())  # an int 0 when no line: the JSON has always said 0
    return Cost(
        seconds={k: round(v, 3) for k, v in seconds.items()},
        total_seconds=total,
        gpu_hours=total * devices / 3600.0,
        goodput_points=100.0 * total / wall if wall > 0 else 0.0,
    )


def finding_costs(
    findings: list[FindingRow], bd: Breakdown, executions: Executions, devices: float
) -> tuple[list[RankedFinding], Cost]:
    """``findings`` each with its cost, first step and place, most costly first (then most
    confident); and the unattributed remainder's cost. ``executions``: every step execution
    of the run (a restart replays steps)."""
    per_step = executions.latest()
    windows = [
        FindingWindow(
            key=f.key,
            kind=f.kind,
            diagnosis=f.diagnosis,
            start_step=int(f.start_step),
            end_step=f.end_step,
            severity=severity(f.evidence or [], float(f.confidence)),
        )
        for f in findings
    ]
    raw = {
        "straggler": np.clip(np.nan_to_num(per_step.max_compute - per_step.mean_compute), 0, None),
        "data_stall": np.nan_to_num(per_step.data_wait, nan=0.0),
    }
    split = attribute(windows, bd, per_step.step, raw)
    costs = [(f, _cost(split.by_finding.get(f.key, {}), devices, bd.wall_s)) for f in findings]
    costs.sort(key=lambda fc: (-fc[1].total_seconds, -fc[0].confidence))
    out = [
        RankedFinding(
            finding=f,
            cost=cost,
            since_step=f.start_step,
            since_time=_time_of(executions, f.start_step),
            rank=i + 1,
        )
        for i, (f, cost) in enumerate(costs)
    ]
    return out, _cost(split.unattributed, devices, bd.wall_s)


def _time_of(rows: Executions, step: int) -> float | None:
    """When ``step`` (or the first step after it) first started, UNIX seconds: a replayed
    step's first execution, before the restart."""
    after = rows.step >= step
    if not after.any():
        return float(rows.start.max()) if len(rows) else None
    first = int(rows.step[after].min())
    return float(rows.start[rows.step == first].min())
