"""Straggler detection: each rank's episodes of slowness, step by step.

In a synchronous job every rank's step lasts as long as the slowest's, so a slow rank shows in
its *compute* time (forward + backward + optimizer), not in its duration. Everything here works
on a (steps x ranks) matrix of compute times, normalized by each step's median (``x``).

Detection is a one-sided CUSUM per rank: ``C = clip(C + min((x - 1) / sigma, cap) - k, 0,
cmax)``; a rank is flagged when ``C >= h``. ``sigma`` is the *temporal* noise of the job: the
robust spread (1.4826 x MAD / sqrt 2) across ranks of each rank's step-to-step change of ``x``,
the median over the last ``sigma_steps`` steps. Ranks that are always a little faster or slower
than the median (real jobs have them: the Alibaba PAI traces) do not inflate it. A rank whose
evidence reaches ``h`` while it is on average less than ``min_slowdown`` slower starts over from
0, so a rank that is 2% slow for good never piles up evidence that would date a later, real
slowdown from the run's start. With k = 2.5, h = 6 and
cap = 6 one outlier step never flags a rank and a 5-sigma slowdown is flagged on its third step.
An episode runs from the step its evidence began to the step ``C`` falls back to 0; one whose
mean slowdown falls under ``min_slowdown`` is dropped (the rank starts over).

A slowdown under ``k`` sigma (11 % in 5 % noise: generated fleets 161 and 195) never piles up
evidence in that lane, however long it lasts. A second, *slow lane* watches each rank that has
no open episode with ``k_slow`` = 1.25 and ``h_slow`` = 12: a 2.2-sigma slowdown is flagged in
about 12 steps, dated from where its evidence began, while one outlier step (at most 4.75) or
two never reach it, nor healthy Gaussian noise in any run length one would record (its false
alarm rate is of the order of e^-33 per rank-step). An episode it opens is held open while
its C (capped at ``h_slow`` / 2, so that it lets go within about 5 steps of the slowdown's
end, as the fast lane does) stays above 0, and is *faint* until the fast lane's evidence also
reaches ``h``: the classification does not tell a moving straggler from faint episodes (see
:mod:`fleetlens.analysis.stragglers`).

Everything carried from step to step (both lanes' C, the previous ``x``, the noise of the last
steps) is in
:class:`RankState`, and a step's result depends only on that step and the state: the same steps
give the same episodes whatever the windows they were cut into (the analyzer feeds only complete
steps, in order; see ``services/analyzer.py``).

The episodes are classified in :mod:`fleetlens.analysis.stragglers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

import msgspec
import numpy as np

from .nanstats import nanmedian

__all__ = [
    "CusumParams",
    "Episode",
    "GapRank",
    "LiveRank",
    "RankState",
    "RankStateDoc",
    "SlowRank",
    "open_episodes",
    "robust_sigma",
    "scan_stragglers",
]

Arr = np.ndarray[Any, Any]


@dataclass(frozen=True)
class CusumParams:
    k: float = 2.5
    h: float = 6.0
    cap: float = 6.0
    cmax: float = 12.0
    min_slowdown: float = 0.05
    sigma_floor: float = 0.003
    sigma_steps: int = 64  # the noise estimate is the median over this many recent steps
    # the slow lane: a lasting slowdown under k sigma (a 10-15% slow rank in 5% noise)
    k_slow: float = 1.25
    h_slow: float = 12.0


@dataclass
class Episode:
    """A rank slower than its peers from ``start`` to ``end`` (steps; ``end`` -1 = ongoing)."""

    rank: int
    start: int
    detected: int
    end: int
    slowdown: float  # mean (compute / step median) - 1 over the episode
    steps: int
    # mean (compute / step median) - 1 of the rank's steps since its previous episode ended,
    # before this one's evidence began (None: its first episode, or no step measured between)
    before: float | None = None
    faint: bool = False  # only the slow lane saw it (see :func:`scan_stragglers`)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RankState:
    """Everything carried from one step to the next (one job attempt)."""

    c: Arr
    since: Arr  # step at which C last left 0, -1 if C is 0
    alarm: Arr  # step of the alarm of the open episode, -1 if none
    excess: Arr  # sum of (x - 1) since ``since``
    count: Arr
    episodes: list[Episode] = field(default_factory=list)
    prev: Arr = field(default_factory=lambda: np.empty(0))  # last x seen per rank (NaN: none)
    noise: list[float] = field(default_factory=list)  # per-step temporal spread, newest last
    # Between a rank's episodes: sum of (x - 1) and steps since its last episode ended
    # (``gap_count`` -1: not between episodes), and the open episode's ``before``.
    gap_excess: Arr = field(default_factory=lambda: np.empty(0))
    gap_count: Arr = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    before: Arr = field(default_factory=lambda: np.empty(0))
    # The slow lane's evidence while no episode is open: C, where it began, sum of (x - 1), steps.
    c_slow: Arr = field(default_factory=lambda: np.empty(0))
    since_slow: Arr = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    excess_slow: Arr = field(default_factory=lambda: np.empty(0))
    count_slow: Arr = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    # the open episode: 0 opened by the fast lane (or none), 1 by the slow lane (faint), 2 by
    # the slow lane and the fast lane's evidence has reached h since
    opened: Arr = field(default_factory=lambda: np.empty(0, dtype=np.int8))

    @classmethod
    def fresh(cls, world: int) -> RankState:
        z = np.zeros(world)
        m = np.full(world, -1, dtype=np.int64)
        return cls(
            z.copy(),
            m.copy(),
            m.copy(),
            z.copy(),
            np.zeros(world, dtype=np.int64),
            prev=np.full(world, np.nan),
            gap_excess=z.copy(),
            gap_count=m.copy(),
            before=np.full(world, np.nan),
            c_slow=z.copy(),
            since_slow=m.copy(),
            excess_slow=z.copy(),
            count_slow=np.zeros(world, dtype=np.int64),
            opened=np.zeros(world, dtype=np.int8),
        )

    def to_doc(self) -> RankStateDoc:
        """The state as the analysis cursor keeps it (the newest 500 episodes)."""
        live = np.flatnonzero((self.c > 0) | (self.since >= 0))
        return RankStateDoc(
            world=len(self.c),
            live={
                int(r): LiveRank(
                    float(self.c[r]),
                    int(self.since[r]),
                    int(self.alarm[r]),
                    float(self.excess[r]),
                    int(self.count[r]),
                    int(self.opened[r]),
                )
                for r in live
            },
            episodes=self.episodes[-500:],
            # exact floats (JSON keeps them), None for a rank not seen yet
            prev=[None if not np.isfinite(v) else float(v) for v in self.prev],
            noise=[float(v) for v in self.noise],
            gap={
                int(r): GapRank(float(self.gap_excess[r]), int(self.gap_count[r]))
                for r in np.flatnonzero(self.gap_count >= 0)
            },
            before={
                int(r): float(self.before[r])
                for r in np.flatnonzero(np.isfinite(self.before) & (self.alarm >= 0))
            },
            slow={
                int(r): SlowRank(
                    float(self.c_slow[r]),
                    int(self.since_slow[r]),
                    float(self.excess_slow[r]),
                    int(self.count_slow[r]),
                )
                for r in np.flatnonzero(self.c_slow > 0)
            },
        )

    @classmethod
    def from_doc(cls, d: RankStateDoc, world: int) -> RankState:
        """The state a cursor kept, over at least ``world`` ranks."""
        st = cls.fresh(max(world, d.world))
        n = len(st.c)
        for i, lv in d.live.items():
            if 0 <= i < n:
                st.c[i], st.since[i], st.alarm[i] = lv.c, lv.since, lv.alarm
                st.excess[i], st.count[i], st.opened[i] = lv.excess, lv.steps, lv.opened
        st.episodes = [replace(e) for e in d.episodes]
        prev = [np.nan if v is None else v for v in d.prev][:n]
        st.prev[: len(prev)] = prev
        st.noise = list(d.noise)
        for i, g in d.gap.items():
            if 0 <= i < n:
                st.gap_excess[i], st.gap_count[i] = g.excess, g.steps
        for i, v in d.before.items():
            if 0 <= i < n:
                st.before[i] = v
        for i, sl in d.slow.items():
            if 0 <= i < n:
                st.c_slow[i], st.since_slow[i] = sl.c, sl.since
                st.excess_slow[i], st.count_slow[i] = sl.excess, sl.steps
        return st

    def to_json(self) -> dict[str, Any]:
        """:meth:`to_doc` as JSON values."""
        out: dict[str, Any] = msgspec.to_builtins(self.to_doc(), enc_hook=_number)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], world: int) -> RankState:
        """The state from its stored JSON (:meth:`to_doc`, as JSON values)."""
        return cls.from_doc(msgspec.convert(d, type=RankStateDoc, strict=False), world)


def _number(value: object) -> object:
    if isinstance(value, np.generic):  # a step number or value of a numpy array
        return value.item()
    raise NotImplementedError(f"{type(value).__name__} is not part of a straggler state")


class LiveRank(NamedTuple):
    """A rank's CUSUM while it is above 0 or its episode is open (stored as an array)."""

    c: float
    since: int
    alarm: int
    excess: float
    steps: int
    opened: int = 0


