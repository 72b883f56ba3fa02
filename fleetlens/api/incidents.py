"""Incidents and failure windows: the tenant's trouble, newest first, and the raw telemetry kept
around each failure (T-10 min to T+10 min), window by window and table by table."""

from __future__ import annotations

from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, Depends, Path, Query, Request

from ..services.incidents import list_incidents
from ..services.preserved import PreservedWindows
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .incident_models import IncidentListOut, PreservedListOut, PreservedRowsOut

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["incidents"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]
Offset = Annotated[int, Query(ge=0, le=2**62)]
Table = Literal["steps", "scalars", "collectives", "events", "gpu_samples", "node_samples"]


@router.get(
    "/incidents",
    summary="Incidents, newest first: failures and alerts per run, with diagnosis and owner",
    response_model=IncidentListOut,
)
async def incidents(
    request: Request,
    scope: Reader,
    state: Literal["open", "closed", "unalerted"] | None = None,
    since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
    run_id: Annotated[str | None, Query(alias="runId", max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Offset = 0,
) -> IncidentListOut:
    meta = request.app.state.services.metadata
    page = await anyio.to_thread.run_sync(
        lambda: list_incidents(meta, scope, state, since, run_id, limit, offset)
    )
    return IncidentListOut.of(page)


@router.get(
    "/runs/{run_id}/preserved",
    summary="A run's preserved failure windows: when, why, and how many rows of each table",
    response_model=PreservedListOut,
)
async def preserved(
    request: Request,
    run_id: str,
    scope: Reader,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    offset: Offset = 0,
) -> PreservedListOut:
    svc = request.app.state.services
    windows = PreservedWindows(svc.metadata, svc.telemetry, scope)
    got = await anyio.to_thread.run_sync(lambda: windows.list(run_id, limit, offset))
    return PreservedListOut.of(got)


@router.get(
    "/runs/{run_id}/preserved/{window_id}",
    summary="The rows of one table in one failure window, in time order, a page at a time",
    response_model=PreservedRowsOut,
)
async def preserved_rows(
    request: Request,
    run_id: str,
    window_id: Annotated[int, Path(ge=1, le=2**62)],
    scope: Reader,
    table: Table = "steps",
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    offset: Offset = 0,
) -> PreservedRowsOut:
    svc = request.app.state.services
    windows = PreservedWindows(svc.metadata, svc.telemetry, scope)
    rows = await anyio.to_thread.run_sync(
        lambda: windows.rows(run_id, window_id, table, limit, offset)
    )
    return PreservedRowsOut.of(rows)
