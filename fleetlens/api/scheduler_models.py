"""The JSON of the scheduler records' routes (:mod:`fleetlens.api.scheduler`), beside
:mod:`fleetlens.api.models`, whose conventions these follow: camelCase on the wire, unknown keys
refused."""

from __future__ import annotations

from .goodput_models import RunSchedulingOut
from .models import ApiModel

__all__ = ["AllocationOut", "AllocationsOut", "CapacityOut", "CapacityRowOut", "SchedulerImportOut"]


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


class AllocationsOut(ApiModel):
    allocations: list[AllocationOut]
    scheduling: RunSchedulingOut | None = None


class CapacityRowOut(ApiModel):
    pool: str
    time: float
    capacity_gpus: int
    in_service_gpus: int


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
