"""Collectives: who arrived last, and whether a slow collective is a slow rank or the network.

Each rank records when it entered and left a collective on its own clock. A collective ends for
everyone at (nearly) the same moment, so a rank's time inside it is its wait for the last
arrival plus the transfer. That gives a clock-free signal: the rank that spent the *least* time
inside arrived last, and that least time is the transfer itself. Enter timestamps are compared
directly only when the clocks are aligned (``clock_aligned``).

Verdict per collective: ``slow_rank`` when one rank was late and the others waited for it (the
spread of time-inside is large against the transfer); ``slow_network`` when everyone arrived on
time and the transfer itself was longer than the baseline transfer; ``ok`` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .nanstats import nanmin

__all__ = ["CollectiveReport", "analyze_collectives", "transfer_times"]

Arr = np.ndarray[Any, Any]


@dataclass(frozen=True)
class CollectiveReport:
    keys: Arr  # (C,) collective key (e.g. step * 2**20 + seq)
    steps: Arr  # (C,)
    last_rank: Arr  # (C,) rank that arrived last
    transfer_s: Arr  # (C,) time inside for the last arrival
    lateness_s: Arr  # (C,) median time inside - transfer: how long the others waited
    ranks: Arr  # (C,) ranks seen
    verdict: list[str]

    def last_rank_counts(self) -> dict[int, int]:
        """How often each rank arrived last (slow_rank collectives only)."""
        out: dict[int, int] = {}
        for r, v in zip(self.last_rank.tolist(), self.verdict, strict=True):
            if v == "slow_rank":
                out[int(r)] = out.get(int(r), 0) + 1
        return out


def analyze_collectives(
    step: Arr,
    seq: Arr,
    rank: Arr,
    enter: Arr,
    exit_: Arr,
    baseline_transfer_s: float | None = None,
    clock_aligned: bool = False,
    late_factor: float = 1.0,
    slow_factor: float = 1.4,
) -> CollectiveReport:
    """Per collective (``step``, ``seq``): last arrival, transfer, lateness and verdict.

    A collective is ``slow_rank`` when the others waited longer than ``late_factor`` x its
    transfer for one rank; ``slow_network`` when not, and its transfer is over
    ``slow_factor`` x ``baseline_transfer_s`` (default: the median transfer of this input)."""
    step = np.asarray(step, dtype=np.int64)
    key = step * (1 << 20) + np.asarray(seq, dtype=np.int64) % (1 << 20)
    order = np.lexsort((np.asarray(rank), key))
    key, step = key[order], step[order]
    rank = np.asarray(rank)[order]
    inside = (np.asarray(exit_) - np.asarray(enter))[order]
    ent = np.asarray(enter)[order]
    bounds = np.flatnonzero(np.diff(key)) + 1
    starts = np.concatenate(([0], bounds)) if len(key) else np.array([], dtype=np.int64)
    n = len(starts)
    last = np.empty(n, dtype=np.int64)
    transfer = np.empty(n)
    late = np.empty(n)
    count = np.diff(np.concatenate((starts, [len(key)]))) if n else np.array([], dtype=np.int64)
    for i, (a, c) in enumerate(zip(starts.tolist(), count.tolist(), strict=True)):
        seg = inside[a : a + c]
        j = int(np.argmax(ent[a : a + c])) if clock_aligned else int(np.argmin(seg))
        last[i] = rank[a + j]
        transfer[i] = float(seg[j]) if not clock_aligned else float(np.min(seg))
        late[i] = float(np.median(seg)) - transfer[i]
    base = baseline_transfer_s
    if base is None or not np.isfinite(base) or base <= 0:
        base = float(np.median(transfer)) if n else float("nan")
    verdict = []
    for t, lt in zip(transfer.tolist(), late.tolist(), strict=True):
        if lt > late_factor * max(t, 1e-9) and lt > 0.1 * base:
            verdict.append("slow_rank")
        elif t > slow_factor * base:
            verdict.append("slow_network")
        else:
            verdict.append("ok")
    return CollectiveReport(
        key[starts] if n else key,
        step[starts] if n else step,
        last,
        transfer,
        late,
        count,
        verdict,
    )


def transfer_times(comm: Arr) -> Arr:
    """Per step, the transfer time from per-rank ``comm`` (steps x ranks): the least wait.

    The last rank to arrive waits only for the transfer; every other rank waits longer."""
    with np.errstate(all="ignore"):
        out: Arr = nanmin(np.where(np.isfinite(comm), comm, np.nan), axis=1)
    return out
