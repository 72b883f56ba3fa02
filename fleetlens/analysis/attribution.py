"""What each finding cost: the breakdown's loss lines split over the findings that explain them.

A run's breakdown (:mod:`.breakdown`) says how many seconds went to each loss line; a finding
says what went wrong, where and over which steps. This module charges every second of every
loss line to at most one finding, so that per line the findings' seconds plus an
``unattributed`` remainder equal the breakdown's seconds exactly:

- **Step lines** (``straggler``, ``data_stall``): the line is spread over the retained steps in
  proportion to each step's raw amount (the slowest rank's compute above the mean rank's; the
  step's input wait), as the breakdown charges them. A step's share goes to the finding of the
  matching kind whose step window covers it; where several cover one step, to the most severe
  (largest ratio of its first evidence value to its baseline, else highest confidence): a
  synchronous step waits for its slowest rank, so one cause sets its straggler time.
  Straggler and rank slowdown findings explain ``straggler``; data stall findings ``data_stall``.
- **Interruption lines**: ``recovery``, ``hang`` and the failures' share of ``rework`` go to the
  failure and hang findings; ``preemption`` and its share of ``rework`` to preemption findings;
  ``checkpoint`` to checkpoint findings; each split equally among the findings that match.
- ``startup``, ``maintenance``, ``evaluation``, ``unaccounted`` (and any line no finding
  matches) stay ``unattributed``.

A finding's cost in GPU-hours is its seconds times the run's devices; in goodput points, its
seconds as a share of the breakdown's wall-clock (the breakdown table's "share" column), times
100. Pure functions: arrays and rows in, a small result out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .breakdown import CATEGORIES, Breakdown
from .evidence import Evidence

__all__ = ["LOSS_LINES", "Attribution", "FindingWindow", "attribute", "slows_steps"]

LOSS_LINES = tuple(c for c in CATEGORIES if c != "productive")
STEP_LINES = ("straggler", "data_stall")


@dataclass(frozen=True)
class FindingWindow:
    """What attribution reads of a finding."""

    key: str
    kind: str  # straggler | slowdown | hang | failure | event
    diagnosis: str
    start_step: int
    end_step: int | None  # None: ongoing
    severity: float


def _data(diagnosis: str) -> bool:
    return "data_stall" in diagnosis or diagnosis.startswith("data")


def _is_data(f: FindingWindow) -> bool:
    return _data(f.diagnosis)


def slows_steps(kind: str, diagnosis: str) -> bool:
    """A finding of ranks computing or communicating slowly (not waiting for data)."""
    return kind in ("straggler", "slowdown") and not _data(diagnosis)


def _is_straggler(f: FindingWindow) -> bool:
    return slows_steps(f.kind, f.diagnosis)


def _is_failure(f: FindingWindow) -> bool:
    return f.kind in ("failure", "hang") and "preemption" not in f.diagnosis


def _has(word: str) -> Callable[[FindingWindow], bool]:
    return lambda f: word in f.diagnosis


_STEP_MATCH: dict[str, Callable[[FindingWindow], bool]] = {
    "straggler": _is_straggler,
    "data_stall": _is_data,
}
_EVENT_MATCH: dict[str, Callable[[FindingWindow], bool]] = {
    "recovery": _is_failure,
    "hang": _is_failure,
    "rework:failure": _is_failure,
    "preemption": _has("preemption"),
    "rework:preemption": _has("preemption"),
    "checkpoint": _has("checkpoint"),
}


@dataclass(frozen=True)
class Attribution:
    """Seconds per loss line of each finding (by key) and of nothing (``unattributed``)."""

    by_finding: dict[str, dict[str, float]]
    unattributed: dict[str, float]

    def total(self, key: str) -> float:
        return sum(self.by_finding.get(key, {}).values())


def severity(evidence: Sequence[Evidence], confidence: float) -> float:
    """A finding's first evidence value over its baseline (1.15: 15% slower), else confidence."""
    for e in evidence:
        v, b = e.get("value"), e.get("baseline")
        if isinstance(v, (int, float)) and isinstance(b, (int, float)) and b > 0:
            return float(v) / float(b)
    return confidence


def _rework_parts(bd: Breakdown) -> dict[str, float]:
    """The rework line split by cause, in proportion to ``rework_by_cause`` (all of it to
    failures when no cause is recorded)."""
    total = bd.seconds.get("rework", 0.0)
    causes = {k: max(0.0, v) for k, v in bd.rework_by_cause.items()}
    known = sum(causes.values())
    if known <= 0:
        return {"rework:failure": total}
    return {f"rework:{k}": total * v / known for k, v in causes.items()}


def attribute(
    findings: Sequence[FindingWindow],
    bd: Breakdown,
    step: npt.NDArray[np.int64],
    raw: dict[str, npt.NDArray[np.float64]],
) -> Attribution:
    """Split ``bd``'s loss lines over ``findings``. ``step`` holds the retained steps (one per
    step, its latest execution) and ``raw`` each step line's raw amount per step."""
    by: dict[str, dict[str, float]] = {f.key: {} for f in findings}
    rest: dict[str, float] = {}

    def charge(key: str | None, line: str, seconds: float) -> None:
        if seconds == 0.0:
            return
        into = rest if key is None else by[key]
        into[line] = into.get(line, 0.0) + seconds

    last = int(step[-1]) if len(step) else 0
    for line in STEP_LINES:
        total = bd.seconds.get(line, 0.0)
        w = np.clip(np.nan_to_num(raw.get(line, np.zeros(len(step))), nan=0.0), 0.0, None)
        if total == 0.0 or not len(step) or float(w.sum()) <= 0.0:
            charge(None, line, total)
            continue
        share = w * (total / float(w.sum()))
        owner = np.full(len(step), -1)
        cands = [f for f in findings if _STEP_MATCH[line](f)]
        cands.sort(key=lambda f: -f.severity)
        for i, f in enumerate(cands):
            hi = last if f.end_step is None or f.end_step < 0 else f.end_step
            owner[(step >= f.start_step) & (step <= hi) & (owner < 0)] = i
        sums = np.bincount(owner + 1, weights=share, minlength=len(cands) + 1)
        charge(None, line, total - float(sums[1:].sum()))  # exact: no rounding drift
        for i, f in enumerate(cands):
            charge(f.key, line, float(sums[i + 1]))

    parts = {k: bd.seconds.get(k, 0.0) for k in LOSS_LINES if k not in STEP_LINES}
    parts.pop("rework", None)
    parts.update(_rework_parts(bd))
    for part, seconds in parts.items():
        line = part.split(":")[0]
        match = _EVENT_MATCH.get(part)
        cands = [f for f in findings if match is not None and match(f)]
        if not cands:
            charge(None, line, seconds)
            continue
        for f in cands:
            charge(f.key, line, seconds / len(cands))
    return Attribution(by, rest)
