"""Scalar series of a run (loss, lr, grad_norm, ...), downsampled for charts."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request

from ..store.scope import Scope
from ..store.series_queries import SeriesQueries
from .auth import ERROR_RESPONSES, require

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["runs"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]


@router.get("/runs/{run_id}/metrics", summary="Scalar names of a run, or one downsampled series")
async def metrics(
    request: Request,
    run_id: str,
    scope: Reader,
    name: Annotated[str | None, Query(max_length=256)] = None,
    from_step: Annotated[int, Query(alias="fromStep", ge=0)] = 0,
    to_step: Annotated[int, Query(alias="toStep", ge=0)] = 2**62,
    points: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> dict[str, Any]:
    if from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")
    svc = request.app.state.services

    def work() -> dict[str, Any]:
        run = svc.metadata.get_run(scope, run_id)
        q = SeriesQueries(svc.telemetry, scope)
        if name is None:
            return {"runId": run_id, "metrics": q.names(run_id)}
        hi = min(to_step, max(run.last_step, 0))
        return {
            "runId": run_id,
            "name": name,
            "fromStep": from_step,
            "toStep": hi,
            "points": q.series(run_id, name, from_step, hi, points),
        }

    return await anyio.to_thread.run_sync(work)
