"""Findings of the analysis loop: a run's stragglers and its diagnoses (with evidence)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Request

from ..store.findings import FindingRow, FindingsStore
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .models import DiagnosisOut, FindingOut, StragglersOut

__all__ = ["finding_json", "router"]

router = APIRouter(prefix="/v1", tags=["findings"], responses=ERROR_RESPONSES)

Reader = Annotated[Scope, Depends(require("read"))]


def finding_out(row: FindingRow) -> FindingOut:
    return FindingOut.model_validate(asdict(row))


def finding_json(row: FindingRow) -> dict[str, Any]:
    """A finding as the API answers it (camelCase: :class:`FindingOut`), for the portal."""
    return finding_out(row).model_dump(by_alias=True)


def _read(
    request: Request, scope: Scope, run_id: str, kinds: tuple[str, ...] | None
) -> list[FindingRow]:
    svc = request.app.state.services
    svc.metadata.get_run(scope, run_id)  # 404 unless the caller may see the run
    return FindingsStore(svc.metadata).rows(scope, run_id, kinds)


@router.get(
    "/runs/{run_id}/stragglers",
    summary="A run's stragglers: persistent, intermittent or moving, with rank -> node -> GPU",
    response_model=StragglersOut,
    response_model_exclude_unset=True,
)
async def get_stragglers(request: Request, run_id: str, scope: Reader) -> StragglersOut:
    rows = await anyio.to_thread.run_sync(lambda: _read(request, scope, run_id, ("straggler",)))
    return StragglersOut(run_id=run_id, stragglers=[finding_out(r) for r in rows])


@router.get(
    "/runs/{run_id}/diagnosis",
    summary="A run's diagnoses: root cause, owner, confidence and evidence of each finding",
    response_model=DiagnosisOut,
    response_model_exclude_unset=True,
)
async def get_diagnosis(request: Request, run_id: str, scope: Reader) -> DiagnosisOut:
    rows = await anyio.to_thread.run_sync(lambda: _read(request, scope, run_id, None))
    owners: dict[str, int] = {}
    for r in rows:
        owners[r.owner] = owners.get(r.owner, 0) + 1
    return DiagnosisOut(run_id=run_id, findings=[finding_out(r) for r in rows], owners=owners)
