"""A run's log lines by step: ``GET /v1/runs/{run_id}/logs`` (:mod:`fleetlens.services.logs`)."""

from __future__ import annotations

from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request

from ..services.logs import AROUND_STEPS, MAX_LINES, LogSearch, search_logs
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .log_models import LogsOut

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["runs"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]
Level = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


@router.get(
    "/runs/{run_id}/logs",
    summary="A run's log lines by rank and step, searched",
    response_model=LogsOut,
    description="The lines the ranks wrote (Python logging records, stdout and stderr lines; "
    "the SDK sends them with FLEETLENS_LOGS=1), each with the step its rank was at, oldest "
    "first: those holding q (any case), of rank, of the steps fromStep..toStep (or, with around,"
    f" the {AROUND_STEPS} steps either side of it: a finding's step), at level or above.",
)
async def get_logs(
    request: Request,
    run_id: str,
    scope: Reader,
    q: Annotated[str, Query(max_length=1000)] = "",
    rank: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    from_step: Annotated[int, Query(alias="fromStep", ge=-1, le=2**62)] = -1,
    to_step: Annotated[int, Query(alias="toStep", ge=-1, le=2**62)] = 2**62,
    around: Annotated[int | None, Query(ge=-1, le=2**62)] = None,
    level: Level | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LINES)] = 500,
) -> LogsOut:
    if from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")
    svc = request.app.state.services
    search = LogSearch(q, rank, from_step, to_step, around, level, limit)

    def work() -> LogsOut:
        return LogsOut.of(search_logs(svc.metadata, svc.telemetry, scope, run_id, search))

    return await anyio.to_thread.run_sync(work)
