"""Profiler-trace findings of a run: per rank per step, where the device time went."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request

from ..services.traces import TraceQueries
from ..store.scope import Scope
from ..traces.files import TraceFiles
from .auth import ERROR_RESPONSES, require
from .ops_models import (
    TraceCollectiveOut,
    TraceKernelOut,
    TraceRankOut,
    TracesOut,
    TraceStepOut,
)

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["traces"], responses=ERROR_RESPONSES)

Reader = Annotated[Scope, Depends(require("read"))]


@router.get(
    "/runs/{run_id}/traces",
    summary="Per-rank step breakdown from imported profiler traces",
    response_model=TracesOut,
    description="From `fleetlens traces import`: per rank and ProfilerStep, the step time and "
    "its device breakdown (compute, communication, exposed communication, overlap, memcpy, "
    "idle; compute + exposedComm + memcpy + idle = duration), and per rank the totals over "
    "the window with each line as a percentage of step time; the kernels (`topKernels`, "
    "each step's ten heaviest per rank, summed) and collective operations (`topCollectives`) "
    "with the most device time; `fileBytes`: the size of the rank's kept trace file (`GET "
    "/v1/runs/{run_id}/traces/files/{rank}`), null when none was uploaded. Without a window: "
    "every imported step.",
)
async def get_traces(
    request: Request,
    run_id: str,
    scope: Reader,
    from_step: Annotated[int | None, Query(alias="fromStep", ge=0, le=2**62)] = None,
    to_step: Annotated[int | None, Query(alias="toStep", ge=0, le=2**62)] = None,
    limit: Annotated[int, Query(ge=1, le=1_000_000)] = 100_000,
    rank: Annotated[
        int | None, Query(ge=0, le=2**31 - 1, description="only this rank's steps")
    ] = None,
) -> TracesOut:
    svc = request.app.state.services
    if from_step is not None and to_step is not None and from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")

    def work() -> TracesOut:
        svc.metadata.get_run(scope, run_id)
        q = TraceQueries(svc.telemetry, scope)
        full = q.window(run_id)
        if full is None:
            return TracesOut(
                run_id=run_id,
                from_step=from_step,
                to_step=to_step,
                ranks=[],
                top_kernels=[],
                top_collectives=[],
                steps=[],
            )
        lo = from_step if from_step is not None else full[0]
        hi = to_step if to_step is not None else full[1]
        kept = TraceFiles(svc.config.data_dir).sizes(scope.tenant, run_id)
        return TracesOut(
            run_id=run_id,
            from_step=lo,
            to_step=hi,
            ranks=[TraceRankOut.of(r, kept.get(r.rank)) for r in q.ranks(run_id, lo, hi)],
            top_kernels=[TraceKernelOut.of(k) for k in q.top_kernels(run_id, lo, hi)],
            top_collectives=[TraceCollectiveOut.of(c) for c in q.top_collectives(run_id, lo, hi)],
            steps=[TraceStepOut.of(t) for t in q.steps(run_id, lo, hi, limit, rank)],
        )

    return await anyio.to_thread.run_sync(work)
