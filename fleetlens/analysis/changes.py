"""Metric changes worth a line on a run's timeline: learning-rate moves, spikes, NaN and Inf.

A scalar set by a schedule or config (:data:`SCHEDULE_NAMES`) changes in two ways. A discrete
change (a step decay, a manual drop, a new batch size) is one entry per change. A schedule
(cosine, linear warmup: a new value at every logged step) is one entry for the whole stretch,
"lr schedule: 0.0003 -> 6e-05 over steps 20-599", not one per step; a discrete jump inside a
schedule (a drop much larger than the moves beside it) is still its own entry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

__all__ = ["MetricChange", "metric_changes"]

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
    out: list[MetricChange] = []
    if len(values) == 0:
        return out
    finite = np.isfinite(values)
    prev = np.concatenate(([np.nan], values[:-1]))
    for i in np.flatnonzero(~finite).tolist():
        out.append(MetricChange(int(steps[i]), name, float(values[i]), float(prev[i]), "nonfinite"))
    if name in SCHEDULE_NAMES:
        out += _settings(name, steps, values, finite & np.isfinite(prev) & (values != prev))
    elif len(values) > 3:
        # Each value against the median magnitude of the ``history`` finite values before it,
        # vectorized: a Python loop here costs seconds on a 100,000-step series.
        mags = np.where(finite, np.abs(values), np.nan)
        padded = np.concatenate((np.full(history, np.nan), mags[:-1]))
        windows = np.lib.stride_tricks.sliding_window_view(padded, history)
        enough = np.sum(np.isfinite(windows), axis=1) >= 3
        with np.errstate(all="ignore"):
            base = np.nanmedian(np.where(enough[:, None], windows, 0.0), axis=1)
        spike = finite & enough & (base > 0) & (mags > spike_factor * base)
        for i in np.flatnonzero(spike).tolist():
            out.append(MetricChange(int(steps[i]), name, float(values[i]), float(prev[i]), "spike"))
    if since is not None:
        out = [
            _clip(c, since, steps, values)
            for c in out
            if (c.step if c.end_step is None else c.end_step) >= since
        ]
    out.sort(key=lambda c: (c.step, c.name))
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
