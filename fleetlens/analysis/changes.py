"""Metric changes worth a line on a run's timeline: learning-rate moves, spikes, NaN and Inf."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["MetricChange", "metric_changes"]

SCHEDULE_NAMES = frozenset({"lr", "learning_rate", "loss_scale", "batch_size", "seq_len"})
"""Scalars set by a schedule or config: every change of value is an event."""


@dataclass(frozen=True)
class MetricChange:
    step: int
    name: str
    value: float
    previous: float
    what: str  # "changed", "spike", "nonfinite"


def metric_changes(
    name: str,
    steps: npt.NDArray[np.int64],
    values: npt.NDArray[np.float64],
    spike_factor: float = 5.0,
    history: int = 20,
) -> list[MetricChange]:
    """Changes of one scalar series (sorted by step).

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
        moved = finite & np.isfinite(prev) & (values != prev)
        for i in np.flatnonzero(moved).tolist():
            out.append(
                MetricChange(int(steps[i]), name, float(values[i]), float(prev[i]), "changed")
            )
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
    out.sort(key=lambda c: (c.step, c.name))
    return out
