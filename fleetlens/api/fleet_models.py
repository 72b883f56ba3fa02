"""The JSON of the fleet's goodput per pool (``GET /v1/fleet/goodput``, the capacity page), beside
:mod:`fleetlens.api.models`, whose conventions these follow: camelCase on the wire, unknown keys
refused."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .goodput_models import TimeWindowOut
from .models import ApiModel

if TYPE_CHECKING:
    from ..analysis.scheduling import SchedulingResult

__all__ = ["FleetGoodputOut", "GpuHoursOut", "PoolGoodputOut", "PoolSharesOut"]


class GpuHoursOut(ApiModel):
    installed: float
    in_service: float
    complete_allocations: float
    partial_gangs: float
    stranded_while_queued: float
    idle_no_demand: float
    oversubscribed: float


class PoolSharesOut(ApiModel):
    """Shares of in-service GPU-time."""

    complete: float
    partial: float
    stranded: float
    no_demand: float


class PoolGoodputOut(ApiModel):
    pool: str
    window: TimeWindowOut
    scheduling_goodput: float
    availability: float
    gpu_hours: GpuHoursOut
    shares: PoolSharesOut
    queue_wait_seconds: dict[str, float]
    jobs: int
    started: int
    pending: int

    @classmethod
    def of(cls, pool: str, r: SchedulingResult) -> PoolGoodputOut:
        ins = r.in_service_gpu_s or float("inf")
        return cls(
            pool=pool,
            window=TimeWindowOut.of(r.t0, r.t1),
            scheduling_goodput=r.scheduling_goodput,
            availability=r.availability,
            gpu_hours=GpuHoursOut(
                installed=r.installed_gpu_s / 3600,
                in_service=r.in_service_gpu_s / 3600,
                complete_allocations=r.complete_gpu_s / 3600,
                partial_gangs=r.partial_gpu_s / 3600,
                stranded_while_queued=r.stranded_gpu_s / 3600,
                idle_no_demand=r.no_demand_gpu_s / 3600,
                oversubscribed=r.oversubscribed_gpu_s / 3600,
            ),
            shares=PoolSharesOut(
                complete=r.complete_gpu_s / ins,
                partial=r.partial_gpu_s / ins,
                stranded=r.stranded_gpu_s / ins,
                no_demand=r.no_demand_gpu_s / ins,
            ),
            queue_wait_seconds=r.queue_wait_s,
            jobs=r.jobs,
            started=r.started,
            pending=r.pending,
        )


class FleetGoodputOut(ApiModel):
    pools: list[PoolGoodputOut]
