"""Metric changes worth a line on a run's timeline: learning-rate moves, spikes, NaN and Inf.

A scalar set by a schedule or config (:data:`SCHEDULE_NAMES`) changes in two ways. A discrete
change (a step decay, a manual drop, a new batch size) is one entry per change. A schedule
(cosine, linear warmup: a new value at every logged step) is one entry for the whole stretch,
"lr schedule: 0.0003 -> 6e-05 over steps 20-599", not one per step; a discrete jump inside a
schedule (a drop much larger than the moves beside it) is still its own entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

__all__ = ["MetricChange", "metric_changes", "series_changes"]

SCHEDULE_NAMES = frozenset({"lr", "learning_rate", "loss_scale", "batch_size", "seq_len"})
"""Scalars set by a schedule or config: every change of value is an event."""

SCHEDULE_MIN_MOVES = 5
"""The fewest moves in a row (at consecutive logged steps) that are a schedule."""
SCHEDULE_GAP = 2
"""Logged steps without a move that a schedule may hold (a warmup ending at the peak)."""
JUMP_FACTOR = 10.0
"""A move this many times larger than the moves beside it is a discrete change."""


@dataclass(frozen=True)
class MetricChange:
    step: int
    name: str
    value: float
    previous: float
    what: str  # "changed", "schedule", "spike", "nonfinite"
    end_step: int | None = None  # a schedule's last step (``step`` is its first)


def metric_changes(
    name: str,
    steps: npt.NDArray[np.int64],
    values: npt.NDArray[np.float64],
    spike_factor: float = 5.0,
    history: int = 20,
    since: int | None = None,
) -> list[MetricChange]:
    """Changes of one scalar series (sorted by step), from step ``since`` on (the values
    before it are history: what a spike is judged against, where a schedule began).

    A spike is a value over ``spike_factor`` times the median magnitude of the previous
    ``history`` finite values; non-finite values are always reported.
    """
    return series_changes([name], [0, len(values)], steps, values, spike_factor, history, since)


def series_changes(
    names: Sequence[str],
    cuts: Sequence[int],
    steps: npt.NDArray[np.int64],
    values: npt.NDArray[np.float64],
    spike_factor: float = 5.0,
    history: int = 20,
    since: int | None = None,
) -> list[MetricChange]:
    """:func:`metric_changes` of many series at once: series ``k`` is ``names[k]``, rows
    ``cuts[k]:cuts[k + 1]`` of ``steps`` and ``values``. The spikes of every series are found
    in one pass over the rows, so a run with 10,000 metric names costs its rows, not 10,000
    calls; only the series with something to report are looked at one by one."""
    out: list[MetricChange] = []
    if len(values) == 0:
        return out
    bounds = np.asarray(cuts, dtype=np.int64)
    series = np.repeat(np.arange(len(names)), np.diff(bounds))
    finite = np.isfinite(values)
    spikes = _spikes(values, bounds[series], spike_factor, history)
    flagged = np.flatnonzero(spikes | ~finite)
    todo = set(series[flagged].tolist())
    todo |= {k for k, name in enumerate(names) if name in SCHEDULE_NAMES}
    for k in sorted(todo):
        a, z, name = int(bounds[k]), int(bounds[k + 1]), names[k]
        s, v, fin = steps[a:z], values[a:z], finite[a:z]
        prev = np.concatenate(([np.nan], v[:-1]))
        found = [
            MetricChange(int(s[i]), name, float(v[i]), float(prev[i]), "nonfinite")
            for i in np.flatnonzero(~fin).tolist()
        ]
        if name in SCHEDULE_NAMES:
            found += _settings(name, s, v, fin & np.isfinite(prev) & (v != prev))
        else:
            found += [
                MetricChange(int(s[i]), name, float(v[i]), float(prev[i]), "spike")
                for i in np.flatnonzero(spikes[a:z]).tolist()
            ]
        if since is not None:
            found = [
                _clip(c, since, s, v)
                for c in found
                if (c.step if c.end_step is None else c.end_step) >= since
            ]
        out += found
    out.sort(key=lambda c: (c.step, c.name))
    return out


_ROWS_AT_ONCE = 1 << 16  # rows whose windows are held at once: ~10 MiB at 20 values each


def _spikes(
    values: npt.NDArray[np.float64],
    first: npt.NDArray[np.int64],
    spike_factor: float,
    history: int,
) -> npt.NDArray[np.bool_]:
    """Rows whose magnitude is over ``spike_factor`` times the median magnitude of the finite
    values among the ``history`` rows before them in their series (``first[i]``: the first row
    of row ``i``'s series), when at least 3 of those are finite."""
    finite = np.isfinite(values)
    mags = np.where(finite, np.abs(values), np.nan)
    out = np.zeros(len(values), dtype=bool)
    back = np.arange(history, 0, -1)
    for a in range(0, len(values), _ROWS_AT_ONCE):
        rows = np.arange(a, min(len(values), a + _ROWS_AT_ONCE))
        at = rows[:, None] - back
        windows = np.where(at >= first[rows][:, None], mags[np.maximum(at, 0)], np.nan)
        have = np.isfinite(windows).sum(axis=1)
        windows.sort(axis=1)  # NaN last: the finite values first, in order
        lo = np.take_along_axis(windows, np.maximum(have - 1, 0)[:, None] // 2, axis=1)[:, 0]
        hi = np.take_along_axis(windows, np.minimum(have // 2, history - 1)[:, None], axis=1)
        base = (lo + hi[:, 0]) / 2
        with np.errstate(invalid="ignore"):
            out[rows] = finite[rows] & (have >= 3) & (base > 0) & (mags[rows] > spike_factor * base)
    return out


def _settings(
    name: str,
    steps: npt.NDArray[np.int64],
    values: npt.NDArray[np.float64],
    moved: npt.NDArray[np.bool_],
) -> list[MetricChange]:
    """The moves of a scheduled scalar: runs of moves are schedules, the rest (and the jumps
    inside a run) discrete changes."""
    at = np.flatnonzero(moved)
    if not len(at):
        return []
    with np.errstate(invalid="ignore"):  # inf - inf beside a non-finite value: not a move
        delta = np.abs(np.diff(values))[at - 1]  # each move's size
    # Runs of moves at most SCHEDULE_GAP unmoved samples apart.
    cuts = np.flatnonzero(np.diff(at) > SCHEDULE_GAP + 1) + 1
    out: list[MetricChange] = []
    for run in np.split(np.arange(len(at)), cuts):
        if len(run) < SCHEDULE_MIN_MOVES:
            out += [_changed(name, steps, values, int(at[k])) for k in run]
            continue
        d = delta[run]
        side = np.maximum(np.concatenate(([0.0], d[:-1])), np.concatenate((d[1:], [0.0])))
        jump = d > JUMP_FACTOR * side
        piece: list[int] = []
        for k, j in zip(run.tolist(), jump.tolist(), strict=True):
            if j:
                out += _schedule(name, steps, values, at, piece)
                out.append(_changed(name, steps, values, int(at[k])))
                piece = []
            else:
                piece.append(k)
        out += _schedule(name, steps, values, at, piece)
    return out


def _changed(
    name: str, steps: npt.NDArray[np.int64], values: npt.NDArray[np.float64], i: int
) -> MetricChange:
    return MetricChange(int(steps[i]), name, float(values[i]), float(values[i - 1]), "changed")


def _schedule(
    name: str,
    steps: npt.NDArray[np.int64],
    values: npt.NDArray[np.float64],
    at: npt.NDArray[np.int64],
    piece: list[int],
) -> list[MetricChange]:
    """One entry for a stretch of moves; a stretch cut too short by jumps is its moves."""
    if len(piece) < SCHEDULE_MIN_MOVES:
        return [_changed(name, steps, values, int(at[k])) for k in piece]
    i, j = int(at[piece[0]]), int(at[piece[-1]])
    return [
        MetricChange(
            int(steps[i]),
            name,
            float(values[j]),
            float(values[i - 1]),
            "schedule",
            end_step=int(steps[j]),
        )
    ]


def _clip(
    c: MetricChange, since: int, steps: npt.NDArray[np.int64], values: npt.NDArray[np.float64]
) -> MetricChange:
    """A schedule that began before ``since`` as seen from ``since``: from the value then."""
    if c.end_step is None or c.step >= since:
        return c
    i = int(np.searchsorted(steps, since))
    return replace(c, step=int(steps[i]), previous=float(values[i - 1]) if i else c.previous)