class GapRank(NamedTuple):
    """Between a rank's episodes: the sum of (x - 1) and the steps since its last one ended."""

    excess: float
    steps: int


class SlowRank(NamedTuple):
    """The slow lane's evidence of a rank while no episode is open."""

    c: float
    since: int
    excess: float
    steps: int


class RankStateDoc(msgspec.Struct):
    """:class:`RankState` as the analysis cursor keeps it between passes: per rank (by rank
    number) what is not at rest, the episodes, each rank's last value and the recent noise."""

    world: int = 0
    live: dict[int, LiveRank] = msgspec.field(default_factory=dict)
    episodes: list[Episode] = msgspec.field(default_factory=list)
    prev: list[float | None] = msgspec.field(default_factory=list)
    noise: list[float] = msgspec.field(default_factory=list)
    gap: dict[int, GapRank] = msgspec.field(default_factory=dict)
    before: dict[int, float] = msgspec.field(default_factory=dict)
    slow: dict[int, SlowRank] = msgspec.field(default_factory=dict)


_PER_RANK = ("c", "since", "alarm", "excess", "count", "prev", "gap_excess", "gap_count", "before",
             "c_slow", "since_slow", "excess_slow", "count_slow", "opened")  # fmt: skip
"""The per-rank arrays of :class:`RankState`."""


