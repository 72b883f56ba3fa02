"""A run's per-metric alert inputs (seed 001 s36), sampled by the monitor.

Each is a number over the run's recent steps, or None when the run does not send what it needs:
MFU and tokens/s (the run summary's), the slowest rank's step time over the mean rank's, the
share of the ranks' step time in collectives and in data waits, the share of rank-steps whose
prefetch queue was empty and the p99 storage read latency (``Run.data``), and the hottest GPU of
the nodes the run's latest attempt is placed on. The names are :data:`fleetlens.alerts.policy.
METRICS`'s; the monitor keeps them as series for the alert engine and exports them on /metrics.
"""

from __future__ import annotations

import math
from typing import Any

from ..schema import DATA_SCALARS
from ..store.reader import TenantReader
from .goodput import summary_mfu

__all__ = ["RECENT_STEPS", "metric_samples"]

RECENT_STEPS = 20
GPU_WINDOW_S = 120.0


def _num(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def metric_samples(
    reader: TenantReader, run_id: str, config: dict[str, Any], summary: dict[str, Any], now: float
) -> dict[str, float | None]:
    m = summary.get("metrics", {})
    step_max, step_mean = _num(m.get("stepTimeMs")), _num(m.get("meanRankStepTimeMs"))
    # the MFU /metrics exports: a scalar the job logs as "mfu" wins, else the config's FLOPs
    mfu = _num(m["mfu"]) if m.get("mfu") is not None else summary_mfu(config, summary)[0]
    out: dict[str, float | None] = {
        "mfu": mfu,
        "tokens_per_s": _num(m.get("tokensPerSecond")),
        "rank_step_ratio": step_max / step_mean if step_max and step_mean else None,
    }
    last = summary.get("step")
    if last is None:
        return out
    lo = int(last) - RECENT_STEPS + 1
    shares = reader.rows(
        "SELECT sum(if(isFinite(comm), comm, 0)) / sum(duration) AS c,"
        " sum(if(isFinite(data_wait), data_wait, 0)) / sum(duration) AS d,"
        " countIf(isFinite(comm)) AS nc, countIf(isFinite(data_wait)) AS nd"
        " FROM {db}.steps WHERE tenant = {tenant:String} AND run_id = {run:String}"
        " AND step >= {lo:Int64} AND duration > 0",
        run=run_id,
        lo=lo,
    )[0]
    out["comm_ratio"] = _num(shares["c"]) if shares["nc"] else None
    out["data_wait_ratio"] = _num(shares["d"]) if shares["nd"] else None
    depth, latency = DATA_SCALARS["queue_depth"], DATA_SCALARS["read_latency_s"]
    data = reader.rows(
        "SELECT avgIf(value < 1, name = {depth:String}) AS empty,"
        " countIf(name = {depth:String}) AS nq,"
        " quantileExactIf(0.99)(value, name = {lat:String}) AS p99,"
        " countIf(name = {lat:String}) AS nl"
        " FROM {db}.scalars WHERE tenant = {tenant:String} AND run_id = {run:String}"
        " AND name IN ({depth:String}, {lat:String}) AND step >= {lo:Int64}",
        run=run_id,
        lo=lo,
        depth=depth,
        lat=latency,
    )[0]
    out["prefetch_empty_share"] = _num(data["empty"]) if data["nq"] else None
    out["storage_read_p99_s"] = _num(data["p99"]) if data["nl"] else None
    hot = reader.rows(
        "SELECT maxIf(gpu_temp, isFinite(gpu_temp)) AS t, countIf(isFinite(gpu_temp)) AS n"
        " FROM {db}.gpu_samples WHERE tenant = {tenant:String} AND time >= {since:Float64}"
        " AND node_id IN (SELECT node_id FROM {db}.placement WHERE tenant = {tenant:String}"
        "  AND run_id = {run:String} AND job_id = (SELECT argMax(job_id, time)"
        "  FROM {db}.placement WHERE tenant = {tenant:String} AND run_id = {run:String}))",
        run=run_id,
        since=now - GPU_WINDOW_S,
    )[0]
    out["gpu_temp_max"] = _num(hot["t"]) if hot["n"] else None
    return out
