"""Per-step rank statistics and straggler detection and classification.

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

Everything carried from step to step (C, the previous ``x``, the noise of the last steps) is in
:class:`RankState`, and a step's result depends only on that step and the state: the same steps
give the same episodes whatever the windows they were cut into (the analyzer feeds only complete
steps, in order; see ``services/analyzer.py``).

Classification of the run's episodes (:func:`classify_episodes`), on evidence that holds on real
data: ranks that are slow mostly *alone*, none holding most of the flagged steps, 3 or more of
them -> ``straggler.moving`` (the slow rank keeps changing: data skew); so are two ranks slow
in one short spell each, the second from where the first recovered, with at most two other
ranks slow then (two turns seen, the others hidden by a slower rank or too faint), known when
the second is flagged. "Alone" does not count a rank flagged for 3 times the median of the
ranks' flagged steps or more and not slow together with another such rank (their onsets within
a tenth of the shorter one's span): it is a straggler of its own, slow while the others take
turns, never a mover; nor a rank slow in 3 or more spells (an intermittent straggler). Nor is
a rank slow in 3 or more separate spells, more than twice the movers' usual
count plus one: the slow rank of a moving straggler comes back to a rank only after its turns
on the others, so that rank is an intermittent straggler beside it. A rank slow in one short
episode (no more flagged steps than a mover) within the movers' span is a mover too: a turn
seen at a handover, where its episode overlaps the next. A rank whose first episode began as a
turn (at a handover) and went on after the slow rank moved on is dated from where it moved on.
Otherwise per rank, its episodes merged across short gaps and across gaps in which it stayed
at least half as slow as the episodes either side (its mean ``x - 1`` between them, carried in
the state: a small slowdown in real noise lets the evidence lapse; an intermittent straggler's
gaps are healthy): one, or flagged for at least
``persistent_cover`` of the span from its first onset to its last episode's end (in steps, a
step replayed by a restart counted once) -> ``straggler.persistent``; else
``straggler.intermittent``. A rank slow once for fewer than ``passing_steps`` and healthy again
is marked ``passing``: a spell that passed by itself (in the generated scenarios, a moving
straggler's turn or one episode of an intermittent one), which the analyzer does not report as
a persistent straggler.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "CusumParams",
    "Episode",
    "RankState",
    "StepStats",
    "StragglerClass",
    "classify_episodes",
    "open_episodes",
    "robust_sigma",
    "scan_stragglers",
    "step_stats",
    "window_step_stats",
]

Arr = np.ndarray[Any, Any]


@dataclass(frozen=True)
class StepStats:
    """One step across ranks. ``spread`` = (max - median) / median; ``ratio`` = max / median;
    ``wait_s``: what the job lost to its slowest rank (max - second largest)."""

    max: float
    median: float
    p95: float
    p99: float
    spread: float
    ratio: float
    slowest: int
    wait_s: float


def step_stats(compute: Arr) -> StepStats:
    """Statistics of one step from its ranks' compute times (NaN = rank not reported)."""
    x = np.asarray(compute, dtype=np.float64)
    ok = np.isfinite(x)
    if not ok.all():
        x = np.where(ok, x, -np.inf)
    n = int(ok.sum())
    if n == 0:
        nan = float("nan")
        return StepStats(nan, nan, nan, nan, nan, nan, -1, 0.0)
    slowest = int(np.argmax(x))
    v = x[ok] if n < len(x) else x
    k50, k95, k99 = (n - 1) // 2, int(0.95 * (n - 1)), int(0.99 * (n - 1))
    part = np.partition(v, sorted({k50, k95, k99, max(n - 2, 0), n - 1}))
    med, top, second = float(part[k50]), float(part[n - 1]), float(part[max(n - 2, 0)])
    spread = (top - med) / med if med > 0 else float("nan")
    return StepStats(
        top, med, float(part[k95]), float(part[k99]), spread,
        top / med if med > 0 else float("nan"), slowest, top - second,
    )  # fmt: skip


def window_step_stats(compute: Arr) -> dict[str, Arr]:
    """Vectorized :func:`step_stats` over a (steps x ranks) window: one array per field."""
    x = np.where(np.isfinite(compute), compute, np.nan)
    med = np.nanmedian(x, axis=1)
    filled = np.where(np.isfinite(x), x, -np.inf)
    slowest = np.argmax(filled, axis=1)
    top2 = -np.sort(-filled, axis=1)[:, :2] if x.shape[1] > 1 else np.repeat(filled, 2, axis=1)
    q = np.nanpercentile(x, [95, 99], axis=1)
    mx = top2[:, 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "max": mx,
            "median": med,
            "p95": q[0],
            "p99": q[1],
            "spread": (mx - med) / med,
            "ratio": mx / med,
            "slowest": slowest,
            "wait_s": mx - top2[:, 1],
        }


