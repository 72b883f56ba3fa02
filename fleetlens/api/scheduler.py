"""Scheduler records: ``POST /v1/scheduler/import`` (one file as the scheduler printed it) and
``GET /v1/scheduler/allocations`` / ``GET /v1/scheduler/capacity`` (what was stored).

The body is JSON: ``{"format": "sacct"|"sinfo"|"k8s"|"alibaba", "data": TEXT}``, with ``runId``
(tag every allocation with a run), ``pool`` (the pool of a k8s, alibaba or sacct file), ``tz``
(sacct's cluster time zone), ``epoch`` (alibaba's trace origin), ``nodes`` (alibaba's GPU node
list: the pool's capacity), ``time`` (when sinfo ran) and ``dryRun``. The whole file is parsed
before anything is stored: a bad line is a 400 that names it, and nothing is stored.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

import anyio
import msgspec
from fastapi import APIRouter, Depends, Query, Request

from ..errors import TraceFormatError
from ..services import scheduler
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require, require_any
from .bodies import BodyBudget, read_upload
from .body_limit import OWN_BODY
from .scheduler_models import (
    AllocationOut,
    AllocationsOut,
    CapacityOut,
    CapacityRowOut,
    SchedulerImportOut,
    scheduling_out,
)

__all__ = ["IMPORT_COMPONENTS", "MAX_BODY_BYTES", "router"]

router = APIRouter(prefix="/v1", tags=["scheduler"], responses=ERROR_RESPONSES)

MAX_BODY_BYTES = 128 << 20
"""The largest file: a month of a large partition's sacct, or a big namespace's pods and events."""


class SchedulerImport(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    format: Literal["sacct", "sinfo", "k8s", "alibaba"]
    data: str
    run_id: str | None = None
    pool: str | None = None
    tz: str = "UTC"
    epoch: float = 0.0
    nodes: str | None = None
    time: float | None = None
    dry_run: bool = False


(_SCHEMA,), IMPORT_COMPONENTS = msgspec.json.schema_components(
    [SchedulerImport], ref_template="#/components/schemas/{name}"
)  # the components go into the OpenAPI document's (fleetlens/api/app.py)


@router.post(
    "/scheduler/import",
    summary="Import scheduler records: Slurm sacct/sinfo, Kubernetes pods and events, Alibaba",
    description="`data` is the file as the tool printed it: `sacct --allocations --parsable2 "
    "--format=JobID,JobName,Partition,AllocTRES,Submit,Start,End,State,NNodes` (allocations), "
    "`sinfo --Node --format='%N|%P|%T|%G'` (capacity per partition), `kubectl get pods,events "
    "-o json` (allocations per job), or the Alibaba 2023 trace's `openb_pod_list_*.csv` (with "
    "`nodes`, its `openb_node_list_gpu_node.csv`). Allocations feed `GET /v1/fleet/goodput` and "
    "the scheduling factor of the run they belong to (`runId`, or the job id the run carries) in "
    "`GET /v1/runs/{run_id}/goodput`; importing the same file again changes nothing.",
    response_model=SchedulerImportOut,
    response_model_exclude_unset=True,
    openapi_extra={
        OWN_BODY: True,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _SCHEMA}}},
    },
    responses={
        400: {
            "description": "The file is not in the format (the error names the line or "
            "field); nothing stored"
        },
        408: {"description": "The body did not arrive in time; retry later"},
        413: {"description": f"Over {MAX_BODY_BYTES} bytes; nothing stored"},
        429: {"description": "The server holds as many bodies as it may; retry after Retry-After"},
    },
)
async def post_scheduler_import(
    request: Request, scope: Annotated[Scope, Depends(require_any("write", "ingest"))]
) -> SchedulerImportOut:
    svc = request.app.state.services
    body = await read_upload(
        request, MAX_BODY_BYTES, "import the records of a shorter period per request"
    )
    budget: BodyBudget = request.app.state.body_budget

    def work() -> SchedulerImportOut:
        try:
            up = msgspec.json.decode(body, type=SchedulerImport)
        except msgspec.DecodeError as exc:
            raise TraceFormatError(f"body: {exc}") from exc
        if up.run_id:
            svc.metadata.get_run(scope, up.run_id)  # 404 unless the caller may see the run
        parsed = scheduler.parse_records(
            up.format,
            up.data,
            nodes=up.nodes,
            pool=up.pool,
            run_id=up.run_id,
            tz=up.tz,
            epoch=up.epoch,
            time=up.time,
        )
        if up.dry_run:
            return SchedulerImportOut.of(scheduler.summary(parsed))
        key = hashlib.sha256(body).hexdigest()[:32]
        return SchedulerImportOut.of(scheduler.import_records(svc.telemetry, scope, parsed, key))

    try:
        return await anyio.to_thread.run_sync(work)
    finally:
        budget.give(len(body))


Reader = Annotated[Scope, Depends(require("read"))]


@router.get(
    "/scheduler/allocations",
    summary="Stored scheduler allocations: submit, start, gang complete, release, per job",
    description="`runId` finds the allocations imported for the run and those whose job id the "
    "run carries (its job ids, the `SLURM_JOB_ID` its ranks saw, a Kubernetes job named like "
    "it); the run's scheduling factor computed from them is `scheduling`.",
    response_model=AllocationsOut,
    response_model_exclude_unset=True,
)
async def get_allocations(
    request: Request,
    scope: Reader,
    run_id: Annotated[str | None, Query(alias="runId", max_length=256)] = None,
    job_id: Annotated[str | None, Query(alias="jobId", max_length=256)] = None,
    pool: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> AllocationsOut:
    svc = request.app.state.services

    def work() -> AllocationsOut:
        if run_id is not None:
            svc.metadata.get_run(scope, run_id)  # 404 unless the caller may see the run
        rows = scheduler.allocation_records(
            svc.telemetry, scope, run_id=run_id, job_id=job_id, pool=pool, limit=limit
        )
        allocations = [AllocationOut.of(a) for a in rows]
        sched = None if run_id is None else scheduler.run_scheduling(svc.telemetry, scope, run_id)
        if sched is None:  # no key at all, not null
            return AllocationsOut(allocations=allocations)
        return AllocationsOut(allocations=allocations, scheduling=scheduling_out(sched))

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/scheduler/capacity",
    summary="Stored pool capacity: installed and in-service GPUs over time, per pool",
    response_model=CapacityOut,
)
async def get_capacity(
    request: Request, scope: Reader, pool: Annotated[str | None, Query(max_length=256)] = None
) -> CapacityOut:
    svc = request.app.state.services

    def work() -> CapacityOut:
        rows = scheduler.capacity(svc.telemetry, scope, pool)
        return CapacityOut(pools=[CapacityRowOut.of(c) for c in rows])

    return await anyio.to_thread.run_sync(work)
