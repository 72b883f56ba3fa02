"""Where a run's wall-clock went: a partition of [t0, t1] into named losses that sums exactly.

Inputs are plain: the per-step rollup of the run (one row per step *execution*, i.e. per step and
job attempt: start, end, the slowest rank's duration, the mean rank duration, and optionally the
step's input wait) and the run's lifecycle events. No I/O.

Every instant of the window is charged to exactly one line, by precedence:

1. A step execution. If a later attempt re-executed the same step number, the execution is
   ``rework`` (work discarded after the last checkpoint). Otherwise it is retained and split into
   ``data_stall`` (its input wait), ``straggler`` (slowest rank minus the mean rank) and
   ``productive`` (the rest).
2. An explicit interval: a synchronous checkpoint (``checkpoint_begin`` .. ``checkpoint_end``,
   or ``checkpoint_end`` with ``attrs.duration_s``; ``attrs.sync = false`` saves are not pauses:
   their cost shows in the steps; one with ``attrs.category``, e.g. a drain's checkpoint with
   ``recovery``, is charged there), or any event whose attrs carry ``category`` and ``duration``
   (``maintenance``/``drain``/``hang`` events with a ``duration`` need no category).
3. A ``hang`` event without a duration: from the last step end before it to the next step start
   (or the end of its attempt). A step execution longer than the hang rule's threshold
   (:class:`fleetlens.analysis.hangs.HangRule` over its attempt's typical step) was held open
   by a hang (a rank stopped mid-step): its time past the typical step is ``hang``, not work.
4. The attempt structure: gang complete (or job start) to first step is ``startup`` for the
   first attempt and is charged to the cause that ended the previous attempt for later ones
   (warmup belongs to the event that triggered it). From the last step end to the first fault
   signal (``hardware_fault``, ``exception``, ``oom``, ``nan``, ``signal``, ``preemption``) is
   the step in flight, lost: ``rework``. From there to the attempt's end, and the gap until the
   next attempt, go to the cause: ``recovery`` for failures (detection, relaunch, reload),
   ``preemption``, or ``maintenance`` (planned drains and ``maintenance`` events; a drain with
   ``attrs.planned = false`` or after a failure signal is part of the recovery).
5. Anything else is ``unaccounted``: above ``tolerance`` of the wall-clock it is reported as an
   instrumentation hole, never spread over the other lines.

Time between attempts when the next attempt has a ``job_start``/``gang_complete`` event is not
held by the job (it waited for readmission): it is charged to its cause but also listed in
``unheld``, and it is outside runtime goodput's denominator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from .hangs import HangRule
from .run_structure import (
    TERMINAL,
    Attempts,
    Executions,
    cause_of,
    read_attempts,
    read_executions,
)
from .timeline import F64, Event, StepArrays, checkpoint_saves, checkpoint_seconds
from .timeline import events_from_rows as events_from_rows  # re-exported

__all__ = [
    "CATEGORIES",
    "FACTOR_OF",
    "Breakdown",
    "Event",
    "StepArrays",
    "breakdown",
]

CATEGORIES = (
    "productive",
    "straggler",
    "data_stall",
    "startup",
    "recovery",
    "rework",
    "checkpoint",
    "preemption",
    "maintenance",
    "hang",
    "evaluation",
    "unaccounted",
)

FACTOR_OF: dict[str, str] = {
    "productive": "program (ideal part of retained step time: runtime numerator)",
    "straggler": "program (retained step time above the mean rank: runtime numerator)",
    "data_stall": "runtime (input waits, equation 4 term 2)",
    "startup": "runtime (cold start, equation 4 term 1)",
    "checkpoint": "runtime (synchronous writes, equation 4 term 3)",
    "rework": "runtime (lost steps: term 3 for failures, term 5 for preemptions)",
    "recovery": "runtime (detection, relaunch, reload, warmup: equation 4 term 4)",
    "hang": "runtime (no progress while held: counted with recovery in term 4)",
    "preemption": "runtime (equation 4 term 5); queue time before readmission is unheld",
    "maintenance": "runtime (planned reconfiguration, with term 5)",
    "evaluation": "runtime (in-loop evaluation pauses; outside the five terms)",
    "unaccounted": "runtime (instrumentation hole: held time with no record)",
}
"""Which goodput factor each breakdown line belongs to (the reconciliation of the two views)."""

_EXPLICIT_OK = frozenset(CATEGORIES) - {"productive", "straggler", "data_stall", "rework"}
_PRIO_EXPLICIT, _PRIO_HANG, _PRIO_ATTEMPT = 3, 2, 1
_HANG_RULE = HangRule()


@dataclass(frozen=True)
class Breakdown:
    t0: float
    t1: float
    seconds: dict[str, float]
    unheld: dict[str, float]
    rework_by_cause: dict[str, float]
    retained_steps: float
    reworked_executions: int
    attempts: int
    interruptions: dict[str, int]
    checkpoints: int
    tolerance: float

    @property
    def wall_s(self) -> float:
        return self.t1 - self.t0

    @property
    def held_s(self) -> float:
        return self.wall_s - sum(self.unheld.values())

    @property
    def productive_s(self) -> float:
        return self.seconds["productive"]

    @property
    def retained_step_s(self) -> float:
        """Runtime goodput's numerator and program goodput's denominator."""
        return self.seconds["productive"] + self.seconds["straggler"]

    @property
    def runtime_goodput(self) -> float:
        held = self.held_s
        return min(1.0, self.retained_step_s / held) if held > 0 else 0.0

    @property
    def instrumentation_hole(self) -> bool:
        return self.wall_s > 0 and self.seconds["unaccounted"] > self.tolerance * self.wall_s

    def measured_terms(self) -> dict[str, float]:
        """Equation 4's five runtime terms as shares of held time, measured from the timeline."""
        h = self.held_s or math.inf
        held = {k: v - self.unheld.get(k, 0.0) for k, v in self.seconds.items()}
        rw = self.rework_by_cause
        return {
            "startup": held["startup"] / h,
            "data_stall": held["data_stall"] / h,
            "checkpoint": (held["checkpoint"] + rw.get("failure", 0.0)) / h,
            "recovery": (held["recovery"] + held["hang"]) / h,
            "preemption": (
                held["preemption"]
                + held["maintenance"]
                + rw.get("preemption", 0.0)
                + rw.get("maintenance", 0.0)
            )
            / h,
            "other": (held["evaluation"] + held["unaccounted"]) / h,
        }


