"""A run's structure in time, read from its per-step rollup and lifecycle events: the step
executions (each clipped to the next one's start; the last execution of a step number retained,
earlier ones reworked) and the job attempts (when each was held, stepped, hit and ended, and what
ended it). :mod:`.breakdown` charges the wall-clock over this structure."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..lifecycle import RELEASES
from .timeline import F64, Event, StepArrays

__all__ = [
    "FAILURE",
    "SIGNAL",
    "START",
    "TERMINAL",
    "UNPLANNED_DRAIN",
    "Attempt",
    "Attempts",
    "Executions",
    "cause_kind",
    "cause_of",
    "read_attempts",
    "read_executions",
]

TERMINAL = RELEASES
FAILURE = {"failure", "exception", "signal", "oom", "nan", "hardware_fault", "hang"}
# The moment a fault (or an eviction) hit: the step in flight then is lost work. ``failure`` is
# not one: it marks when the job was declared failed, so the time up to it is detection.
SIGNAL = {"exception", "signal", "oom", "nan", "hardware_fault", "preemption"}
UNPLANNED_DRAIN = "drain:unplanned"
START = {"job_start", "gang_complete"}


def cause_of(kinds: set[str]) -> str:
    if "preemption" in kinds:
        return "preemption"
    if kinds & {"maintenance", "drain"}:
        return "maintenance"
    if kinds & (FAILURE | {UNPLANNED_DRAIN}):
        return "recovery"
    if "finish" in kinds:
        return "finish"
    return "recovery"


def cause_kind(e: Event, seen: set[str]) -> str:
    """An event's kind for the cause; a drain is maintenance only when it was planned.

    ``attrs.planned = false``, or a drain after a failure signal of the same attempt (a node
    taken out because it failed), is part of the recovery from that failure.
    """
    if e.kind != "drain" or e.attrs.get("planned") is True:
        return e.kind
    if e.attrs.get("planned") is False or seen & FAILURE:
        return UNPLANNED_DRAIN
    return e.kind


@dataclass(frozen=True)
class Executions:
    """Step executions in time order, each clipped to the next one's start so none overlap."""

    n: int
    start: F64
    wall: F64
    jobs: npt.NDArray[Any]
    retained: npt.NDArray[np.bool_]  # the last execution of its step number
    data_wait: F64  # within the execution
    straggler: F64  # slowest rank minus the mean rank, within the execution less its data wait


def read_executions(steps: StepArrays) -> Executions:
    n = len(steps.step)
    start = np.asarray(steps.start, dtype=np.float64)
    order = np.argsort(start, kind="stable")
    st = start[order]
    wall = np.maximum(np.asarray(steps.end, np.float64)[order] - st, 0.0)
    if n > 1:
        wall[:-1] = np.minimum(wall[:-1], np.maximum(st[1:] - st[:-1], 0.0))
    step_no = np.asarray(steps.step)[order]
    jobs = np.asarray(steps.job_id).astype(str)[order] if n else np.zeros(0, dtype=str)
    # The retained execution of a step number is its last one; earlier ones were reworked.
    retained = np.zeros(n, dtype=bool)
    if n:
        by_step = np.lexsort((st, step_no))
        last = np.r_[step_no[by_step][1:] != step_no[by_step][:-1], True]
        retained[by_step[last]] = True
    dw = np.zeros(n) if steps.data_wait is None else np.asarray(steps.data_wait, np.float64)[order]
    dw = np.clip(np.nan_to_num(dw, nan=0.0), 0.0, wall)
    strag = (
        np.asarray(steps.max_compute, np.float64)[order]
        - np.asarray(steps.mean_compute, np.float64)[order]
    )
    strag = np.clip(np.nan_to_num(strag, nan=0.0), 0.0, wall - dw)
    return Executions(n, st, wall, jobs, retained, dw, strag)


@dataclass
class Attempt:
    held: float | None = None  # its first job_start / gang_complete
    first: float | None = None  # its first step's start
    last: float | None = None  # its last step's end
    end: float | None = None  # its last terminal event
    kinds: set[str] = field(default_factory=set)
    hit: list[float] = field(default_factory=list)  # fault signals

    @property
    def start(self) -> float:
        cands = [x for x in (self.held, self.first) if x is not None]
        return min(cands) if cands else math.inf


class Attempts:
    """The run's attempts (one per job id) that started, in time order."""

    def __init__(self, by_job: dict[str, Attempt]) -> None:
        self.by_job = by_job
        self.names = sorted(
            (j for j in by_job if by_job[j].start < math.inf), key=lambda j: by_job[j].start
        )
        self.starts = [by_job[j].start for j in self.names]
        self.ends: list[float] = []  # set once the events are read

    def owner(self, e: Event) -> str | None:
        """The attempt an event belongs to: its job's, else the one running at its time."""
        if e.job_id in self.by_job and self.by_job[e.job_id].start < math.inf:
            return e.job_id
        k = int(np.searchsorted(self.starts, e.time, side="right")) - 1
        return self.names[k] if k >= 0 else (self.names[0] if self.names else None)


def read_attempts(ex: Executions, evs: list[Event]) -> Attempts:
    """Attempts: their held start, first step, last step end, end and what ended them."""
    job_names = list(dict.fromkeys(ex.jobs.tolist()))
    for e in evs:
        if e.job_id and e.job_id not in job_names and (e.kind in START or e.kind in TERMINAL):
            job_names.append(e.job_id)
    att = {j: Attempt() for j in job_names}
    if ex.n:
        uj, inv = np.unique(ex.jobs, return_inverse=True)
        first = np.full(len(uj), np.inf)
        np.minimum.at(first, inv, ex.start)
        last_end = np.full(len(uj), -np.inf)
        np.maximum.at(last_end, inv, ex.start + ex.wall)
        for k, j in enumerate(uj.tolist()):
            att[j].first, att[j].last = float(first[k]), float(last_end[k])
    for e in evs:
        if e.job_id in att and e.kind in START:
            a = att[e.job_id]
            a.held = e.time if a.held is None else min(a.held, e.time)
    attempts = Attempts(att)
    for e in evs:
        j = attempts.owner(e)
        if j is not None:
            a = att[j]
            a.kinds.add(cause_kind(e, a.kinds))
            if e.kind in SIGNAL:
                a.hit.append(e.time)
            if e.kind in TERMINAL:
                a.end = e.time if a.end is None else max(a.end, e.time)
    attempts.ends = [
        max(x for x in (a.last, a.end, a.held) if x is not None)
        for a in (att[j] for j in attempts.names)
    ]
    return attempts
