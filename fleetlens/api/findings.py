"""Findings of the analysis loop: a run's stragglers and its diagnoses (with evidence)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request

from ..analysis.whatif import StepWhatIf
from ..services.whatif import RunWhatIf, run_whatif
from ..store.findings import FindingRow, FindingsStore
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .evidence import evidence_json
from .models import (
    DiagnosisOut,
    FindingOut,
    StragglersOut,
    StragglerWhatIfFindingOut,
    StragglerWhatIfOut,
)

__all__ = ["finding_json", "router"]

router = APIRouter(prefix="/v1", tags=["findings"], responses=ERROR_RESPONSES)

Reader = Annotated[Scope, Depends(require("read"))]


def finding_out(row: FindingRow) -> FindingOut:
    return FindingOut.model_validate({**asdict(row), "evidence": evidence_json(row.evidence)})


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


@router.get(
    "/runs/{run_id}/whatif/stragglers",
    summary="What-if: how much faster the run would be with each worker, stage or operation "
    "type at its peers' median, and with each finding fixed",
    response_model=StragglerWhatIfOut,
    response_model_exclude_unset=True,
)
async def get_straggler_whatif(
    request: Request,
    run_id: str,
    scope: Reader,
    from_step: Annotated[int | None, Query(alias="fromStep", ge=0, le=2**62)] = None,
    to_step: Annotated[int | None, Query(alias="toStep", ge=0, le=2**62)] = None,
) -> StragglerWhatIfOut:
    """The newest attempt's steps in the window (default: its newest, at most 4 million
    rank-steps), replayed with durations set to their peers' median."""
    svc = request.app.state.services
    if from_step is not None and to_step is not None and from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")

    def work() -> StragglerWhatIfOut:
        info = svc.metadata.get_run(scope, run_id)
        rows = FindingsStore(svc.metadata).rows(scope, run_id, None)
        w = run_whatif(svc.telemetry, scope, run_id, info.config or {}, rows, from_step, to_step)
        if w is None:  # no step recorded (a run known from imported dumps): nothing to replay
            w = RunWhatIf("", 0, -1, None, StepWhatIf(0, 0.0, 0.0, {}, {}), [])
        r = w.result
        found = [
            StragglerWhatIfFindingOut(
                key=f.key,
                diagnosis=f.diagnosis,
                owner=f.owner,
                ranks=f.ranks,
                saved_seconds=(s := r.by_target.get(f.key, 0.0)),
                share=s / r.wall if r.wall > 0 else 0.0,
                speedup=s / (r.wall - s) if r.wall > s else 0.0,
            )
            for f in w.findings
        ]
        found.sort(key=lambda f: -f.saved_seconds)
        return StragglerWhatIfOut.model_validate(
            {
                "runId": run_id,
                "jobId": w.job_id,
                "fromStep": w.from_step,
                "toStep": w.to_step,
                "steps": r.steps,
                "wallSeconds": r.wall,
                "savedSeconds": r.saved,
                "slowdown": r.slowdown,
                "byType": r.by_type,
                "findings": found,
                "layout": w.layout.to_json() if w.layout else None,
            }
        )

    return await anyio.to_thread.run_sync(work)