_REWORK_KEY = {"recovery": "failure", "preemption": "preemption", "maintenance": "maintenance"}
_CAUSES = ("failure", "preemption", "maintenance")
_LINES = CATEGORIES + tuple(f"rework:{k}" for k in _CAUSES)
"""The lines the segment pass assigns: rework of a step in flight carries its cause."""

# (start, end, line, precedence, held by the job)
_Interval = tuple[float, float, str, int, bool]


def _explicit(evs: list[Event]) -> tuple[list[tuple[float, float, str]], list[Event], int]:
    """Intervals the events state (checkpoints, events with a duration), the hangs without a
    duration, and the number of checkpoint saves (:func:`checkpoint_saves`: a save every rank
    of a job reports is one)."""
    hangs: list[Event] = []
    explicit: list[tuple[float, float, str]] = []
    ckpt_open: dict[str, float] = {}
    for e in evs:
        dur = e.attrs.get("duration")
        cat = e.attrs.get("category")
        if e.kind == "checkpoint_begin":
            ckpt_open[e.job_id] = e.time
        elif e.kind == "checkpoint_end":
            began = ckpt_open.pop(e.job_id, None)
            if e.attrs.get("sync", True) is False:
                continue
            # A checkpoint taken to recover (a drain's) says so: it is charged to recovery.
            ck = str(cat) if cat in _EXPLICIT_OK else "checkpoint"
            if began is not None:
                explicit.append((began, e.time, ck))
            elif (took := checkpoint_seconds(e.attrs)) is not None:
                explicit.append((e.time - took, e.time, ck))
        elif isinstance(dur, (int, float)) and dur > 0:
            if cat is None:
                cat = {"drain": "maintenance", "maintenance": "maintenance", "hang": "hang"}.get(
                    e.kind
                )
            if cat in _EXPLICIT_OK:
                explicit.append((e.time, e.time + float(dur), str(cat)))
        elif e.kind == "hang":
            hangs.append(e)
    return explicit, hangs, len(checkpoint_saves(evs))


