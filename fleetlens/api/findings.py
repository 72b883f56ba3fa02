"""Findings of the analysis loop: a run's stragglers and its diagnoses (with evidence)."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Request

from ..store.findings import FindingsStore
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["findings"], responses=ERROR_RESPONSES)

Reader = Annotated[Scope, Depends(require("read"))]


def _read(request: Request, scope: Scope, run_id: str, kinds: tuple[str, ...] | None) -> Any:
    svc = request.app.state.services
    svc.metadata.get_run(scope, run_id)  # 404 unless the caller may see the run
    return FindingsStore(svc.metadata).list(scope, run_id, kinds)


@router.get(
    "/runs/{run_id}/stragglers",
    summary="A run's stragglers: persistent, intermittent or moving, with rank -> node -> GPU",
)
async def get_stragglers(request: Request, run_id: str, scope: Reader) -> dict[str, Any]:
    rows = await anyio.to_thread.run_sync(lambda: _read(request, scope, run_id, ("straggler",)))
    return {"runId": run_id, "stragglers": rows}


@router.get(
    "/runs/{run_id}/diagnosis",
    summary="A run's diagnoses: root cause, owner, confidence and evidence of each finding",
)
async def get_diagnosis(request: Request, run_id: str, scope: Reader) -> dict[str, Any]:
    rows = await anyio.to_thread.run_sync(lambda: _read(request, scope, run_id, None))
    owners: dict[str, int] = {}
    for r in rows:
        owners[r["owner"]] = owners.get(r["owner"], 0) + 1
    return {"runId": run_id, "findings": rows, "owners": owners}
