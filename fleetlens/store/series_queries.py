"""A run's scalar series bucketed in the store, bound to one tenant: per bucket of steps from the
raw rows, per bucket of time from the raw rows or a rollup (:mod:`fleetlens.store.rollups`), and
what either holds of a scalar. :mod:`fleetlens.services.series` chooses the source and the
bucket width.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from .reader import TenantReader
from .rollups import RESOLUTIONS

__all__ = ["ScalarSeriesQueries", "Span"]


@dataclass(frozen=True)
class Span:
    """What is stored of one scalar in a window: steps ``lo..hi``, times ``t0..t1``."""

    lo: int
    hi: int
    t0: float
    t1: float
    n: int


class ScalarSeriesQueries:
    def __init__(self, reader: TenantReader) -> None:
        self.r = reader

    def names(self, run_id: str, raw: bool) -> pa.Table:
        """The run's scalars in the raw rows (or the 1 min rollup), by name: name, n (values),
        lo and hi (first and last step)."""
        if raw:
            sql = (
                "SELECT name, count() AS n, min(step) AS lo, max(step) AS hi FROM {db}.scalars"
                " WHERE run_id = {run:String} GROUP BY name ORDER BY name"
            )
        else:
            sql = (
                "SELECT name, sum(n) AS n, min(step_min) AS lo, max(step_max) AS hi"
                " FROM {db}.rollup_scalars_1m WHERE run_id = {run:String}"
                " GROUP BY name ORDER BY name"
            )
        return self.r.table(sql, run=run_id)

    def step_buckets(self, run_id: str, name: str, lo: int, hi: int, width: int) -> pa.Table:
        """``name`` over steps ``lo..hi`` in buckets of ``width`` steps, each step's value the
        lowest rank's: b (bucket), s_first (its first step), v_first, v_min, v_max, v_mean,
        bad (non-finite values)."""
        return self.r.table(
            "SELECT intDiv(step - {lo:Int64}, {w:Int64}) AS b, min(step) AS s_first,"
            " argMin(v, step) AS v_first, min(v) AS v_min, max(v) AS v_max, avg(v) AS v_mean,"
            " countIf(NOT isFinite(v)) AS bad FROM ("
            " SELECT step, argMin(value, rank) AS v FROM {db}.scalars"
            " WHERE run_id = {run:String} AND name = {name:String}"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64}"
            " GROUP BY step) GROUP BY b ORDER BY b",
            run=run_id,
            name=name,
            lo=lo,
            hi=hi,
            w=width,
        )

    def span(self, run_id: str, name: str, lo: int, hi: int, raw: bool) -> Span:
        """What the raw rows (or the 1 min rollup) hold of ``name`` within steps ``lo..hi``
        (n 0 and hi ``lo - 1``: nothing)."""
        if raw:
            sql = (
                "SELECT min(step) AS lo, max(step) AS hi, min(time) AS t0, max(time) AS t1,"
                " count() AS n FROM {db}.scalars"
                " WHERE run_id = {run:String} AND name = {name:String}"
                " AND step BETWEEN {lo:Int64} AND {hi:Int64}"
            )
        else:
            sql = (
                "SELECT min(step_min) AS lo, max(step_max) AS hi, min(bucket) AS t0,"
                " max(bucket) + 59 AS t1, sum(n) AS n FROM {db}.rollup_scalars_1m"
                " WHERE run_id = {run:String} AND name = {name:String}"
                " AND step_max >= {lo:Int64} AND step_min <= {hi:Int64}"
            )
        row = self.r.rows(sql, run=run_id, name=name, lo=lo, hi=hi)[0]
        if not row["n"]:
            return Span(lo, lo - 1, 0.0, 0.0, 0)
        return Span(int(row["lo"]), int(row["hi"]), float(row["t0"]), float(row["t1"]), row["n"])

    def time_buckets(
        self, run_id: str, name: str, resolution: str, width: int, b0: int, b1: int, raw: bool
    ) -> pa.Table:
        """``name`` in buckets of ``width`` seconds (a multiple of ``resolution``, "10s" or
        "1m") over the ``resolution`` buckets ``b0..b1``, from that rollup or (``raw``) the raw
        rows: b (bucket), s_first (its first step), v_first (the lowest rank's at that step),
        v_min, v_max, v_sum, n (values), bad (non-finite values)."""
        res = RESOLUTIONS[resolution]
        if raw:
            sql = (
                "SELECT intDiv(toInt64(floor(time / {r:Int64})) * {r:Int64}, {w:Int64}) AS b,"
                " min(step) AS s_first, argMin(value, (step, rank)) AS v_first,"
                " min(value) AS v_min, max(value) AS v_max, sum(value) AS v_sum, count() AS n,"
                " countIf(NOT isFinite(value)) AS bad FROM {db}.scalars"
                " WHERE run_id = {run:String} AND name = {name:String} AND time >= {b0:Int64}"
                " AND time < {b1:Int64} + {r:Int64} GROUP BY b ORDER BY b"
            )
        else:
            sql = (
                "SELECT intDiv(bucket, {w:Int64}) AS b, min(step_min) AS s_first,"
                " argMinMerge(`first`) AS v_first, min(v_min) AS v_min, max(v_max) AS v_max,"
                " sum(v_sum) AS v_sum, sum(n) AS n, sum(non_finite) AS bad"
                f" FROM {{db}}.rollup_scalars_{resolution}"
                " WHERE run_id = {run:String} AND name = {name:String}"
                " AND bucket BETWEEN {b0:Int64} AND {b1:Int64} GROUP BY b ORDER BY b"
            )
        return self.r.table(sql, run=run_id, name=name, r=res, w=width, b0=b0, b1=b1)
