"""The JSON of the scheduler records' routes (:mod:`fleetlens.api.scheduler`), beside
:mod:`fleetlens.api.models`, whose conventions these follow: camelCase on the wire, unknown keys
refused."""

from __future__ import annotations

from typing import Any

from ..services.scheduler import Allocation, CapacityRecord, FileSummary, RunScheduling
from .goodput_models import PoolSchedulingOut, RunSchedulingOut
from .models import ApiModel

__all__ = [
    "AllocationOut",
    "AllocationsOut",
    "CapacityOut",
    "CapacityRowOut",
    "SchedulerImportOut",
    "scheduling_out",
]


def scheduling_out(s: RunScheduling) -> RunSchedulingOut:
    """A run's scheduling factor as ``GET /v1/runs/{run_id}/goodput`` answers it: ``pools`` and
    ``jobs`` only for one worked out from the run's allocations."""
    more: dict[str, Any] = {}
    if s.pools is not None:
        more["pools"] = [
            PoolSchedulingOut.model_validate(
                {
                    "pool": p.pool,
                    "factor": p.factor,
                    "basis": p.basis,
                    "from": p.start,
                    "to": p.end,
                    "heldGpuSeconds": p.held_gpu_seconds,
                }
            )
            for p in s.pools
        ]
    if s.jobs is not None:
        more["jobs"] = s.jobs
    return RunSchedulingOut(factor=s.factor, basis=s.basis, **more)


class AllocationOut(ApiModel):
    pool: str
    job_id: str
    run_id: str | None
    gpus: int
    state: str
    submit: float | None
    start: float | None
    gang_complete: float | None
    gang_never_complete: bool
    end: float | None
    queue_wait_seconds: float | None

    @classmethod
    def of(cls, a: Allocation) -> AllocationOut:
        return cls(
            pool=a.pool,
            job_id=a.job_id,
            run_id=a.run_id,
            gpus=a.gpus,
            state=a.state,
            submit=a.submit,
            start=a.start,
            gang_complete=a.gang_complete,
            gang_never_complete=a.gang_never_complete,
            end=a.end,
            queue_wait_seconds=a.queue_wait_seconds,
        )


class AllocationsOut(ApiModel):
    allocations: list[AllocationOut]
    scheduling: RunSchedulingOut | None = None


class CapacityRowOut(ApiModel):
    pool: str
    time: float
    capacity_gpus: int
    in_service_gpus: int

    @classmethod
    def of(cls, c: CapacityRecord) -> CapacityRowOut:
        return cls(
            pool=c.pool,
            time=c.time,
            capacity_gpus=c.capacity_gpus,
            in_service_gpus=c.in_service_gpus,
        )


class CapacityOut(ApiModel):
    pools: list[CapacityRowOut]


class SchedulerImportOut(ApiModel):
    format: str
    stored: bool
    allocations: int
    capacity: list[CapacityRowOut]
    started: int | None = None
    pending: int | None = None
    gpus: int | None = None
    pools: list[str] | None = None
    run_ids: list[str] | None = None
    pods: int | None = None
    pending_reasons: dict[str, str] | None = None

    @classmethod
    def of(cls, s: FileSummary) -> SchedulerImportOut:
        """Only the keys the file had: no ``started`` ... ``runIds`` without allocations, no
        ``pods`` or ``pendingReasons`` unless the file said them."""
        more: dict[str, Any] = {}
        for key in ("started", "pending", "gpus", "pools", "run_ids", "pods", "pending_reasons"):
            value = getattr(s, key)
            if value is not None:
                more[key] = value
        return cls(
            format=s.format,
            stored=s.stored,
            allocations=s.allocations,
            capacity=[CapacityRowOut.of(c) for c in s.capacity],
            **more,
        )
