"""Where a rank's device time went, per step: pure functions over interval arrays (numpy).

All inputs are intervals ``[start, end)`` in one time unit, with a class per interval (compute,
communication, memory, other: see :mod:`fleetlens.traces.kineto`). Within a step window, each
class's intervals are clipped to the window and merged (a union: two kernels running at once on
two streams count once), and the lines are::

    compute       = |C|                       C = compute kernels
    comm          = |M|                       M = communication kernels
    overlap       = |C ∩ M|                   communication hidden under compute
    exposed_comm  = |M \\ C|                   communication nothing else hid
    memcpy        = |A \\ (C ∪ M)|             copies, sets and "other" kernels alone on the device
    idle          = window - |A|              A = all device activity

so ``compute + exposed_comm + memcpy + idle == duration`` exactly, and ``comm == overlap +
exposed_comm``. :func:`hta_temporal_breakdown` and :func:`hta_comm_comp_overlap` compute Holistic
Trace Analysis's whole-trace figures from the same arrays, for the cross-check in
``bench/trace_import.py`` and ``docs/traces.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kineto import COMM, COMPUTE

__all__ = [
    "StepBreakdown",
    "assign_steps",
    "hta_comm_comp_overlap",
    "hta_temporal_breakdown",
    "merge_intervals",
    "step_breakdown",
    "union_length",
]


def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as disjoint, sorted intervals (HTA's merge_kernel_intervals)."""
    if len(start) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    # Touching intervals stay one group, as in HTA (`ts > previous cummax(end)` starts a group).
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last]


def union_length(start: np.ndarray, end: np.ndarray) -> float:
    ms, me = merge_intervals(start, end)
    return float((me - ms).sum())


def assign_steps(t: np.ndarray, step_start: np.ndarray, step_dur: np.ndarray) -> np.ndarray:
    """Index of the step whose window ``[start, start + dur)`` holds each time, else -1.

    HTA's rule for CPU events (``add_iteration``); steps are sorted by start and do not overlap.
    """
    if len(step_start) == 0:
        return np.full(len(t), -1, dtype=np.int64)
    idx = np.searchsorted(step_start, t, side="right") - 1
    ok = (idx >= 0) & (t < step_start[np.clip(idx, 0, None)] + step_dur[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1).astype(np.int64)


@dataclass
class StepBreakdown:
    """Per-step lines, one entry per step window, in the unit of the inputs."""

    duration: np.ndarray
    compute: np.ndarray
    comm: np.ndarray
    overlap: np.ndarray
    exposed_comm: np.ndarray
    memcpy: np.ndarray
    idle: np.ndarray


def step_breakdown(
    step_start: np.ndarray,
    step_dur: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    kind: np.ndarray,
) -> StepBreakdown:
    """Clip device intervals to each step window and split the window into the lines above."""
    n = len(step_start)
    out = {k: np.zeros(n) for k in ("compute", "comm", "overlap", "exposed", "memcpy", "busy")}
    order = np.argsort(start, kind="stable")
    s_all, e_all, k_all = start[order], end[order], kind[order]
    longest = float((e_all - s_all).max()) if len(s_all) else 0.0
    for i in range(n):
        w0, w1 = float(step_start[i]), float(step_start[i] + step_dur[i])
        lo = int(np.searchsorted(s_all, w0 - longest, side="left"))
        hi = int(np.searchsorted(s_all, w1, side="left"))
        s, e, k = s_all[lo:hi], e_all[lo:hi], k_all[lo:hi]
        keep = e > w0
        s, e, k = np.maximum(s[keep], w0), np.minimum(e[keep], w1), k[keep]
        is_c, is_m = k == COMPUTE, k == COMM
        c = union_length(s[is_c], e[is_c])
        m = union_length(s[is_m], e[is_m])
        cm_mask = is_c | is_m
        cm = union_length(s[cm_mask], e[cm_mask])
        busy = union_length(s, e)
        out["compute"][i], out["comm"][i] = c, m
        out["overlap"][i], out["exposed"][i] = c + m - cm, cm - c
        out["memcpy"][i], out["busy"][i] = busy - cm, busy
    return StepBreakdown(
        duration=np.asarray(step_dur, dtype=np.float64),
        compute=out["compute"],
        comm=out["comm"],
        overlap=out["overlap"],
        exposed_comm=out["exposed"],
        memcpy=out["memcpy"],
        idle=np.asarray(step_dur, dtype=np.float64) - out["busy"],
    )


def hta_temporal_breakdown(
    start: np.ndarray, end: np.ndarray, kind: np.ndarray
) -> dict[str, float]:
    """HTA's ``get_temporal_breakdown`` for one rank over the given device intervals.

    HTA's denominator is the span from the first device interval's start to the last one's end
    (not the step windows); idle is that span less the union of all intervals, compute the union
    of compute kernels, non-compute the rest (communication, memory and other kernels outside
    compute). Percentages are rounded to 2 decimals as HTA rounds them.
    """
    if len(start) == 0:
        return {"kernel_us": 0.0, "idle_us": 0.0, "compute_us": 0.0, "non_compute_us": 0.0}
    ms, me = merge_intervals(start, end)
    span = float(me[-1] - ms[0])
    idle = span - float((me - ms).sum())
    c = kind == COMPUTE
    compute = union_length(start[c], end[c])
    non_compute = span - compute - idle
    pct = (lambda x: round(100.0 * x / span, 2)) if span > 0 else (lambda x: 0.0)
    return {
        "kernel_us": span,
        "idle_us": idle,
        "compute_us": compute,
        "non_compute_us": non_compute,
        "idle_pct": pct(idle),
        "compute_pct": pct(compute),
        "non_compute_pct": pct(non_compute),
    }


def hta_comm_comp_overlap(start: np.ndarray, end: np.ndarray, kind: np.ndarray) -> float:
    """HTA's ``get_comm_comp_overlap``: % of (merged) communication time under compute."""
    c, m = kind == COMPUTE, kind == COMM
    comm = union_length(start[m], end[m])
    if comm <= 0:
        return 0.0
    cm = c | m
    overlap = union_length(start[c], end[c]) + comm - union_length(start[cm], end[cm])
    return round(100.0 * overlap / comm, 2)
