"""Straggler classes from a run's episodes (:mod:`fleetlens.analysis.ranks` finds them).

Classification of the run's episodes (:func:`classify_episodes`), on evidence that holds on real
data: ranks that are slow mostly *alone*, none holding most of the flagged steps, 3 or more of them
-> ``straggler.moving`` (the slow rank keeps changing: data skew); so are two ranks slow in one
short spell each, the second from where the first recovered, with at most two other ranks slow then
and none beginning with it (two turns seen, the others hidden by a slower rank or too faint), known
when the second is flagged; the stragglers of their own and the intermittent ones below count for
none of that. "Alone" does not count a rank flagged for 3 times the median of the ranks' flagged
steps or more and not slow together with another such rank (their onsets within a tenth of the
shorter one's span): it is a straggler of its own, slow while the others take turns, never a mover;
nor a rank slow in 3 or more spells (an intermittent straggler). Nor is a rank slow in 3 or more
separate spells, more than twice the movers' usual count plus one: the slow rank of a moving
straggler comes back to a rank only after its turns on the others, so that rank is an intermittent
straggler beside it. A rank slow in one short episode (no more flagged steps than a mover) within
the movers' span is a mover too: a turn seen at a handover, where its episode overlaps the next.
*Faint* episodes (only the slow lane saw them: :mod:`fleetlens.analysis.ranks`) take no part in
telling a moving straggler: that lane sees its turns longer and more of them. A rank seen only
faintly, once, no longer than a mover and within the movers' span is one more turn; every other
faint episode is classed with its rank's others, below. A rank whose first episode began as a turn
(at a handover) and went on after the slow rank moved on is dated from where it moved on. Otherwise
per rank, its episodes merged across short gaps and across gaps in which it stayed at least half as
slow as the episodes either side (its mean ``x - 1`` between them, carried in the state: a small
slowdown in real noise lets the evidence lapse; an intermittent straggler's gaps are healthy): one,
or flagged for at least ``persistent_cover`` of the span from its first onset to its last episode's
end (in steps, a step replayed by a restart counted once) -> ``straggler.persistent``; else
``straggler.intermittent``. A rank slow once for fewer than ``passing_steps`` and healthy again is
marked ``passing``: a spell that passed by itself (in the generated scenarios, a moving straggler's
turn or one episode of an intermittent one), which the analyzer does not report as a persistent
straggler.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .ranks import Episode

__all__ = ["StragglerClass", "classify_episodes"]


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
    episodes: list[Episode],
    merge_gap: int = 5,
    moving_min_ranks: int = 3,
    persistent_cover: float = 0.8,
    passing_steps: int = 60,
) -> list[StragglerClass]:
    """Turn a run's episodes into findings (see the module docstring)."""
    faint = [e for e in episodes if e.faint]
    by_rank: dict[int, list[Episode]] = {}
    for e in sorted(episodes, key=lambda e: (e.start, e.rank)):
        if not e.faint:
            by_rank.setdefault(e.rank, []).append(e)
    if not by_rank:
        return _per_rank({}, faint, [], merge_gap, persistent_cover, passing_steps)
    flagged = {r: sum(e.steps for e in es) for r, es in by_rank.items()}
    total = sum(flagged.values())
    out: list[StragglerClass] = []
    typical = float(np.median(list(flagged.values())))
    # a rank slow far longer than the others, and not together with another such rank (a group
    # slowing together stays as it is), is its own straggler, not a reason the ranks that take
    # turns beside it are never alone
    long = {r: by_rank[r] for r, n in flagged.items() if len(flagged) > 3 and n >= 3 * typical}
    background = {
        r
        for r in long
        if _alone(long, r) >= 0.5
        or not any(_together(long[r], es, merge_gap) for q, es in long.items() if q != r)
    }
    # nor do the ranks slow again and again (an intermittent straggler beside the turns)
    again = {r for r, es in by_rank.items() if len(_spells(es, merge_gap)) >= 3}
    movers = [
        r
        for r in by_rank
        if r not in background
        and flagged[r] <= 0.5 * total
        and _alone(by_rank, r, background | again) >= 0.5
    ]
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
            r
            for r, es in by_rank.items()
            if r not in movers
            and r not in background
            and len(es) == 1
            and es[0].end >= 0
            and flagged[r] <= most
            and es[0].start <= hi
            and _stop(es[0]) >= lo
        ]
        # so is a rank the slow lane alone saw slow once, as briefly, then
        times = Counter(e.rank for e in faint)
        for e in faint:
            turn = e.end >= 0 and e.steps <= most and e.start <= hi and _stop(e) >= lo
            if turn and times[e.rank] == 1 and e.rank not in by_rank:
                by_rank[e.rank] = [e]
                movers.append(e.rank)
        es = sorted((e for r in movers for e in by_rank[r]), key=lambda e: e.detected)
        third = sorted({e.rank: e.detected for e in reversed(es)}.items(), key=lambda kv: kv[1])
        seen = [t for _, t in third[moving_min_ranks - 1 : moving_min_ranks]]
        if pair and set(pair) <= set(movers):
            seen.append(by_rank[pair[1]][0].detected)
        out.append(
            StragglerClass(
                "straggler.moving",
                tuple(sorted(movers)),
                min(e.start for e in es),
                min(seen),
                _end(es),
                float(np.mean([e.slowdown for e in es])),
                len(es),
                sum(e.steps for e in es),
            )
        )
        moved = es
        by_rank = {r: v for r, v in by_rank.items() if r not in movers}
    return out + _per_rank(by_rank, faint, moved, merge_gap, persistent_cover, passing_steps)


def _per_rank(
    by_rank: dict[int, list[Episode]],
    faint: list[Episode],
    moved: list[Episode],
    merge_gap: int,
    persistent_cover: float,
    passing_steps: int,
) -> list[StragglerClass]:
    """Each rank that is no mover, its faint episodes (no part of telling a moving straggler:
    the slow lane sees more of its turns, longer) with the others: persistent or intermittent."""
    out: list[StragglerClass] = []
    movers = {e.rank for e in moved}
    for e in faint:
        if e.rank not in movers:
            by_rank.setdefault(e.rank, []).append(e)
    for es in by_rank.values():
        es.sort(key=lambda e: e.start)
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
                diag,
                (r,),
                start,
                max(detected, start),
                _end(es),
                _slowdown(es),
                len(merged),
                sum(e.steps for e in es),
                len(merged) == 1 and _end(es) >= 0 and covered < passing_steps,
            )
        )
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
    GPUs of a hot rack throttle one after another, all slow together). The ranks ignored (a
    straggler of its own, an intermittent one) count for none of it."""
    by_rank = {r: es for r, es in by_rank.items() if r not in ignore}
    once = sorted(
        (es[0].start, r)
        for r, es in by_rank.items()
        if len(_spells(es, gap)) == 1 and _union(es) <= most
    )
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