def _attempt_intervals(attempts: Attempts) -> tuple[list[_Interval], dict[str, str]]:
    """Startup, the step in flight at a fault, the recovery after it and the gap between
    attempts, each charged to its cause; and each attempt's cause."""
    intervals: list[_Interval] = []
    causes: dict[str, str] = {}
    prev_cause: str | None = None
    names, starts, ends = attempts.names, attempts.starts, attempts.ends
    for k, j in enumerate(names):
        a = attempts.by_job[j]
        cause = cause_of(a.kinds)
        if k == len(names) - 1 and not (a.kinds & (TERMINAL - {"finish"})):
            cause = "finish"
        causes[j] = cause
        s, f, last, end = starts[k], a.first, a.last, ends[k]
        lead = "startup" if prev_cause in (None, "finish") else prev_cause
        intervals.append((s, f if f is not None else end, lead, _PRIO_ATTEMPT, True))
        if last is not None and cause != "finish":
            # The step in flight when the fault hit is lost work; detection follows it.
            hit = min((t for t in a.hit if last <= t <= end), default=last)
            key = f"rework:{_REWORK_KEY.get(cause, 'failure')}"
            intervals.append((last, hit, key, _PRIO_ATTEMPT, True))
            intervals.append((hit, end, cause, _PRIO_ATTEMPT, True))
        if k + 1 < len(names) and cause != "finish":
            nxt = attempts.by_job[names[k + 1]]
            intervals.append((end, starts[k + 1], cause, _PRIO_ATTEMPT, nxt.held is None))
        prev_cause = cause
    return intervals, causes


def _hang_intervals(
    hangs: list[Event], ex: Executions, attempts: Attempts, t0: float, t1: float
) -> list[_Interval]:
    """A hang without a duration: from the last step end before it to the next step start."""
    st, wall, n = ex.start, ex.wall, ex.n
    out: list[_Interval] = []
    for e in hangs:
        i = int(np.searchsorted(st + wall, e.time, side="right")) - 1
        a0 = float(st[i] + wall[i]) if i >= 0 else t0
        i2 = int(np.searchsorted(st, e.time, side="left"))
        b0 = float(st[i2]) if i2 < n else t1
        j = attempts.owner(e)
        if j is not None and j in attempts.names:
            b0 = min(b0, attempts.ends[attempts.names.index(j)])
        out.append((a0, max(a0, b0), "hang", _PRIO_HANG, True))
    return out


@dataclass
class _Tally:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    unheld: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    rework_by_cause: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_CAUSES, 0.0))


def _stalled_steps(ex: Executions, rule: HangRule) -> list[tuple[float, float]]:
    """Executions that lasted past the hang rule's threshold (a rank stopped mid-step holds
    every rank's step open): its time past the attempt's typical step and its data wait (a
    stall of its own) is a hang."""
    out: list[tuple[float, float]] = []
    for j in np.unique(ex.jobs).tolist() if ex.n else []:
        sel = ex.jobs == j
        walls = ex.wall[sel]
        typical = float(np.median(walls[walls > 0])) if (walls > 0).any() else 0.0
        long = walls > rule.threshold(typical)
        starts, waits = ex.start[sel][long], ex.data_wait[sel][long]
        for a, w, dw in zip(starts.tolist(), walls[long].tolist(), waits.tolist(), strict=True):
            if typical + dw < w:
                out.append((a + typical + dw, a + w))
    return out


