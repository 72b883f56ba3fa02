"""Scalar series of a run, downsampled in the store to the number of points a chart can show.

A window of steps that spans at most :data:`LONG_WINDOW_S` (6 h) of the run is read from the
raw rows, one point per bucket of steps (each step's value the lowest rank's). A longer one, or
one whose raw rows retention already dropped, is read from the 10 s or 1 min rollup
(:mod:`fleetlens.store.rollups`) in buckets of time, a multiple of the rollup's resolution, when
the points asked for are at least that coarse: each point then summarises every value logged
in its bucket (all ranks), and its ``step`` is the bucket's first. :meth:`SeriesQueries.over_time`
reads the same buckets from either source; the answers agree (tests/test_retention.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from ..store.reader import TenantReader
from ..store.rollups import RESOLUTIONS
from ..store.scope import Scope
from ..store.series_queries import ScalarSeriesQueries, Span
from ..store.telemetry import TelemetryStore

__all__ = [
    "LONG_WINDOW_S",
    "MetricName",
    "Num",
    "Resolution",
    "SeriesPoint",
    "SeriesQueries",
    "SeriesRead",
]

LONG_WINDOW_S = 6 * 3600.0
"""A window longer than this (in the run's time) is read from the rollups."""


Num = float | str | None
"""A value of a series: a number, or ``"nan"``/``"inf"``/``"-inf"`` when not finite."""
Resolution = Literal["raw", "10s", "1m"]
"""Where a series was read from: the raw rows, or the 10 s or 1 min rollup."""


@dataclass(frozen=True, slots=True)
class MetricName:
    """One scalar a run logged: values stored, first and last step."""

    name: str
    points: int
    from_step: int
    to_step: int


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """A step, or a bucket of steps or of time, summarised: its first step and the lowest
    rank's value there, min, max, mean and the non-finite values counted; ``time``: the time
    bucket's start (UNIX seconds), None for a bucket of steps."""

    step: int
    value: Num
    min: Num
    max: Num
    mean: Num
    non_finite: int
    time: int | None = None


@dataclass(frozen=True, slots=True)
class SeriesRead:
    """One series over a window of steps, and where it was read from."""

    run_id: str
    name: str
    from_step: int
    to_step: int
    resolution: Resolution
    points: list[SeriesPoint]


def _num(v: Any) -> Num:
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else str(f)


class SeriesQueries:
    def __init__(self, telemetry: TelemetryStore, scope: Scope) -> None:
        self.q = ScalarSeriesQueries(TenantReader(telemetry, scope))

    def names(self, run_id: str) -> list[MetricName]:
        """The run's scalars; from the rollup once retention dropped the raw rows."""
        tab = self.q.names(run_id, raw=True)
        if not tab.num_rows:
            tab = self.q.names(run_id, raw=False)
        return [
            MetricName(name=r["name"], points=r["n"], from_step=r["lo"], to_step=r["hi"])
            for r in tab.to_pylist()
        ]

    def series(
        self, run_id: str, name: str, from_step: int, to_step: int, points: int
    ) -> list[SeriesPoint]:
        """One value per step (the lowest rank's), or per bucket of steps: first, min, max, mean.

        Non-finite values are kept as strings ("nan", "inf"): a NaN loss is the signal.
        """
        if to_step < from_step:
            return []
        width = max(1, math.ceil((to_step - from_step + 1) / max(1, points)))
        rows = self.q.step_buckets(run_id, name, from_step, to_step, width).to_pylist()
        return [
            SeriesPoint(
                step=r["s_first"],
                value=_num(r["v_first"]),
                min=_num(r["v_min"]),
                max=_num(r["v_max"]),
                mean=_num(r["v_mean"]),
                non_finite=r["bad"],
            )
            for r in rows
        ]

    def span(self, run_id: str, name: str, from_step: int, to_step: int, raw: bool) -> Span:
        """What the raw rows (or the 1 min rollup) hold of ``name`` within the steps."""
        return self.q.span(run_id, name, from_step, to_step, raw)

    def read(self, run_id: str, name: str, from_step: int, to_step: int, points: int) -> SeriesRead:
        """The series answer: from the raw rows when the window is short, else the rollups."""
        span = self.span(run_id, name, from_step, to_step, raw=True)
        resolution: Resolution = "raw"
        had_raw = span.n > 0
        if not had_raw or span.t1 - span.t0 > LONG_WINDOW_S:
            if not had_raw:  # nothing raw: expired, or never stored
                span = self.span(run_id, name, from_step, to_step, raw=False)
            width = math.ceil((span.t1 - span.t0 + 1) / max(1, points))
            # a long window asked at a finer grain than 10 s stays raw while raw rows exist
            if span.n and (width >= 10 or not had_raw):
                resolution = "1m" if width >= 60 else "10s"
        if resolution == "raw":
            pts = self.series(run_id, name, span.lo, span.hi, points)
        else:
            pts = self.over_time(run_id, name, span.t0, span.t1, points, resolution)
        return SeriesRead(
            run_id=run_id,
            name=name,
            from_step=from_step,
            to_step=max(span.hi, from_step) if span.hi >= span.lo else from_step,
            resolution=resolution,
            points=pts,
        )

    def over_time(
        self,
        run_id: str,
        name: str,
        t0: float,
        t1: float,
        points: int,
        resolution: str,
        raw: bool = False,
    ) -> list[SeriesPoint]:
        """``name`` in buckets of time over [t0, t1], multiples of ``resolution`` ("10s",
        "1m"), from that rollup or (``raw``) the raw rows: first step and value (the lowest
        rank's at the first step), min, max, mean and non-finite count of every value logged
        in each bucket."""
        res = RESOLUTIONS[resolution]
        width = math.ceil((t1 - t0 + 1) / max(1, points))
        w = max(res, math.ceil(width / res) * res)
        b0, b1 = math.floor(t0 / res) * res, math.floor(t1 / res) * res
        rows = self.q.time_buckets(run_id, name, resolution, w, b0, b1, raw).to_pylist()
        return [
            SeriesPoint(
                step=r["s_first"],
                time=r["b"] * w,
                value=_num(r["v_first"]),
                min=_num(r["v_min"]),
                max=_num(r["v_max"]),
                mean=_num(r["v_sum"] / r["n"]) if r["n"] else None,
                non_finite=r["bad"],
            )
            for r in rows
        ]