def robust_sigma(x: Arr, floor: float) -> float:
    """Pooled robust spread of normalized compute: median over steps of 1.4826 * MAD."""
    dev = np.abs(x - 1.0)
    mad = nanmedian(dev, axis=1)
    s = 1.4826 * float(nanmedian(mad)) if np.isfinite(mad).any() else floor
    return max(s, floor)


def _step_noise(d: Arr) -> float:
    """Robust spread across ranks of one step's change of ``x`` (NaN if under 2 ranks)."""
    d = d[np.isfinite(d)]
    if len(d) < 2:
        return float("nan")
    return 1.4826 * float(np.median(np.abs(d - np.median(d)))) / 1.4142135623730951


# A window of fewer steps than this (a live pass) goes step by step, as does one of _WIDE ranks
# or more (where numpy's nanmedian goes row by row anyway): whole-window arrays would cost more
# than they save (the 16k-rank step 1.5 ms either way).
_BY_ROW = 8
_WIDE = 600


def _step_noises(x: Arr, prev: Arr) -> Arr:
    """:func:`_step_noise` of each row of ``x`` (a step), each rank's change from its last
    value before that step (``prev`` before the first row), the same whichever way it goes."""
    n, w = x.shape
    if n < _BY_ROW or w >= _WIDE:
        out, last = np.empty(n), prev.copy()
        for i in range(n):
            out[i] = _step_noise(x[i] - last)
            ok = np.isfinite(x[i])
            last[ok] = x[i][ok]
        return out
    seen = np.where(np.isfinite(x), np.arange(1, n + 1)[:, None], 0)
    np.maximum.accumulate(seen, axis=0, out=seen)  # the row of each rank's last value, 0: prev
    rows = np.vstack([np.zeros((1, w), np.int64), seen[:-1]])  # each step's, before it
    last = np.vstack([prev[None, :], x])[rows, np.arange(w)]
    with np.errstate(invalid="ignore"):
        d = x - last
    d[~np.isfinite(d)] = np.nan
    out = np.full(n, np.nan)
    two = np.isfinite(d).sum(axis=1) >= 2
    if two.any():
        d = d[two]
        dev = np.abs(d - nanmedian(d, axis=1)[:, None])
        out[two] = 1.4826 * nanmedian(dev, axis=1) / 1.4142135623730951
    return out