@dataclass(frozen=True)
class CusumParams:
    k: float = 2.5
    h: float = 6.0
    cap: float = 6.0
    cmax: float = 12.0
    min_slowdown: float = 0.05
    sigma_floor: float = 0.003
    sigma_steps: int = 64  # the noise estimate is the median over this many recent steps


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

    @classmethod
    def fresh(cls, world: int) -> RankState:
        z = np.zeros(world)
        m = np.full(world, -1, dtype=np.int64)
        return cls(
            z.copy(), m.copy(), m.copy(), z.copy(), np.zeros(world, dtype=np.int64),
            prev=np.full(world, np.nan), gap_excess=z.copy(), gap_count=m.copy(),
            before=np.full(world, np.nan),
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        live = np.flatnonzero(self.c > 0)
        return {
            "world": len(self.c),
            "live": {
                int(r): [
                    float(self.c[r]),
                    int(self.since[r]),
                    int(self.alarm[r]),
                    float(self.excess[r]),
                    int(self.count[r]),
                ]
                for r in live
            },
            "episodes": [e.to_dict() for e in self.episodes[-500:]],
            # exact floats (JSON keeps them), None for a rank not seen yet
            "prev": [None if not np.isfinite(v) else float(v) for v in self.prev],
            "noise": list(self.noise),
            "gap": {
                int(r): [float(self.gap_excess[r]), int(self.gap_count[r])]
                for r in np.flatnonzero(self.gap_count >= 0)
            },
            "before": {
                int(r): float(self.before[r])
                for r in np.flatnonzero(np.isfinite(self.before) & (self.alarm >= 0))
            },
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], world: int) -> RankState:
        st = cls.fresh(max(world, int(d.get("world", 0))))
        for r, (c, since, alarm, ex, n) in d.get("live", {}).items():
            i = int(r)
            if not 0 <= i < len(st.c):
                continue
            st.c[i], st.since[i], st.alarm[i], st.excess[i], st.count[i] = c, since, alarm, ex, n
        st.episodes = [Episode(**e) for e in d.get("episodes", [])]
        prev = [np.nan if v is None else float(v) for v in d.get("prev", [])][: len(st.c)]
        st.prev[: len(prev)] = prev
        st.noise = [float(v) for v in d.get("noise", [])]
        for r, (ex, n) in d.get("gap", {}).items():
            if 0 <= int(r) < len(st.c):
                st.gap_excess[int(r)], st.gap_count[int(r)] = ex, n
        for r, v in d.get("before", {}).items():
            if 0 <= int(r) < len(st.c):
                st.before[int(r)] = v
        return st


_PER_RANK = ("c", "since", "alarm", "excess", "count", "prev", "gap_excess", "gap_count", "before")
"""The per-rank arrays of :class:`RankState`."""


def robust_sigma(x: Arr, floor: float) -> float:
    """Pooled robust spread of normalized compute: median over steps of 1.4826 * MAD."""
    dev = np.abs(x - 1.0)
    mad = np.nanmedian(dev, axis=1)
    s = 1.4826 * float(np.nanmedian(mad)) if np.isfinite(mad).any() else floor
    return max(s, floor)


