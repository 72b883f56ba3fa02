"""The run page's "What's wrong" panel: the run's findings ranked by what they cost.

Each finding (as the API answers it) gets its share of the goodput breakdown's loss lines
(:func:`fleetlens.analysis.attribution.attribute`), in seconds, GPU-hours and goodput points,
and when it began (its first step's start time); the findings come back most costly first, and
what no finding explains comes back as ``unattributed`` in the same units. Per loss line, the
findings' seconds plus ``unattributed`` equal the breakdown's seconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..analysis.attribution import FindingWindow, attribute, severity
from ..analysis.breakdown import Breakdown
from .portal import Executions

__all__ = ["finding_costs"]


def _cost(seconds: dict[str, float], devices: float, wall: float) -> dict[str, Any]:
    total = sum(seconds.values())
    return {
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "totalSeconds": total,
        "gpuHours": total * devices / 3600.0,
        "goodputPoints": 100.0 * total / wall if wall > 0 else 0.0,
    }


def finding_costs(
    findings: list[dict[str, Any]], bd: Breakdown, executions: Executions, devices: float
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``findings`` (camelCase dicts), each with ``cost``, ``since`` and ``rank``, most costly
    first (then most confident); and the unattributed remainder's cost. ``executions``: every
    step execution of the run (a restart replays steps)."""
    per_step = executions.latest()
    windows = [
        FindingWindow(
            key=f["key"],
            kind=f["kind"],
            diagnosis=f["diagnosis"],
            start_step=int(f["startStep"]),
            end_step=f["endStep"],
            severity=severity(f.get("evidence") or [], float(f["confidence"])),
        )
        for f in findings
    ]
    raw = {
        "straggler": np.clip(np.nan_to_num(per_step.max_compute - per_step.mean_compute), 0, None),
        "data_stall": np.nan_to_num(per_step.data_wait, nan=0.0),
    }
    split = attribute(windows, bd, per_step.step, raw)
    out = []
    for f in findings:
        g = dict(f)
        g["cost"] = _cost(split.by_finding.get(f["key"], {}), devices, bd.wall_s)
        g["since"] = {"step": g["startStep"], "time": _time_of(executions, g["startStep"])}
        out.append(g)
    out.sort(key=lambda g: (-g["cost"]["totalSeconds"], -g["confidence"]))
    for i, g in enumerate(out):
        g["rank"] = i + 1
    return out, _cost(split.unattributed, devices, bd.wall_s)


def _time_of(rows: Executions, step: int) -> float | None:
    """When ``step`` (or the first step after it) first started, UNIX seconds: a replayed
    step's first execution, before the restart."""
    after = rows.step >= step
    if not after.any():
        return float(rows.start.max()) if len(rows) else None
    first = int(rows.step[after].min())
    return float(rows.start[rows.step == first].min())
