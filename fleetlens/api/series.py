"""Scalar series of a run (loss, lr, grad_norm, ...), downsampled for charts."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request

from ..services.series import SeriesQueries
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .ops_models import MetricsOut

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["runs"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]


@router.get(
    "/runs/{run_id}/metrics",
    summary="Scalar names of a run, or one downsampled series",
    response_model=MetricsOut,
    response_model_exclude_unset=True,
)
async def metrics(
    request: Request,
    run_id: str,
    scope: Reader,
    name: Annotated[str | None, Query(max_length=256)] = None,
    from_step: Annotated[int, Query(alias="fromStep", ge=0, le=2**62)] = 0,
    to_step: Annotated[int, Query(alias="toStep", ge=0, le=2**62)] = 2**62,
    points: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> MetricsOut:
    if from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")
    svc = request.app.state.services

    def work() -> MetricsOut:
        svc.metadata.get_run(scope, run_id)  # 404 unless the caller may see the run
        q = SeriesQueries(svc.telemetry, scope)
        if name is None:
            return MetricsOut.of_names(run_id, q.names(run_id))
        # Buckets over the steps stored in the window, not up to the run registry's last step:
        # the registry is written every few seconds and may lag what was acknowledged. A long
        # window (or one whose raw rows expired) is read from the rollups.
        return MetricsOut.of(q.read(run_id, name, from_step, to_step, points))

    return await anyio.to_thread.run_sync(work)