def _step_noise(d: Arr) -> float:
    """Robust spread across ranks of one step's change of ``x`` (NaN if under 2 ranks)."""
    d = d[np.isfinite(d)]
    if len(d) < 2:
        return float("nan")
    return 1.4826 * float(np.median(np.abs(d - np.median(d)))) / 1.4142135623730951


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
        med = np.nanmedian(compute, axis=1) if np.isfinite(compute).any() else compute[:, 0]
        x = compute / med[:, None]
    p = params
    c, since, alarm, excess, count = state.c, state.since, state.alarm, state.excess, state.count
    prev, noise = state.prev, state.noise
    gx, gn, before = state.gap_excess, state.gap_count, state.before
    for i, s in enumerate(steps.tolist()):
        xi = x[i]
        ok = np.isfinite(xi)
        if not ok.any():
            continue  # a step no rank measured carries no evidence
        spread = _step_noise(xi - prev)
        if np.isfinite(spread):
            noise.append(spread)
            del noise[: -p.sigma_steps]
        if noise:
            sigma = max(float(np.median(noise)), p.sigma_floor)
        else:  # the first step: no change to measure yet, its spread across ranks stands in
            sigma = robust_sigma(xi[None, :], p.sigma_floor)
        prev[ok] = xi[ok]
        xr = np.where(ok, xi - 1.0, 0.0)
        # a rank not measured this step keeps its evidence: silence is not health
        c[ok] += np.minimum(xr[ok] / sigma, p.cap) - p.k
        np.clip(c, 0.0, p.cmax, out=c)
        pos = c > 0
        starting = pos & (since < 0)
        since[starting] = s
        excess[pos & ok] += xr[pos & ok]
        count[pos & ok] += 1
        between = ok & (gn >= 0) & (alarm < 0)
        gx[between] += xr[between]
        gn[between] += 1
        hit = np.flatnonzero((c >= p.h) & (alarm < 0))
        for r in hit.tolist():
            if excess[r] / max(count[r], 1) >= p.min_slowdown:
                alarm[r] = s
                # the gap is what came before this episode's evidence began
                n = int(gn[r] - count[r]) if gn[r] >= 0 else 0
                before[r] = (gx[r] - excess[r]) / n if n > 0 else np.nan
                gx[r], gn[r] = 0.0, -1
            else:  # significant but too small to matter: start the evidence over
                c[r], since[r], excess[r], count[r] = 0.0, -1, 0.0, 0
        # An episode whose slowdown fell under the minimum was noise on a slightly slow rank.
        weak = np.flatnonzero((alarm >= 0) & pos & (excess < p.min_slowdown * count))
        for r in weak.tolist():
            c[r], since[r], alarm[r], excess[r], count[r] = 0.0, -1, -1, 0.0, 0
            # between episodes again, the gap measured afresh
            gx[r], gn[r], before[r] = 0.0, 0 if np.isfinite(before[r]) else -1, np.nan
        ended = np.flatnonzero(~pos & (since >= 0))
        for r in ended.tolist():
            if alarm[r] >= 0 and excess[r] >= p.min_slowdown * count[r]:
                n = int(count[r])
                b = float(before[r]) if np.isfinite(before[r]) else None
                state.episodes.append(
                    Episode(r, int(since[r]), int(alarm[r]), s - 1, float(excess[r] / n), n, b)
                )
                gx[r], gn[r], before[r] = 0.0, 0, np.nan
            since[r], alarm[r], excess[r], count[r] = -1, -1, 0.0, 0
    return state


def open_episodes(state: RankState) -> list[Episode]:
    """Episodes still running at the end of the last window (``end`` = -1)."""
    return [
        Episode(int(r), int(state.since[r]), int(state.alarm[r]), -1,
                float(state.excess[r] / max(state.count[r], 1)), int(state.count[r]),
                float(state.before[r]) if np.isfinite(state.before[r]) else None)
        for r in np.flatnonzero(state.alarm >= 0).tolist()
    ]  # fmt: skip


@dataclass(frozen=True)
class StragglerClass:
    """A classified straggler: its diagnosis, the ranks, and its span in steps."""

    diagnosis: str  # straggler.persistent | straggler.intermittent | straggler.moving
    ranks: tuple[int, ...]
    start: int
    detected: int
    end: int  # -1: ongoing
    slowdown: float
    episodes: int
    flagged_steps: int
    # slow once, for fewer than ``passing_steps``, and healthy again: no persistent straggler
    passing: bool = False


