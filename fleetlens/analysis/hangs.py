"""Hangs: the one rule for "this job stopped making progress", and the ranks to blame.

Three places ask whether a job is hung: the analysis loop over stored telemetry
(:mod:`fleetlens.services.analyzer`, each gap between progress marks of an attempt), the alert
engine (:mod:`fleetlens.alerts.engine`, is the run hung now) and the remediation controller
(:mod:`fleetlens.remediation.controller`, are the ranks polling its control channel stuck now).
They all answer with :class:`HangRule` and :func:`hang_verdict` (or :func:`live_hang`, the same
verdict for "now"), so a job is hung by one definition wherever it is looked at:

* **Threshold from the step-time history**: ``max(k x recent step time, floor_s)``, ``k = 10``
  and ``floor_s = 60`` by default; the recent step time is the median of the last
  :data:`RECENT_STEPS` step durations (:func:`recent_step_time`). A fixed timeout (what the
  controller used, ``hang_s``) is either too slow for a 0.3 s step or raises false alarms on a
  90 s one; a multiple of the job's own step time scales with the job, and the floor keeps a
  fast job from being called hung over an evaluation pass, a garbage collection or a slow
  rendezvous. ``hang_s`` is now that floor.
* **Progress** is anything that moves the job forward: a step ending (any rank), a checkpoint
  beginning or ending (a long synchronous save is not a hang), and for the live check a rank's
  position (step, collective sequence) changing. The newest such mark starts the gap; the gap
  ends at the next mark, the attempt's end, or now.
* **Explained stops**: a stop the job or the fleet reported itself (an XID, an OOM, a
  preemption, a drain, a finish) within one threshold of the last progress, before or after it,
  explains the silence: a failure or a drain, not a hang. (The alert engine used "any stop after
  the last step end minus one step"; a drain is written before the job finishes its step and its
  checkpoint, so the analysis loop's one-threshold window is the one that holds for drains.)
  For a live verdict, a stop after the last progress also ends the gap: the job is recovering or
  gone, not hung now.

**The run's own clock, never delivery**: "now" for a job is the newest time its own records
carry (its steps, events and the heartbeats the SDK sends while a process is alive, also when
no step ends), not the server's clock. A sender that lags behind its own timestamps, or an
imported log, has a clock that stops where its data stops: no gap, no hang. A hang is ranks
that are alive and not moving: the clock runs on (heartbeats) while progress stays put.
:func:`behind_ranks` names, from the heartbeats, the ranks the others wait for: the ones at
the earliest position (step, and between steps before inside one), or silent while the others
beat (for several of their heartbeats, at most the hang threshold).

The ranks to blame are the ones missing from the stuck collective: in a collective group, the
ranks whose last collective is behind the others' (they never entered the one the others wait
in). :func:`missing_from_groups` does that for our collectives, for the live positions ranks
report to the controller, and for PyTorch NCCL flight recorder dumps alike
(:func:`flight_recorder_groups` reads the parsed dumps,
:class:`~fleetlens.analysis.flight_recorder_dump.FlightRecorderDump`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .flight_recorder_dump import FlightRecorderDump

__all__ = [
    "MISSED_BEATS",
    "RECENT_STEPS",
    "HangRule",
    "Stall",
    "StuckGroup",
    "behind_ranks",
    "find_stalls",
    "flight_recorder_groups",
    "hang_verdict",
    "live_hang",
    "missing_from_groups",
    "recent_step_time",
]

Arr = np.ndarray[Any, Any]

RECENT_STEPS = 20
"""How many of the newest steps make the "recent step time" a threshold scales with."""


def recent_step_time(durations: ArrayLike) -> float | None:
    """The median of the last :data:`RECENT_STEPS` finite, positive step durations (oldest
    first), or None without any."""
    d = np.asarray(durations, dtype=np.float64)[-RECENT_STEPS:]
    d = d[np.isfinite(d) & (d > 0)]
    return float(np.median(d)) if len(d) else None


@dataclass(frozen=True)
class HangRule:
    """No progress for ``max(k x recent step time, floor_s)`` is a hang."""

    k: float = 10.0
    floor_s: float = 60.0

    def threshold(self, recent_step_s: float | None) -> float:
        step = recent_step_s if recent_step_s is not None and np.isfinite(recent_step_s) else 0.0
        return max(self.k * max(step, 0.0), self.floor_s)


@dataclass(frozen=True)
class Stall:
    since: float  # time of the last progress
    detected_at: float  # since + threshold
    until: float  # when the gap ended (next progress, the attempt's end, or now)
    threshold_s: float


def hang_verdict(
    since: float, until: float, threshold_s: float, stops: Iterable[float] = ()
) -> Stall | None:
    """The gap in progress from ``since`` (the last progress mark) to ``until`` (the next mark,
    the attempt's end, or now): a hang when longer than ``threshold_s`` and not explained by a
    stop within one threshold of ``since``."""
    if until - since <= threshold_s:
        return None
    if any(since - threshold_s <= t < since + threshold_s for t in stops):
        return None
    return Stall(since, since + threshold_s, until, threshold_s)


def live_hang(
    last_progress: float, now: float, threshold_s: float, stops: Iterable[float] = ()
) -> Stall | None:
    """:func:`hang_verdict` for a job that may be hung now: a stop after its last progress
    ended the gap (the job is recovering or gone), so there is no hang going on."""
    stops = list(stops)
    if any(t >= last_progress for t in stops):
        return None
    return hang_verdict(last_progress, now, threshold_s, stops)


def find_stalls(
    progress: Arr, end: float, threshold_s: float, explained_ends: Arr | None = None
) -> list[Stall]:
    """Every gap between progress marks, and after the last one until ``end`` (the attempt's
    end, or now for a running job), that :func:`hang_verdict` calls a hang."""
    p = np.sort(np.asarray(progress, dtype=np.float64))
    p = p[np.isfinite(p)]
    if not len(p):
        return []
    marks = np.append(p, end)
    stops = [] if explained_ends is None else np.asarray(explained_ends, np.float64).tolist()
    out = []
    for i in np.flatnonzero(np.diff(marks) > threshold_s).tolist():
        v = hang_verdict(float(marks[i]), float(marks[i + 1]), threshold_s, stops)
        if v is not None:
            out.append(v)
    return out


@dataclass(frozen=True)
class StuckGroup:
    group: str
    members: tuple[int, ...]
    seq: int  # the collective the others are in
    op: str
    missing: tuple[int, ...]  # members that never entered it


def missing_from_groups(
    last_seq: dict[str, dict[int, int]],
    members: dict[str, tuple[int, ...]],
    ops: dict[str, str] | None = None,
) -> list[StuckGroup]:
    """Per group, the members whose last collective (``last_seq[group][rank]``; absent = none
    recorded) is behind the group's furthest member."""
    out = []
    for g, mem in members.items():
        seqs = last_seq.get(g, {})
        if not seqs:
            continue
        top = max(seqs.values())
        behind = tuple(sorted(r for r in mem if seqs.get(r, -1) < top))
        if behind and len(behind) < len(mem):
            out.append(StuckGroup(g, tuple(sorted(mem)), top, (ops or {}).get(g, ""), behind))
    return out


def flight_recorder_groups(
    dumps: Mapping[int, FlightRecorderDump], world: int
) -> tuple[dict[str, dict[int, int]], dict[str, tuple[int, ...]], dict[str, str]]:
    """Turn PyTorch NCCL flight recorder dumps (rank -> parsed dump) into group inputs.

    Groups are named by ``process_group[0]`` (global across ranks; ``pg_id`` is per rank).
    A rank whose dump is missing or empty counts as having entered nothing."""
    last: dict[str, dict[int, int]] = {}
    members: dict[str, tuple[int, ...]] = {}
    ops: dict[str, str] = {}
    default: set[str] = set()
    for rank in range(world):
        d = dumps.get(rank)
        if d is None:
            continue
        for cfg in d.pg_config.values():
            if cfg.name is not None and cfg.ranks:
                members.setdefault(cfg.name, cfg.ranks)
        for e in d.entries:
            if e.is_p2p:
                continue
            if e.group_desc == "default_pg":
                default.add(e.group)
            g = last.setdefault(e.group, {})
            if e.seq > g.get(rank, -1):
                g[rank] = e.seq
                ops[e.group] = e.op
    # The default group is every rank; PyTorch's gloo dumps leave its name empty in pg_config.
    for name in default - set(members):
        members[name] = tuple(range(world))
    return last, members, ops


def _position(step: int, phase: str) -> int:
    # Inside step n is further than idle after step n - 1, which is further than inside n - 1.
    return 2 * step + (1 if phase in ("idle", "checkpoint") else 0)


MISSED_BEATS = 4
"""A rank that missed this many heartbeats while the others beat is frozen (stopped, swapped
out): SIGSTOP lands anywhere in a step, so its last position says nothing of who waits."""


def behind_ranks(
    beats: dict[int, tuple[float, int, str, float]],
    clock: float,
    threshold_s: float,
    interval_s: float | None = None,
) -> list[int]:
    """From each rank's newest heartbeat ``(time, step, phase, since)``: the ranks the others
    wait for. Ranks silent before ``clock`` while others beat (a frozen process): for longer
    than :data:`MISSED_BEATS` heartbeats (``interval_s``, how often the ranks beat) or than
    ``threshold_s``, whichever is shorter; else the ranks at the earliest position when not all
    are at one."""
    if not beats:
        return []
    quiet = threshold_s if not interval_s else min(threshold_s, MISSED_BEATS * interval_s)
    silent = sorted(r for r, b in beats.items() if clock - b[0] > quiet)
    if silent and len(silent) < len(beats):
        return silent
    pos = {r: _position(b[1], b[2]) for r, b in beats.items()}
    low = min(pos.values())
    behind = sorted(r for r, p in pos.items() if p == low)
    return behind if len(behind) < len(beats) else []