def _hung_within(ex: Executions, hangs: list[tuple[float, float]]) -> F64:
    """Seconds of each execution inside a hang interval (a rank stopped mid-step holds every
    rank's step open: that step's length is the hang's, not work)."""
    out = np.zeros(ex.n)
    for a, b in hangs:
        out += np.clip(np.minimum(ex.start + ex.wall, b) - np.maximum(ex.start, a), 0.0, None)
    return np.minimum(out, ex.wall)


def _charge_steps(
    ex: Executions,
    t0: float,
    t1: float,
    causes: dict[str, str],
    tally: _Tally,
    hangs: list[tuple[float, float]] | None = None,
) -> float:
    """Steps: the part of each execution inside the window; returns the retained steps. The
    part of a retained execution inside a hang is ``hang``, taken from its productive time
    first, then from its straggler time; its data wait stays a data stall."""
    st, wall, n, jobs, retained = ex.start, ex.wall, ex.n, ex.jobs, ex.retained
    dw, strag = ex.data_wait, ex.straggler
    if hangs:
        hung = np.where(retained, _hung_within(ex, hangs), 0.0)
        work = np.maximum(wall - dw - strag, 0.0)
        strag_cut = np.minimum(strag, np.maximum(hung - work, 0.0))
        hung = np.minimum(hung, work) + strag_cut  # a data wait explains itself: it stays
        strag = strag - strag_cut
        lo, hi = np.clip(st, t0, t1), np.clip(st + wall, t0, t1)
        frac = np.divide(hi - lo, wall, out=np.zeros(n), where=wall > 0)
        tally.seconds["hang"] += float(np.sum(hung * frac))
        ex = Executions(n, st, wall - hung, jobs, retained, dw, strag)
        st, wall = ex.start, ex.wall
    seconds, rework_by_cause = tally.seconds, tally.rework_by_cause
    lo = np.clip(st, t0, t1)
    hi = np.clip(st + wall, t0, t1)
    inside = hi - lo
    frac = np.divide(inside, wall, out=np.zeros(n), where=wall > 0)
    ret = retained & (inside > 0)
    seconds["data_stall"] = float(np.sum((dw * frac)[ret]))
    seconds["straggler"] = float(np.sum((strag * frac)[ret]))
    seconds["productive"] = (
        float(np.sum(inside[ret])) - seconds["data_stall"] - seconds["straggler"]
    )
    rw = ~retained & (inside > 0)
    seconds["rework"] = float(np.sum(inside[rw]))
    if rw.any():
        for j in np.unique(jobs[rw]).tolist():
            key = _REWORK_KEY.get(causes.get(j, "recovery"), "failure")
            rework_by_cause[key] += float(np.sum(inside[rw & (jobs == j)]))
    return float(np.sum(frac[ret]))