def classify_episodes(
    episodes: list[Episode], merge_gap: int = 5, moving_min_ranks: int = 3,
    persistent_cover: float = 0.8, passing_steps: int = 60,
) -> list[StragglerClass]:  # fmt: skip
    """Turn a run's episodes into findings (see the module docstring)."""
    if not episodes:
        return []
    by_rank: dict[int, list[Episode]] = {}
    for e in sorted(episodes, key=lambda e: (e.start, e.rank)):
        by_rank.setdefault(e.rank, []).append(e)
    flagged = {r: sum(e.steps for e in es) for r, es in by_rank.items()}
    total = sum(flagged.values())
    out: list[StragglerClass] = []
    typical = float(np.median(list(flagged.values())))
    # a rank slow far longer than the others, and not together with another such rank (a group
    # slowing together stays as it is), is its own straggler, not a reason the ranks that take
    # turns beside it are never alone
    long = {r: by_rank[r] for r, n in flagged.items() if len(flagged) > 3 and n >= 3 * typical}
    background = {
        r for r in long
        if _alone(long, r) >= 0.5 or not any(_together(long[r], es, merge_gap)
                                             for q, es in long.items() if q != r)
    }  # fmt: skip
    # nor do the ranks slow again and again (an intermittent straggler beside the turns)
    again = {r for r, es in by_rank.items() if len(_spells(es, merge_gap)) >= 3}
    movers = [
        r for r in by_rank
        if r not in background and flagged[r] <= 0.5 * total
        and _alone(by_rank, r, background | again) >= 0.5
    ]  # fmt: skip
    # The slow rank of a moving straggler comes back to a rank only after its turns on the
    # others: a rank slow again and again while the others took one turn each is an
    # intermittent straggler beside it.
    spells = {r: len(_spells(by_rank[r], merge_gap)) for r in movers}
    usual = float(np.median(list(spells.values()))) if spells else 1.0
    movers = [r for r in movers if spells[r] < max(3.0, 2 * usual + 1)]
    moved: list[Episode] = []  # the moving straggler's episodes, if there is one
    # Two ranks slow once each, the second from where the first stopped: the slow rank moved
    # (a moving straggler seen for two turns, its other turns on ranks slow anyway or unseen),
    # known as soon as the second is flagged.
    pair = _handover(by_rank, background | again, merge_gap, passing_steps)
    moving = len(movers) >= moving_min_ranks
    if not moving and pair:
        movers, moving = list(pair), True
    if moving:
        # A rank slow once, briefly (no longer than a mover), while the slow rank keeps moving
        # is one more turn of it seen at a handover (its episode overlaps the next mover's), not
        # a straggler of its own.
        lo = min(e.start for r in movers for e in by_rank[r])
        hi = max(_stop(e) for r in movers for e in by_rank[r])
        most = max(flagged[r] for r in movers)
        movers += [
            r for r, es in by_rank.items()
            if r not in movers and r not in background and len(es) == 1 and es[0].end >= 0
            and flagged[r] <= most and es[0].start <= hi and _stop(es[0]) >= lo
        ]  # fmt: skip
        es = sorted((e for r in movers for e in by_rank[r]), key=lambda e: e.detected)
        third = sorted({e.rank: e.detected for e in reversed(es)}.items(), key=lambda kv: kv[1])
        seen = [t for _, t in third[moving_min_ranks - 1 : moving_min_ranks]]
        if pair and set(pair) <= set(movers):
            seen.append(by_rank[pair[1]][0].detected)
        out.append(
            StragglerClass(
                "straggler.moving", tuple(sorted(movers)), min(e.start for e in es),
                min(seen), _end(es),
                float(np.mean([e.slowdown for e in es])), len(es), sum(e.steps for e in es),
            )
        )  # fmt: skip
        moved = es
        by_rank = {r: v for r, v in by_rank.items() if r not in movers}
    for r, es in by_rank.items():
        merged = _spells(es, merge_gap)
        # a restart replays the steps since its checkpoint: count a step covered once
        covered = _union(es)
        steady = len(merged) == 1 or covered >= persistent_cover * (_last(es) - es[0].start + 1)
        diag = "straggler.persistent" if steady else "straggler.intermittent"
        detected = merged[0][0].detected if steady else merged[1][0].detected
        start = _own_onset(es[0], moved, merge_gap)
        out.append(
            StragglerClass(
                diag, (r,), start, max(detected, start), _end(es),
                _slowdown(es),
                len(merged), sum(e.steps for e in es),
                len(merged) == 1 and _end(es) >= 0 and covered < passing_steps,
            )
        )  # fmt: skip
    return out


def _together(a: list[Episode], b: list[Episode], gap: int) -> bool:
    """Whether two ranks began to be slow together: onsets within ``gap`` steps or a tenth of
    the shorter one's span (a group slows at once; two stragglers at unrelated times)."""
    span = min(_last(a) - a[0].start + 1, _last(b) - b[0].start + 1)
    return abs(a[0].start - b[0].start) <= max(gap, 0.1 * span)


