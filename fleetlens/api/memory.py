"""A run's memory per rank: ``GET /v1/runs/{run_id}/memory`` (:mod:`fleetlens.services.memory`)."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Query, Request

from ..services.memory import run_memory
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .memory_models import MemoryOut

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["runs"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]


@router.get(
    "/runs/{run_id}/memory",
    summary="A run's memory per rank: use, peak, headroom and climb",
    response_model=MemoryOut,
    description="Each rank's device memory (the CUDA caching allocator's reserved bytes against "
    "the device's capacity) and process memory (its resident set against its share of its "
    "cgroup's or the machine's memory; its address space under RLIMIT_AS), as the SDK samples "
    "them every memory_s seconds and TorchRun.log(memory=True) at a step: the use at the last "
    "sample, the peak, the headroom (limit - peak), the climb (bytes a step over the newest "
    "samples) and the steps left to the limit at that climb. Least headroom first; the series "
    "of the top pools (or of rank's, when given) over steps, each bucket its largest use.",
)
async def get_memory(
    request: Request,
    run_id: str,
    scope: Reader,
    rank: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    top: Annotated[int, Query(ge=0, le=1000)] = 8,
    points: Annotated[int, Query(ge=2, le=500)] = 200,
) -> MemoryOut:
    svc = request.app.state.services

    def work() -> MemoryOut:
        m = run_memory(svc.metadata, svc.telemetry, scope, run_id, rank, top, points)
        return MemoryOut.of(m)

    return await anyio.to_thread.run_sync(work)
