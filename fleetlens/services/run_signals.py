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

from ..store.reader import TenantReader
from ..store.run_queries import RunTelemetryQueries
from .goodput import summary_mfu
from .runs_types import RunSummary

__all__ = ["RECENT_STEPS", "metric_samples"]

RECENT_STEPS = 20
GPU_WINDOW_S = 120.0


def _num(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def metric_samples(
    reader: TenantReader, run_id: str, config: dict[str, Any], summary: RunSummary, now: float
) -> dict[str, float | None]:
    step_max, step_mean = _num(summary.step_time_ms), _num(summary.mean_rank_step_time_ms)
    # the MFU /metrics exports: a scalar the job logs as "mfu" wins, else the config's FLOPs
    logged = summary.scalars.get("mfu")
    mfu = _num(logged) if logged is not None else summary_mfu(config, summary)[0]
    out: dict[str, float | None] = {
        "mfu": mfu,
        "tokens_per_s": _num(summary.tokens_per_second),
        "rank_step_ratio": step_max / step_mean if step_max and step_mean else None,
    }
    last = summary.step
    if last is None:
        return out
    lo = int(last) - RECENT_STEPS + 1
    q = RunTelemetryQueries(reader)
    comm, data_wait = q.recent_shares(run_id, lo)
    out["comm_ratio"] = _num(comm)
    out["data_wait_ratio"] = _num(data_wait)
    empty, read_p99 = q.recent_data(run_id, lo)
    out["prefetch_empty_share"] = _num(empty)
    out["storage_read_p99_s"] = _num(read_p99)
    out["gpu_temp_max"] = _num(q.hottest_gpu(run_id, now - GPU_WINDOW_S))
    return out