def _handover(
    by_rank: dict[int, list[Episode]], ignore: set[int], gap: int, most: int
) -> list[int]:
    """The first two ranks slow in one short spell each (flagged for ``most`` steps or fewer:
    a turn), about as slow, the second taking over as the first's evidence runs out (its onset
    at most ``2 x gap`` steps before the first's end, at most ``gap`` after), no other rank
    beginning or ending then (a group slows together) and at most two others slow then (the
    GPUs of a hot rack throttle one after another, all slow together)."""
    once = sorted(
        (es[0].start, r) for r, es in by_rank.items()
        if r not in ignore and len(_spells(es, gap)) == 1 and _union(es) <= most
    )  # fmt: skip
    starts = sorted(es[0].start for es in by_rank.values())
    ends = sorted(_end(es) for es in by_rank.values())

    def near(xs: list[int], t: int) -> int:  # how many of the sorted xs lie within gap of t
        return bisect_right(xs, t + gap) - bisect_left(xs, t - gap)

    for a0, ra in once:
        ea, end = by_rank[ra], _end(by_rank[ra])
        if end < 0 or near(ends, end) != 1:
            continue
        lo = bisect_left(once, (max(end - 2 * gap, a0 + gap + 1), -1))
        for b0, rb in once[lo : bisect_right(once, (end + gap, 1 << 62))]:
            eb = by_rank[rb]
            sa, sb = _slowdown(ea), _slowdown(eb)
            if near(starts, b0) != 1 or max(sa, sb) > 2 * min(sa, sb):
                continue
            busy = {r for r, es in by_rank.items() for e in es if e.start <= b0 <= _stop(e)}
            if len(busy - {ra, rb}) <= 2:
                return [ra, rb]
    return []


def _own_onset(first: Episode, moving: list[Episode], gap: int) -> int:
    """The onset of a rank's own slowdown: its first episode's, unless that episode began as a
    moving straggler's turn (at a handover: a mover's episode ending as it began, none
    beginning then) and went on after the slow rank had moved on (a mover's episode beginning
    inside it, more than ``gap`` steps before its end); then where the slow rank moved on."""
    if not any(m.start < first.start and abs(_stop(m) - first.start) <= gap for m in moving) or any(
        abs(m.start - first.start) <= gap for m in moving
    ):  # no turn ended as it began, or another rank took the turn then
        return first.start
    on = [m.start for m in moving if first.start < m.start < _stop(first) - gap]
    return min(on) if on else first.start


def _spells(es: list[Episode], merge_gap: int) -> list[list[Episode]]:
    """A rank's episodes (by onset) merged across gaps of up to ``merge_gap`` steps, and across
    longer gaps in which the rank stayed slow: at least half as slow as the episodes on either
    side (a small slowdown in real noise lets the evidence fall back to 0 now and then; an
    intermittent straggler's gaps are healthy)."""
    merged: list[list[Episode]] = []
    for e in es:
        last = merged[-1][-1] if merged else None
        if (
            last is not None
            and last.end >= 0
            and (e.start - last.end <= merge_gap or _stayed_slow(last, e))
        ):
            merged[-1].append(e)
        else:
            merged.append([e])
    return merged


def _stayed_slow(last: Episode, e: Episode) -> bool:
    """Whether the rank was at least half as slow as the episodes either side between them."""
    return e.before is not None and e.before >= 0.5 * min(last.slowdown, e.slowdown)


def _slowdown(es: list[Episode]) -> float:
    """A rank's mean slowdown over its episodes, weighted by their steps."""
    return float(np.average([e.slowdown for e in es], weights=[e.steps for e in es]))


def _union(es: list[Episode]) -> int:
    """Steps covered by the episodes, each step once."""
    n, hi = 0, -(10**18)
    for a, b in sorted((e.start, _stop(e)) for e in es):
        if b > hi:
            n += b - max(a, hi + 1) + 1
            hi = b
    return n


def _stop(e: Episode) -> int:
    return e.end if e.end >= 0 else e.start + max(e.steps, 1) - 1


def _last(es: list[Episode]) -> int:
    return max(_stop(e) for e in es)


def _alone(by_rank: dict[int, list[Episode]], r: int, ignore: set[int] | None = None) -> float:
    """Share of rank ``r``'s flagged steps during which no other rank (but those in ``ignore``)
    was in an episode."""
    others = sorted(
        (e.start, _stop(e))
        for q, es in by_rank.items()
        if q != r and q not in (ignore or ())
        for e in es
    )
    mine = [(e.start, _stop(e)) for e in by_rank[r]]
    own = sum(b - a + 1 for a, b in mine)
    shared = 0
    for a, b in mine:
        cover = 0  # union of the others' intervals inside [a, b]
        hi = a - 1
        for oa, ob in others:
            if ob < a or oa > b:
                continue
            lo_, hi_ = max(oa, a, hi + 1), min(ob, b)
            if hi_ >= lo_:
                cover += hi_ - lo_ + 1
                hi = hi_
        shared += cover
    return 1.0 - shared / max(own, 1)


def _end(es: list[Episode]) -> int:
    return -1 if any(e.end < 0 for e in es) else max(e.end for e in es)