def _noise_medians(noise: list[float], spreads: Arr, span: int) -> tuple[Arr, list[float]]:
    """The median of the last ``span`` of ``noise`` then ``spreads`` (the finite ones, in
    order) at each row, NaN while there is none; and the list's last ``span`` after them all."""
    if len(spreads) < _BY_ROW:
        kept, meds = list(noise), np.full(len(spreads), np.nan)
        for i, v in enumerate(spreads.tolist()):
            if np.isfinite(v):
                kept.append(v)
                del kept[:-span]
            if kept:
                meds[i] = np.median(kept)
        return meds, kept
    fin = np.isfinite(spreads)
    seq = np.concatenate([np.asarray(noise, np.float64), spreads[fin]])
    ends = len(noise) + np.cumsum(fin)  # the sequence's length after each row
    meds = np.full(len(seq) + 1, np.nan)  # meds[e]: the median of the span before e
    full = span if len(seq) >= span else len(seq) + 1
    for e in range(max(int(ends.min(initial=len(seq) + 1)), 1), full):
        meds[e] = np.median(seq[:e])
    if len(seq) >= span:
        first = max(span, int(ends.min(initial=span)))
        win = np.lib.stride_tricks.sliding_window_view(seq, span)[first - span :]
        meds[first:] = np.median(win, axis=1)
    return meds[ends], seq[-span:].tolist()