def _charge_segments(
    ex: Executions, intervals: list[_Interval], t0: float, t1: float, tally: _Tally
) -> None:
    """Everything else: elementary segments between interval ends, minus the step time in them,
    each charged to the line of highest precedence that covers it (or ``unaccounted``)."""
    st, wall, n = ex.start, ex.wall, ex.n
    clipped = [
        (max(a, t0), min(b, t1), c, p, h) for a, b, c, p, h in intervals if min(b, t1) > max(a, t0)
    ]
    bounds = np.unique(np.array([t0, t1] + [x for a, b, *_ in clipped for x in (a, b)]))
    m = len(bounds) - 1
    if m <= 0:
        return
    cum = np.concatenate([[0.0], np.cumsum(wall)])

    def covered(t: F64) -> F64:
        if n == 0:
            return np.zeros_like(t)
        i = np.searchsorted(st, t, side="right") - 1
        part = np.where(i >= 0, np.clip(t - st[np.maximum(i, 0)], 0.0, wall[np.maximum(i, 0)]), 0)
        return np.asarray(cum[np.maximum(i, 0)] * (i >= 0) + part, dtype=np.float64)

    free = (bounds[1:] - bounds[:-1]) - (covered(bounds[1:]) - covered(bounds[:-1]))
    free = np.maximum(free, 0.0)
    best_prio = np.zeros(m, dtype=np.int64)
    best_cat = np.full(m, _LINES.index("unaccounted"), dtype=np.int64)
    best_held = np.ones(m, dtype=bool)
    # Highest precedence wins; within one level, the earlier line in _LINES.
    for prio in (_PRIO_ATTEMPT, _PRIO_HANG, _PRIO_EXPLICIT):
        for ci in reversed(range(len(_LINES))):
            for held in (True, False):
                sel = [
                    (a, b)
                    for a, b, c, p, h in clipped
                    if p == prio and c == _LINES[ci] and h == held
                ]
                if not sel:
                    continue
                arr = np.array(sel)
                diff = np.zeros(m + 1, dtype=np.int64)
                np.add.at(diff, np.searchsorted(bounds, arr[:, 0]), 1)
                np.add.at(diff, np.searchsorted(bounds, arr[:, 1]), -1)
                cov = np.cumsum(diff)[:m] > 0
                take = cov & (best_prio <= prio)
                best_prio[take], best_cat[take], best_held[take] = prio, ci, held
    for ci, c in enumerate(_LINES):
        sel_c = best_cat == ci
        if sel_c.any():
            line, _, why = c.partition(":")
            tally.seconds[line] += float(np.sum(free[sel_c]))
            tally.unheld[line] += float(np.sum(free[sel_c & ~best_held]))
            if why:
                tally.rework_by_cause[why] += float(np.sum(free[sel_c]))


def breakdown(
    steps: StepArrays,
    events: Iterable[Event],
    window: tuple[float, float] | None = None,
    tolerance: float = 0.01,
    hang_rule: HangRule | None = _HANG_RULE,
    held_only: bool = False,
) -> Breakdown:
    """Partition the run's wall-clock (or ``window``) into the lines of :data:`CATEGORIES`.
    ``hang_rule`` finds steps held open by a hang (None: step time is never a hang).
    ``held_only``: the window is cut to the run's own span (its first attempt's start to its
    last one's end), the time it held its GPUs in it; an empty cut is an empty breakdown."""
    evs = sorted(events, key=lambda e: e.time)
    ex = read_executions(steps)
    attempts = read_attempts(ex, evs)
    explicit, hangs, checkpoints = _explicit(evs)
    first = min(attempts.starts) if attempts.starts else 0.0
    last = max(attempts.ends) if attempts.ends else first
    if window is None:
        t0, t1 = first, last
    else:
        t0, t1 = float(window[0]), float(window[1])
        if t1 < t0:
            raise ConfigError(f"window ends ({t1}) before it starts ({t0})")
        if held_only:
            t0, t1 = max(t0, first), min(t1, last)
            t1 = max(t0, t1)

    intervals, causes = _attempt_intervals(attempts)
    intervals += _hang_intervals(hangs, ex, attempts, t0, t1)
    intervals += [(a, b, c, _PRIO_EXPLICIT, True) for a, b, c in explicit]

    tally = _Tally()
    hung = [(a, b) for a, b, c in explicit if c == "hang"]
    hung += _stalled_steps(ex, hang_rule) if hang_rule is not None else []
    retained_steps = _charge_steps(ex, t0, t1, causes, tally, hung)
    _charge_segments(ex, intervals, t0, t1, tally)

    interruptions: dict[str, int] = {}
    for j in attempts.names[:-1]:
        interruptions[causes[j]] = interruptions.get(causes[j], 0) + 1
    return Breakdown(
        t0=t0,
        t1=t1,
        seconds=tally.seconds,
        unheld={k: v for k, v in tally.unheld.items() if v > 0},
        rework_by_cause=tally.rework_by_cause,
        retained_steps=retained_steps,
        reworked_executions=int(np.sum(~ex.retained)),
        attempts=len(attempts.names),
        interruptions=interruptions,
        checkpoints=checkpoints,
        tolerance=tolerance,
    )
