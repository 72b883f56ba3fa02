"""Reads of the portal's rank page: one rank's phase timings and its GPU's samples.

The heatmap's click-through lands here. Per bucket of steps (``points`` at most), the rank's
mean forward, backward, optimizer, compute, communication and input wait next to the mean rank's
compute (from the rollup); where the rank ran (its placement in each job attempt: a restart may
move it); and, per bucket of time over the window's span, its GPU's DCGM samples (SM clock and
its maximum, temperature, power, framebuffer in use, the largest Xid). The heatmap's rows name
their rank's node and GPU from here too. The statements are
those of :class:`~fleetlens.store.portal_queries.RankStoreQueries`, bound to the caller's tenant.
"""

from __future__ import annotations

import math
from typing import Any

from ..store.portal_queries import RankStoreQueries
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from .portal_types import GpuSample, HeatmapRows, PhaseBucket, Placement

__all__ = ["RankQueries"]


def _f(x: Any, digits: int = 4) -> float | None:
    if x is None:
        return None
    v = float(x)
    return round(v, digits) if math.isfinite(v) else None


class RankQueries:
    def __init__(self, telemetry: TelemetryStore, scope: Scope) -> None:
        self.q = RankStoreQueries(TenantReader(telemetry, scope))

    def placements(self, run_id: str, rank: int) -> list[Placement]:
        """Where ``rank`` ran, one row per job attempt, oldest first."""
        rows = self.q.placements(run_id, rank).to_pylist()
        return [
            Placement(job_id=r["p_job"], node=r["p_node"], gpu=int(r["p_gpu"]), time=r["p_time"])
            for r in rows
        ]

    def phases(self, run_id: str, rank: int, lo: int, hi: int, points: int) -> list[PhaseBucket]:
        """Per bucket of steps in [lo, hi]: the rank's mean phase timings (seconds) and the
        mean rank's compute; ``t``: the bucket's first start."""
        width = max(1, math.ceil((hi - lo + 1) / max(1, points)))
        mine = self.q.phase_buckets(run_id, rank, lo, hi, width).to_pylist()
        mean = {
            int(r["b"]): r["m_c"]
            for r in self.q.mean_compute_buckets(run_id, lo, hi, width).to_pylist()
        }
        return [
            PhaseBucket(
                step=int(r["k_step"]),
                t=_f(r["k_t"], 2),
                forward=_f(r["k_fw"], 5),
                backward=_f(r["k_bw"], 5),
                optimizer=_f(r["k_opt"], 5),
                compute=_f(r["k_compute"], 5),
                comm=_f(r["k_comm"], 5),
                data_wait=_f(r["k_wait"], 5),
                duration=_f(r["k_dur"], 5),
                compute_mean=_f(mean.get(int(r["b"])), 5),
            )
            for r in mine
        ]

    def gpu_samples(
        self, node: str, gpu: int, t0: float, t1: float, points: int
    ) -> list[GpuSample]:
        """Per bucket of time in [t0, t1]: the GPU's mean SM clock (MHz), its maximum clock,
        mean temperature (°C), power (W), framebuffer in use (MiB) and the largest Xid."""
        width = max(1.0, (t1 - t0) / max(1, points))
        rows = self.q.gpu_sample_buckets(node, gpu, t0, t1, math.ceil(width)).to_pylist()
        return [
            GpuSample(
                t=_f(r["g_t"], 2),
                sm_clock=_f(r["g_clock"], 1),
                sm_clock_max=_f(r["g_clock_max"], 1),
                temp=_f(r["g_temp"], 1),
                power=_f(r["g_power"], 1),
                fb_used=_f(r["g_fb"], 1),
                xid=int(r["g_xid"]) if _f(r["g_xid"]) else 0,
            )
            for r in rows
        ]

    def time_span(self, run_id: str, lo: int, hi: int) -> tuple[float, float] | None:
        """The first start and last end of steps [lo, hi] (None: no step)."""
        return self.q.time_span(run_id, lo, hi)

    def rows(self, run_id: str, ranks: list[int]) -> HeatmapRows:
        """The heatmap's rows: the rank each opens (``ranks``, one per row) and its node and GPU
        (its latest placement)."""
        places = {
            int(r["rank"]): (r["x_node"], int(r["x_gpu"]))
            for r in self.q.latest_placements(run_id, ranks).to_pylist()
        }
        return HeatmapRows(
            rank=ranks,
            node=[places.get(k, (None, None))[0] for k in ranks],
            gpu=[places.get(k, (None, None))[1] for k in ranks],
        )