def scan_stragglers(
    steps: Arr, compute: Arr, state: RankState, params: CusumParams = CusumParams()
) -> RankState:
    """Advance the per-rank CUSUM over consecutive steps; episodes land in the state.

    Each step's update depends only on that step's row and the state, so cutting the same
    steps into other windows gives the same state."""
    if compute.size == 0:
        return state
    w = len(state.c)
    if compute.shape[1] > w:  # more ranks than the state knew: grow it
        grown = RankState.fresh(compute.shape[1])
        for a in _PER_RANK:
            getattr(grown, a)[:w] = getattr(state, a)
        grown.episodes, grown.noise = state.episodes, state.noise
        state = grown
    elif compute.shape[1] < w:  # ranks the window did not report: not measured
        pad = np.full((compute.shape[0], w - compute.shape[1]), np.nan)
        compute = np.hstack([compute, pad])
    with np.errstate(invalid="ignore", divide="ignore"):
        med = nanmedian(compute, axis=1) if np.isfinite(compute).any() else compute[:, 0]
        x = compute / med[:, None]
    p = params
    c, since, alarm, excess, count = state.c, state.since, state.alarm, state.excess, state.count
    prev, noise = state.prev, state.noise
    gx, gn, before = state.gap_excess, state.gap_count, state.before
    c2, since2, opened = state.c_slow, state.since_slow, state.opened
    excess2, count2 = state.excess_slow, state.count_slow
    # each step's noise is the median of the spreads of the last sigma_steps changes measured
    sigmas, state.noise[:] = _noise_medians(noise, _step_noises(x, prev), p.sigma_steps)
    for i, s in enumerate(steps.tolist()):
        xi = x[i]
        ok = np.isfinite(xi)
        if not ok.any():
            continue  # a step no rank measured carries no evidence
        if np.isfinite(sigmas[i]):
            sigma = max(float(sigmas[i]), p.sigma_floor)
        else:  # the first step: no change to measure yet, its spread across ranks stands in
            sigma = robust_sigma(xi[None, :], p.sigma_floor)
        prev[ok] = xi[ok]
        xr = np.where(ok, xi - 1.0, 0.0)
        # a rank not measured this step keeps its evidence: silence is not health
        c[ok] += np.minimum(xr[ok] / sigma, p.cap) - p.k
        np.clip(c, 0.0, p.cmax, out=c)
        # The slow lane: a lasting slowdown under k sigma, watched while the rank has no open
        # episode. It opens one (faint) from where its evidence began when that reaches h_slow
        # and holds it while it stays above 0 (capped at h_slow / 2, so that it lets go within
        # a few steps of the slowdown's end, as the fast lane does).
        lane = ok & ((alarm < 0) | (opened > 0))
        c2[lane] += np.minimum(xr[lane] / sigma, p.cap) - p.k_slow
        c2[(alarm >= 0) & (opened == 0)] = 0.0
        np.clip(c2, 0.0, np.where(alarm >= 0, p.h_slow / 2, p.h_slow), out=c2)
        pos = c > 0
        held = pos | ((c2 > 0) & (opened > 0))
        starting = pos & (since < 0)
        since[starting] = s
        excess[held & ok] += xr[held & ok]
        count[held & ok] += 1
        idle2 = (c2 > 0) & (alarm < 0)
        since2[idle2 & (since2 < 0)] = s
        excess2[idle2 & ok] += xr[idle2 & ok]
        count2[idle2 & ok] += 1
        since2[~idle2], excess2[~idle2], count2[~idle2] = -1, 0.0, 0
        between = ok & (gn >= 0) & (alarm < 0)
        gx[between] += xr[between]
        gn[between] += 1
        opened[(c >= p.h) & (opened == 1)] = 2  # a faint episode the fast lane sees too
        hit = np.flatnonzero((c >= p.h) & (alarm < 0))
        for r in hit.tolist():
            if excess[r] / max(count[r], 1) >= p.min_slowdown:
                _open(state, r, s)
            else:  # significant but too small to matter: start the evidence over
                c[r], since[r], excess[r], count[r] = 0.0, -1, 0.0, 0
        for r in np.flatnonzero((c2 >= p.h_slow) & (alarm < 0)).tolist():
            if excess2[r] / max(count2[r], 1) >= p.min_slowdown:
                since[r], excess[r], count[r] = since2[r], excess2[r], count2[r]
                _open(state, r, s)
                c2[r], held[r], opened[r] = p.h_slow / 2, True, 1
            else:
                c2[r] = 0.0
            since2[r], excess2[r], count2[r] = -1, 0.0, 0
        # An episode whose slowdown fell under the minimum was noise on a slightly slow rank.
        weak = np.flatnonzero((alarm >= 0) & held & (excess < p.min_slowdown * count))
        for r in weak.tolist():
            c[r], since[r], alarm[r], excess[r], count[r] = 0.0, -1, -1, 0.0, 0
            c2[r], opened[r] = 0.0, 0
            # between episodes again, the gap measured afresh
            gx[r], gn[r], before[r] = 0.0, 0 if np.isfinite(before[r]) else -1, np.nan
        ended = np.flatnonzero(~held & (since >= 0))
        for r in ended.tolist():
            if alarm[r] >= 0 and excess[r] >= p.min_slowdown * count[r]:
                n = int(count[r])
                b = float(before[r]) if np.isfinite(before[r]) else None
                state.episodes.append(
                    Episode(
                        r,
                        int(since[r]),
                        int(alarm[r]),
                        s - 1,
                        float(excess[r] / n),
                        n,
                        b,
                        bool(opened[r] == 1),
                    )
                )
                gx[r], gn[r], before[r] = 0.0, 0, np.nan
            since[r], alarm[r], excess[r], count[r], opened[r] = -1, -1, 0.0, 0, 0
    return state


def _open(state: RankState, r: int, s: int) -> None:
    """Rank ``r``'s episode is flagged at step ``s``; the gap before it is what came before its
    evidence began."""
    gx, gn, count = state.gap_excess, state.gap_count, state.count
    state.alarm[r] = s
    n = int(gn[r] - count[r]) if gn[r] >= 0 else 0
    state.before[r] = (gx[r] - state.excess[r]) / n if n > 0 else np.nan
    gx[r], gn[r] = 0.0, -1


def open_episodes(state: RankState) -> list[Episode]:
    """Episodes still running at the end of the last window (``end`` = -1)."""
    return [
        Episode(
            int(r),
            int(state.since[r]),
            int(state.alarm[r]),
            -1,
            float(state.excess[r] / max(state.count[r], 1)),
            int(state.count[r]),
            float(state.before[r]) if np.isfinite(state.before[r]) else None,
            bool(state.opened[r] == 1),
        )
        for r in np.flatnonzero(state.alarm >= 0).tolist()
    ]
