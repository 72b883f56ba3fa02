"""Remediation: the job's control channel, and the actions people read, approve or reject."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from ..remediation.controller import Controller, Position
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require, require_any

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["remediation"], responses=ERROR_RESPONSES)
# Infrastructure on-call reads and approves actions of every tenant (docs/security.md).
Reader = Annotated[Scope, Depends(require_any("read", "read:infra"))]
Writer = Annotated[Scope, Depends(require("remediate"))]
Job = Annotated[Scope, Depends(require("ingest"))]
Id = Annotated[int, Path(ge=1, le=2**62)]
RunId = Annotated[str, Path(max_length=256)]


class ControlAck(BaseModel):
    """A rank's answer to an instruction (what the SDK's control channel sends)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: int = Field(ge=0, le=2**62, description="the action answered; 0 for 'resumed'")
    event: Literal["stopped", "checkpointed", "checkpoint_failed", "agent_stopping", "resumed"]
    rank: int = Field(ge=0)
    node: str = Field(default="", max_length=256)
    job_id: str = Field(default="", alias="jobId", max_length=256)
    time: float
    step: int | None = None


def _controller(request: Request) -> Controller:
    ctl = request.app.state.services.monitor.remediation
    if ctl is None:
        raise HTTPException(503, "remediation is not running on this server")
    return ctl  # type: ignore[no-any-return]


async def _check_run(request: Request, scope: Scope, run_id: str) -> None:
    """404 unless the caller's tenant (and project) has this run; cached once seen."""
    svc = request.app.state.services
    key = (scope.tenant, scope.project, run_id)
    known = svc.control_runs
    if key not in known:
        await anyio.to_thread.run_sync(svc.metadata.get_run, scope, run_id)
        if len(known) > 100_000:
            known.clear()
        known.add(key)


@router.get(
    "/runs/{run_id}/control",
    summary="A rank's control poll: report where it is, get the instruction for its job",
)
async def control_poll(
    request: Request,
    run_id: RunId,
    scope: Job,
    rank: Annotated[int, Query(ge=0)] = 0,
    job_id: Annotated[str, Query(alias="jobId", max_length=256)] = "",
    world: Annotated[int, Query(ge=1)] = 1,
    node: Annotated[str, Query(max_length=256)] = "",
    step: int = -1,
    seq: int = 0,
    progress_at: Annotated[float | None, Query(alias="progressAt")] = None,
    pid: int = 0,
    agent_pid: Annotated[int, Query(alias="agentPid")] = 0,
) -> dict[str, Any]:
    ctl = _controller(request)
    await _check_run(request, scope, run_id)
    now = time.time()
    pos = Position(job_id, rank, world, node, step, seq, progress_at or now, now, pid, agent_pid)
    # Every rank polls: a floor on the interval keeps a job's polls near 2,000 a second.
    return {"action": ctl.report(scope.tenant, run_id, pos), "minIntervalS": world / 2000.0}


@router.post("/runs/{run_id}/control", summary="A rank's answer to an instruction")
async def control_ack(
    request: Request, run_id: RunId, body: ControlAck, scope: Job
) -> dict[str, Any]:
    ctl = _controller(request)
    await _check_run(request, scope, run_id)
    doc = body.model_dump(by_alias=True)
    out: dict[str, Any] = await anyio.to_thread.run_sync(ctl.ack, scope.tenant, run_id, doc)
    return out


@router.get("/remediations", summary="Remediation actions, newest first")
async def list_remediations(
    request: Request,
    scope: Reader,
    run_id: Annotated[str | None, Query(alias="runId", max_length=256)] = None,
    state: Annotated[str | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> dict[str, Any]:
    ctl = _controller(request)
    rows = await anyio.to_thread.run_sync(lambda: ctl.actions(scope, run_id, state, limit))
    return {"remediations": rows, "mode": ctl.policy.mode}


@router.get("/remediations/{remediation_id}", summary="One action, with every phase timed")
async def get_remediation(request: Request, remediation_id: Id, scope: Reader) -> dict[str, Any]:
    ctl = _controller(request)
    out: dict[str, Any] = await anyio.to_thread.run_sync(ctl.get, scope, remediation_id)
    return out


async def _decide(request: Request, remediation_id: int, scope: Scope, approve: bool) -> Any:
    ctl = _controller(request)
    fn = ctl.approve if approve else ctl.reject
    try:
        return await anyio.to_thread.run_sync(fn, scope, remediation_id)
    except ValueError as exc:
        raise HTTPException(409, str(exc)) from exc


@router.post(
    "/remediations/{remediation_id}/approve",
    summary="Carry out an action awaiting approval (audited)",
    responses={409: {"description": "The action is not awaiting approval"}},
)
async def approve(request: Request, remediation_id: Id, scope: Writer) -> dict[str, Any]:
    out: dict[str, Any] = await _decide(request, remediation_id, scope, True)
    return out


@router.post(
    "/remediations/{remediation_id}/reject",
    summary="Decline an action awaiting approval (audited)",
    responses={409: {"description": "The action is not awaiting approval"}},
)
async def reject(request: Request, remediation_id: Id, scope: Writer) -> dict[str, Any]:
    out: dict[str, Any] = await _decide(request, remediation_id, scope, False)
    return out
