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
from typing import Any

from ..store.reader import TenantReader
from ..store.rollups import RESOLUTIONS
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore

__all__ = ["LONG_WINDOW_S", "SeriesQueries", "Span"]

LONG_WINDOW_S = 6 * 3600.0
"""A window longer than this (in the run's time) is read from the rollups."""


@dataclass(frozen=True)
class Span:
    """What is stored of one scalar in a window: steps ``lo..hi``, times ``t0..t1``."""

    lo: int
    hi: int
    t0: float
    t1: float
    n: int


def _num(v: Any) -> float | str | None:
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else str(f)


class SeriesQueries:
    def __init__(self, telemetry: TelemetryStore, scope: Scope) -> None:
        self.r = TenantReader(telemetry, scope)

    def names(self, run_id: str) -> list[dict[str, Any]]:
        """The run's scalars; from the rollup once retention dropped the raw rows."""
        rows = self.r.rows(
            "SELECT name, count() AS n, min(step) AS lo, max(step) AS hi "
            "FROM {db}.scalars WHERE tenant = {tenant:String} "
            "AND run_id = {run:String} GROUP BY name ORDER BY name",
            run=run_id,
        ) or self.r.rows(
            "SELECT name, sum(n) AS n, min(step_min) AS lo, max(step_max) AS hi "
            "FROM {db}.rollup_scalars_1m WHERE tenant = {tenant:String} "
            "AND run_id = {run:String} GROUP BY name ORDER BY name",
            run=run_id,
        )
        return [
            {"name": r["name"], "points": r["n"], "fromStep": r["lo"], "toStep": r["hi"]}
            for r in rows
        ]

    def series(
        self, run_id: str, name: str, from_step: int, to_step: int, points: int
    ) -> list[dict[str, Any]]:
        """One value per step (the lowest rank's), or per bucket of steps: first, min, max, mean.

        Non-finite values are kept as strings ("nan", "inf"): a NaN loss is the signal.
        """
        if to_step < from_step:
            return []
        width = max(1, math.ceil((to_step - from_step + 1) / max(1, points)))
        rows = self.r.rows(
            "SELECT intDiv(step - {lo:Int64}, {w:Int64}) AS b, min(step) AS s_first, "
            "argMin(v, step) AS v_first, min(v) AS v_min, max(v) AS v_max, avg(v) AS v_mean, "
            "countIf(NOT isFinite(v)) AS bad FROM ("
            " SELECT step, argMin(value, rank) AS v FROM {db}.scalars"
            " WHERE tenant = {tenant:String} AND run_id = {run:String}"
            " AND name = {name:String} AND step BETWEEN {lo:Int64} AND {hi:Int64}"
            " GROUP BY step) GROUP BY b ORDER BY b",
            run=run_id,
            name=name,
            lo=from_step,
            hi=to_step,
            w=width,
        )
        return [
            {
                "step": r["s_first"],
                "value": _num(r["v_first"]),
                "min": _num(r["v_min"]),
                "max": _num(r["v_max"]),
                "mean": _num(r["v_mean"]),
                "nonFinite": r["bad"],
            }
            for r in rows
        ]

    def span(self, run_id: str, name: str, from_step: int, to_step: int, raw: bool) -> Span:
        """What the raw rows (or the 1 min rollup) hold of ``name`` within the steps."""
        if raw:
            sql = (
                "SELECT min(step) AS lo, max(step) AS hi, min(time) AS t0, max(time) AS t1,"
                " count() AS n FROM {db}.scalars WHERE tenant = {tenant:String}"
                " AND run_id = {run:String} AND name = {name:String}"
                " AND step BETWEEN {lo:Int64} AND {hi:Int64}"
            )
        else:
            sql = (
                "SELECT min(step_min) AS lo, max(step_max) AS hi, min(bucket) AS t0,"
                " max(bucket) + 59 AS t1, sum(n) AS n FROM {db}.rollup_scalars_1m"
                " WHERE tenant = {tenant:String} AND run_id = {run:String}"
                " AND name = {name:String} AND step_max >= {lo:Int64} AND step_min <= {hi:Int64}"
            )
        row = self.r.rows(sql, run=run_id, name=name, lo=from_step, hi=to_step)[0]
        if not row["n"]:
            return Span(from_step, from_step - 1, 0.0, 0.0, 0)
        return Span(int(row["lo"]), int(row["hi"]), float(row["t0"]), float(row["t1"]), row["n"])

    def read(
        self, run_id: str, name: str, from_step: int, to_step: int, points: int
    ) -> dict[str, Any]:
        """The series answer: from the raw rows when the window is short, else the rollups."""
        span = self.span(run_id, name, from_step, to_step, raw=True)
        resolution, had_raw = "raw", span.n > 0
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
        return {
            "runId": run_id,
            "name": name,
            "fromStep": from_step,
            "toStep": max(span.hi, from_step) if span.hi >= span.lo else from_step,
            "resolution": resolution,
            "points": pts,
        }

    def over_time(
        self,
        run_id: str,
        name: str,
        t0: float,
        t1: float,
        points: int,
        resolution: str,
        raw: bool = False,
    ) -> list[dict[str, Any]]:
        """``name`` in buckets of time over [t0, t1], multiples of ``resolution`` ("10s",
        "1m"), from that rollup or (``raw``) the raw rows: first step and value (the lowest
        rank's at the first step), min, max, mean and non-finite count of every value logged
        in each bucket."""
        res = RESOLUTIONS[resolution]
        width = math.ceil((t1 - t0 + 1) / max(1, points))
        w = max(res, math.ceil(width / res) * res)
        b0, b1 = math.floor(t0 / res) * res, math.floor(t1 / res) * res
        if raw:
            sql = (
                "SELECT intDiv(toInt64(floor(time / {r:Int64})) * {r:Int64}, {w:Int64}) AS b,"
                " min(step) AS s_first, argMin(value, (step, rank)) AS v_first,"
                " min(value) AS v_min, max(value) AS v_max, sum(value) AS v_sum, count() AS n,"
                " countIf(NOT isFinite(value)) AS bad FROM {db}.scalars"
                " WHERE tenant = {tenant:String} AND run_id = {run:String}"
                " AND name = {name:String} AND time >= {b0:Int64}"
                " AND time < {b1:Int64} + {r:Int64} GROUP BY b ORDER BY b"
            )
        else:
            sql = (
                "SELECT intDiv(bucket, {w:Int64}) AS b, min(step_min) AS s_first,"
                " argMinMerge(`first`) AS v_first, min(v_min) AS v_min, max(v_max) AS v_max,"
                " sum(v_sum) AS v_sum, sum(n) AS n, sum(non_finite) AS bad"
                f" FROM {{db}}.rollup_scalars_{resolution} WHERE tenant = {{tenant:String}}"
                " AND run_id = {run:String} AND name = {name:String}"
                " AND bucket BETWEEN {b0:Int64} AND {b1:Int64} GROUP BY b ORDER BY b"
            )
        rows = self.r.rows(sql, run=run_id, name=name, r=res, w=w, b0=b0, b1=b1)
        return [
            {
                "step": r["s_first"],
                "time": r["b"] * w,
                "value": _num(r["v_first"]),
                "min": _num(r["v_min"]),
                "max": _num(r["v_max"]),
                "mean": _num(r["v_sum"] / r["n"]) if r["n"] else None,
                "nonFinite": r["bad"],
            }
            for r in rows
        ]
