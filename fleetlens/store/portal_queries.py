"""Reads the web portal draws: step-time bands and the rank x step heatmap, downsampled here.

A chart is a few hundred pixels wide, so nothing here returns more points than that: the step
series comes from the per-step rollup ``steps_by_step`` bucketed to ``points`` step buckets, and
the heatmap from the per-rank ``steps`` table bucketed to rank buckets x step buckets with the
maximum compute time per cell (a max keeps one slow rank visible in a bucket of many). Every
query is bound to the caller's tenant given at construction, as in :mod:`.run_queries`.
Aliases are prefixed (``b_``, ``h_``...): ClickHouse resolves a bare column name inside an
aggregate to a same-named alias.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .ddl import COMPUTE_SQL
from .scope import Scope
from .telemetry import TelemetryStore

__all__ = ["HEATMAP_ROWS_BUDGET", "PortalQueries"]

HEATMAP_ROWS_BUDGET = 2_000_000
"""Rank-step rows the default heatmap window reads: ~2,000 steps at 1,024 ranks, ~120 at 16k."""


def _f(x: Any) -> float | None:
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def _r(x: Any, digits: int = 4) -> float | None:
    v = _f(x)
    return None if v is None else round(v, digits)


class PortalQueries:
    def __init__(self, telemetry: TelemetryStore, scope: Scope) -> None:
        self.t = telemetry
        self.db = telemetry.database
        self.tenant = scope.tenant

    def _q(self, sql: str, **params: Any) -> Any:
        params["tenant"] = self.tenant
        return self.t.query(sql.replace("{db}", self.db), params)

    def step_range(self, run_id: str) -> tuple[int, int, int] | None:
        """First step, last step and the latest step's rank count (from the rollup)."""
        row = self._q(
            "SELECT min(step) AS r_lo, max(step) AS r_hi, argMax(ranks, step) AS r_world,"
            " count() AS r_n FROM {db}.steps_by_step"
            " WHERE tenant = {tenant:String} AND run_id = {run:String}",
            run=run_id,
        ).to_pylist()[0]
        if not row["r_n"]:
            return None
        return int(row["r_lo"]), int(row["r_hi"]), int(row["r_world"])

    def step_series(self, run_id: str, lo: int, hi: int, points: int) -> list[dict[str, Any]]:
        """Per step bucket: the job's step time (median and max over the bucket's steps), the
        slowest and the mean rank's compute, tokens, and tokens/s. A replayed step counts once,
        at its latest attempt."""
        width = max(1, math.ceil((hi - lo + 1) / max(1, points)))
        rows = self._q(
            "SELECT intDiv(step - {lo:Int64}, {w:Int64}) AS b, min(step) AS b_step,"
            " quantile(0.5)(p_dur) AS b_med, max(p_dur) AS b_max, min(p_dur) AS b_min,"
            " avg(p_cmax) AS b_cmax, avg(p_cmean) AS b_cmean, sum(p_tokens) AS b_tokens,"
            " sum(p_end - p_start) AS b_busy, min(p_start) AS b_t0, count() AS b_n FROM ("
            "  SELECT step, argMax(s_max, s_start) AS p_dur, argMax(s_cmax, s_start) AS p_cmax,"
            "  argMax(s_csum / s_ranks, s_start) AS p_cmean, argMax(s_tokens, s_start) AS p_tokens,"
            "  max(s_start) AS p_start, argMax(s_end, s_start) AS p_end FROM ("
            "   SELECT step, job_id, min(start) AS s_start, max(`end`) AS s_end,"
            "   max(max_duration) AS s_max, max(max_compute) AS s_cmax,"
            "   sum(sum_compute) AS s_csum, sum(ranks) AS s_ranks, sum(tokens) AS s_tokens"
            "   FROM {db}.steps_by_step WHERE tenant = {tenant:String} AND run_id = {run:String}"
            "   AND step BETWEEN {lo:Int64} AND {hi:Int64} GROUP BY step, job_id)"
            "  GROUP BY step)"
            " GROUP BY b ORDER BY b",
            run=run_id,
            lo=lo,
            hi=hi,
            w=width,
        ).to_pylist()
        out = []
        for r in rows:
            busy = _f(r["b_busy"]) or 0.0
            out.append(
                {
                    "step": int(r["b_step"]),
                    "steps": int(r["b_n"]),
                    "t": _r(r["b_t0"], 1),
                    "p50": _r(r["b_med"]),
                    "max": _r(r["b_max"]),
                    "min": _r(r["b_min"]),
                    "computeMax": _r(r["b_cmax"]),
                    "computeMean": _r(r["b_cmean"]),
                    "tokens": int(r["b_tokens"] or 0),
                    "tokensPerSecond": round(r["b_tokens"] / busy, 1) if busy > 0 else None,
                }
            )
        return out

    def heatmap(
        self, run_id: str, lo: int, hi: int, world: int, rank_buckets: int, step_buckets: int
    ) -> dict[str, Any]:
        """Rank buckets x step buckets of the maximum compute time (ms) per cell, the hot row
        (highest median ratio to its column's median) and the slowest rank inside it."""
        rw = max(1, math.ceil(max(world, 1) / max(1, rank_buckets)))
        sw = max(1, math.ceil((hi - lo + 1) / max(1, step_buckets)))
        table = self._q(
            f"SELECT intDiv(rank, {{rw:Int64}}) AS h_rb, intDiv(step - {{lo:Int64}}, {{sw:Int64}})"
            f" AS h_sb, max({COMPUTE_SQL}) AS h_max FROM {{db}}.steps"
            " WHERE tenant = {tenant:String} AND run_id = {run:String}"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64} GROUP BY h_rb, h_sb",
            run=run_id,
            lo=lo,
            hi=hi,
            rw=rw,
            sw=sw,
        )
        n_rows = max(1, math.ceil(max(world, 1) / rw))
        n_cols = max(1, math.ceil((hi - lo + 1) / sw))
        grid = np.full((n_rows, n_cols), np.nan)
        if table.num_rows:
            rb = table.column("h_rb").to_numpy().astype(np.int64)
            sb = table.column("h_sb").to_numpy().astype(np.int64)
            v = table.column("h_max").to_numpy(zero_copy_only=False).astype(np.float64)
            ok = (rb >= 0) & (rb < n_rows) & (sb >= 0) & (sb < n_cols)
            grid[rb[ok], sb[ok]] = v[ok] * 1000.0
        hot: dict[str, Any] | None = None
        with np.errstate(all="ignore"):
            col_med = np.nanmedian(np.where(np.isfinite(grid), grid, np.nan), axis=0)
            ratio = grid / col_med
            row_score = np.nanmedian(np.where(np.isfinite(ratio), ratio, np.nan), axis=1)
        if np.isfinite(row_score).any():
            row = int(np.nanargmax(row_score))
            hot = {
                "row": row,
                "rankFrom": row * rw,
                "rankTo": min(world, (row + 1) * rw) - 1,
                "ratio": _r(row_score[row]),
                "rank": self._slowest_rank(run_id, lo, hi, row * rw, (row + 1) * rw - 1),
            }
        cells = [[None if not math.isfinite(x) else round(float(x), 1) for x in r] for r in grid]
        return {
            "fromStep": lo,
            "toStep": hi,
            "ranksPerRow": rw,
            "stepsPerColumn": sw,
            "rows": n_rows,
            "columns": n_cols,
            "unit": "ms",
            "signal": "compute",
            "cells": cells,
            "hot": hot,
        }

    def _slowest_rank(self, run_id: str, lo: int, hi: int, r0: int, r1: int) -> int | None:
        rows = self._q(
            f"SELECT rank, quantile(0.5)({COMPUTE_SQL}) AS k_c FROM {{db}}.steps"
            " WHERE tenant = {tenant:String} AND run_id = {run:String}"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64} AND rank BETWEEN {r0:Int64} AND {r1:Int64}"
            " GROUP BY rank ORDER BY k_c DESC, rank LIMIT 1",
            run=run_id,
            lo=lo,
            hi=hi,
            r0=r0,
            r1=r1,
        ).to_pylist()
        return int(rows[0]["rank"]) if rows else None

    def recent_spread(self, run_id: str, window: int = 100) -> dict[str, Any] | None:
        """Per-rank spread over the last ``window`` steps: (slowest - mean compute) / mean."""
        rows = self._q(
            "SELECT avg(s_cmax) AS x_max, avg(s_cmean) AS x_mean, count() AS x_n FROM ("
            " SELECT step, max(max_compute) AS s_cmax, sum(sum_compute) / sum(ranks) AS s_cmean"
            " FROM {db}.steps_by_step WHERE tenant = {tenant:String} AND run_id = {run:String}"
            " AND step > (SELECT max(step) FROM {db}.steps_by_step WHERE tenant ="
            " {tenant:String} AND run_id = {run:String}) - {window:Int64} GROUP BY step)",
            run=run_id,
            window=window,
        ).to_pylist()[0]
        if not rows["x_n"]:
            return None
        mx, mean = _f(rows["x_max"]), _f(rows["x_mean"])
        return {
            "steps": int(rows["x_n"]),
            "computeMaxMs": None if mx is None else round(mx * 1000, 2),
            "computeMeanMs": None if mean is None else round(mean * 1000, 2),
            "spread": (mx - mean) / mean if mx is not None and mean else None,
        }

    def events(
        self, kinds: tuple[str, ...], since: float, run_id: str | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        """Events of the given kinds after ``since`` (all the tenant's runs, or one)."""
        rows = self._q(
            "SELECT time, run_id, job_id, step, rank, kind, node_id, gpu, message FROM {db}.events"
            " WHERE tenant = {tenant:String} AND kind IN {kinds:Array(String)}"
            " AND time >= {since:Float64}"
            + (" AND run_id = {run:String}" if run_id else "")
            + " ORDER BY time DESC LIMIT {limit:UInt32}",
            kinds=list(kinds),
            since=since,
            run=run_id or "",
            limit=limit,
        ).to_pylist()
        return [
            {
                "time": r["time"],
                "runId": r["run_id"],
                "jobId": r["job_id"],
                "step": int(r["step"]) if r["step"] >= 0 else None,
                "rank": int(r["rank"]) if r["rank"] >= 0 else None,
                "kind": r["kind"],
                "node": r["node_id"] or None,
                "gpu": int(r["gpu"]) if r["gpu"] >= 0 else None,
                "message": r["message"],
            }
            for r in rows
        ]
