"""Scalar series of a run, downsampled in the store to the number of points a chart can show."""

from __future__ import annotations

import math
from typing import Any

from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore

__all__ = ["SeriesQueries"]


def _num(v: Any) -> float | str | None:
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else str(f)


class SeriesQueries:
    def __init__(self, telemetry: TelemetryStore, scope: Scope) -> None:
        self.r = TenantReader(telemetry, scope)

    def names(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.r.rows(
            "SELECT name, count() AS n, min(step) AS lo, max(step) AS hi "
            "FROM {db}.scalars WHERE tenant = {tenant:String} "
            "AND run_id = {run:String} GROUP BY name ORDER BY name",
            run=run_id,
        )
        return [
            {"name": r["name"], "points": r["n"], "fromStep": r["lo"], "toStep": r["hi"]}
            for r in rows
        ]

    def step_span(self, run_id: str, name: str, from_step: int, to_step: int) -> tuple[int, int]:
        """The steps of ``name`` stored within [from_step, to_step], as (first, last); what was
        stored, not what the run registry last recorded (it is written every few seconds)."""
        row = self.r.rows(
            "SELECT min(step) AS lo, max(step) AS hi, count() AS n FROM {db}.scalars"
            " WHERE tenant = {tenant:String} AND run_id = {run:String} AND name = {name:String}"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64}",
            run=run_id,
            name=name,
            lo=from_step,
            hi=to_step,
        )[0]
        return (int(row["lo"]), int(row["hi"])) if row["n"] else (from_step, from_step - 1)

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
