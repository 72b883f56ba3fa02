"""Hangs: no step progress for k x the recent step time, and the ranks that did not arrive.

A job is hung when nothing moved for ``max(k * recent step time, floor)``: progress is a step
ending, or a checkpoint beginning or ending (a long synchronous save is not a hang). A gap that
ends in a failure the job reported itself (an XID, an OOM, a preemption) before the threshold is
not a hang either; the caller passes such ends as ``explained_ends``.

The ranks to blame are the ones missing from the stuck collective: in a collective group, the
ranks whose last collective is behind the others' (they never entered the one the others wait
in). :func:`missing_from_groups` does that for our collectives and for PyTorch NCCL flight
recorder dumps alike (:func:`flight_recorder_groups` reads the dumps' dicts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Stall",
    "StuckGroup",
    "find_stalls",
    "flight_recorder_groups",
    "hang_threshold",
    "missing_from_groups",
]

Arr = np.ndarray[Any, Any]


def hang_threshold(recent_step_s: float, k: float = 10.0, floor_s: float = 60.0) -> float:
    step = recent_step_s if np.isfinite(recent_step_s) and recent_step_s > 0 else 0.0
    return max(k * step, floor_s)


@dataclass(frozen=True)
class Stall:
    since: float  # time of the last progress
    detected_at: float  # since + threshold
    until: float  # when the gap ended (next progress, the attempt's end, or now)
    threshold_s: float


def find_stalls(
    progress: Arr, end: float, threshold_s: float, explained_ends: Arr | None = None
) -> list[Stall]:
    """Gaps longer than ``threshold_s`` between progress marks, and after the last one until
    ``end`` (the attempt's end, or now for a running job). A gap with an explained stop (a
    reported failure, a drain) within one threshold of its start is not a stall."""
    p = np.sort(np.asarray(progress, dtype=np.float64))
    p = p[np.isfinite(p)]
    if not len(p):
        return []
    marks = np.append(p, end)
    gaps = np.diff(marks)
    out = []
    for i in np.flatnonzero(gaps > threshold_s).tolist():
        since = float(marks[i])
        if explained_ends is not None and len(explained_ends):
            ex = np.asarray(explained_ends, dtype=np.float64)
            if ((ex >= since - threshold_s) & (ex < since + threshold_s)).any():
                continue
        out.append(Stall(since, since + threshold_s, float(marks[i + 1]), threshold_s))
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
    dumps: dict[int, dict[str, Any]], world: int
) -> tuple[dict[str, dict[int, int]], dict[str, tuple[int, ...]], dict[str, str]]:
    """Turn PyTorch NCCL flight recorder dumps (rank -> parsed dump) into group inputs.

    Groups are named by ``process_group[0]`` (global across ranks; ``pg_id`` is per rank).
    A rank whose dump is missing or empty counts as having entered nothing."""
    last: dict[str, dict[int, int]] = {}
    members: dict[str, tuple[int, ...]] = {}
    ops: dict[str, str] = {}
    for rank in range(world):
        d = dumps.get(rank) or {}
        for cfg in (d.get("pg_config") or {}).values():
            ranks = cfg.get("ranks")
            mem = tuple(int(x) for x in str(ranks).strip("[]").split(",") if x.strip())
            if cfg.get("name") is not None and mem:
                members.setdefault(str(cfg["name"]), mem)
        for e in d.get("entries") or []:
            if e.get("is_p2p"):
                continue
            name = str((e.get("process_group") or [""])[0])
            seq = int(e.get("collective_seq_id", -1))
            g = last.setdefault(name, {})
            if seq > g.get(rank, -1):
                g[rank] = seq
                ops[name] = str(e.get("profiling_name", ""))
    return last, members, ops
