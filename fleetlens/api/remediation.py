"""Remediation: the job's control channel, and the actions people read, approve or reject.

The JSON of an action is made here (:func:`action_json`, camelCase, every phase timed) and
trimmed here for infrastructure on-call (:func:`action_view`); the controller returns
:class:`~fleetlens.remediation.machine.Action` values.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from ..remediation.controller import Controller
from ..remediation.machine import PHASES, Action
from ..remediation.positions import Instruction, Position
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require, require_any
from .leader import LEADER_HEADER, forward_to_leader, leader_of
from .remediation_models import (
    ActionOut,
    ControlAckOut,
    ControlCaptureOut,
    ControlPollOut,
    RemediationListOut,
)

__all__ = [
    "INFRA_KEYS",
    "action_json",
    "action_view",
    "action_views",
    "instruction_json",
    "router",
]

INFRA_KEYS = ("id", "tenant", "runId", "node", "reason", "mode", "state", "decidedAt",
              "updatedAt", "approvedBy", "error", "runEnded")  # fmt: skip
"""What infrastructure on-call sees of an action: not the run's checkpoint path, summary or
cost (they come from the run's config: its steps left); whether the run has ended is hers to
know (a pending action of an ended run is not hers to approve)."""


def action_json(a: Action) -> dict[str, Any]:
    """An action as the API shows it: camelCase, phases in order with their durations."""
    order = {name: i for i, name in enumerate(PHASES)}
    phases = {
        k: {"start": v[0], "end": v[1], "seconds": _seconds(*v)}
        for k, v in sorted(a.phases.items(), key=lambda kv: order.get(kv[0], len(PHASES)))
    }
    return {
        "id": a.id,
        "tenant": a.tenant,
        "runId": a.run_id,
        "jobId": a.job_id,
        "node": a.node,
        "ranks": list(a.ranks),
        "reason": a.reason,
        "summary": a.summary,
        "findingKey": a.finding_key,
        "alertId": a.alert_id,
        "incidentId": a.incident_id,
        "mode": a.mode,
        "state": a.state.value,
        "decidedAt": a.decided_at,
        "updatedAt": a.updated_at,
        "approvedBy": a.approved_by or None,
        "worldBefore": a.world_before,
        "worldAfter": a.world_after or None,
        "stopStep": a.stop_step if a.stop_step >= 0 else None,
        "resumeStep": a.resume_step if a.resume_step >= 0 else None,
        "stepsLost": a.steps_lost,
        "recoveryS": a.recovery_s,
        "checkpoint": dict(a.checkpoint),
        "phases": phases,
        "actuators": list(a.actuators),
        "cost": dict(a.cost),
        "error": a.error or None,
    }


def _seconds(start: float | None, end: float | None) -> float | None:
    return end - start if start is not None and end is not None else None


def action_view(scope: Scope, a: Action, run_ended: str | None = None) -> dict[str, Any]:
    """An action as this caller may see it: whole for the tenant's own roles, trimmed to
    :data:`INFRA_KEYS` for on-call, whose role reads no run contents. ``runEnded`` is the
    status of the action's run when it has ended (a pending action of it may only be
    rejected)."""
    out = action_json(a)
    out["runEnded"] = run_ended
    return out if scope.can("read") else {k: out[k] for k in INFRA_KEYS}


def action_views(ctl: Controller, scope: Scope, actions: list[Action]) -> list[dict[str, Any]]:
    """:func:`action_view` of each action, with whether its run has ended (asked once per
    run)."""
    now = time.time()
    ended: dict[tuple[str, str], str | None] = {}
    for a in actions:
        if (a.tenant, a.run_id) not in ended:
            ended[(a.tenant, a.run_id)] = ctl.repo.ended(a.tenant, a.run_id, now)
    return [action_view(scope, a, ended[(a.tenant, a.run_id)]) for a in actions]


def instruction_json(i: Instruction | None) -> dict[str, Any] | None:
    """What a rank's control poll is told (the SDK's control channel reads it)."""
    if i is None:
        return None
    return {
        "id": i.id,
        "phase": i.phase,
        "node": i.node,
        "jobId": i.job_id,
        "force": i.force,
        "world": i.world,
    }


router = APIRouter(prefix="/v1", tags=["remediation"], responses=ERROR_RESPONSES)
# Infrastructure on-call reads and approves actions of every tenant (docs/security.md).
Reader = Annotated[Scope, Depends(require_any("read", "read:infra"))]
Writer = Annotated[Scope, Depends(require("remediate"))]
Job = Annotated[Scope, Depends(require("ingest"))]
Id = Annotated[int, Path(ge=1, le=2**62)]
RunId = Annotated[str, Path(max_length=256)]


class ControlAck(BaseModel):
    """A rank's answer to an instruction (what the SDK's control channel sends)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, strict=True)

    id: int = Field(ge=0, le=2**62, strict=True, description="the action answered; 0 for 'resumed'")
    event: Literal["stopped", "checkpointed", "checkpoint_failed", "agent_stopping", "resumed"]
    rank: int = Field(ge=0, le=2**31, strict=True)
    node: str = Field(default="", max_length=256)
    job_id: str = Field(default="", alias="jobId", max_length=256)
    time: float = Field(ge=0, le=1e12, allow_inf_nan=False, strict=True)
    step: int | None = Field(None, ge=-1, le=2**62, strict=True)


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


def _stamp(request: Request, response: Response) -> None:
    """Say which server answered a job's control request (followers pass them to it)."""
    election = leader_of(request)
    if election is not None:
        response.headers[LEADER_HEADER] = election.leader_url


# A follower forwards the control channel and people's decisions to the leader, whose memory
# holds the ranks' positions and whose controller carries actions out (fleetlens/api/leader.py).
_FORWARDED: dict[int | str, dict[str, Any]] = {
    503: {"description": "No leader is reachable right now (several servers); retry"}
}


@router.get(
    "/runs/{run_id}/control",
    summary="A rank's control poll: report where it is, get the instruction for its job",
    response_model=ControlPollOut,
    responses=_FORWARDED,
)
async def control_poll(
    request: Request,
    response: Response,
    run_id: RunId,
    scope: Job,
    rank: Annotated[int, Query(ge=0, le=2**31)] = 0,
    job_id: Annotated[str, Query(alias="jobId", max_length=256)] = "",
    world: Annotated[int, Query(ge=1, le=2**31)] = 1,
    node: Annotated[str, Query(max_length=256)] = "",
    step: Annotated[int, Query(ge=-1, le=2**62)] = -1,
    seq: Annotated[int, Query(ge=0, le=2**62)] = 0,
    progress_at: Annotated[
        float | None, Query(alias="progressAt", ge=0, le=1e12, allow_inf_nan=False)
    ] = None,
    pid: Annotated[int, Query(ge=0, le=2**31)] = 0,
    agent_pid: Annotated[int, Query(alias="agentPid", ge=0, le=2**31)] = 0,
    capture: Annotated[bool, Query(description="this rank can profile a few steps")] = False,
    acts: Annotated[
        bool, Query(description="false: the job only offers captures; it cannot be drained")
    ] = True,
) -> dict[str, Any] | Response:
    if (forwarded := await forward_to_leader(request)) is not None:
        return forwarded
    _stamp(request, response)
    ctl = _controller(request)
    await _check_run(request, scope, run_id)
    now = time.time()
    pos = Position(job_id, rank, world, node, step, seq, progress_at or now, now, pid, agent_pid)
    # Every rank polls: a floor on the interval keeps a job's polls near 2,000 a second.
    told = instruction_json(ctl.report(scope.tenant, run_id, pos)) if acts else None
    caps = request.app.state.services.monitor.captures
    asked = None
    if capture and caps is not None:  # a triggered trace capture (fleetlens.services.captures)
        offer = caps.offered(scope.tenant, run_id, rank, job_id, step, now, world)
        asked = ControlCaptureOut.of(offer) if offer is not None else None
    return {"action": told, "capture": asked, "minIntervalS": world / 2000.0}


@router.post(
    "/runs/{run_id}/control",
    summary="A rank's answer to an instruction",
    response_model=ControlAckOut,
    responses=_FORWARDED,
)
async def control_ack(
    request: Request, response: Response, run_id: RunId, body: ControlAck, scope: Job
) -> dict[str, Any] | Response:
    if (forwarded := await forward_to_leader(request)) is not None:
        return forwarded
    _stamp(request, response)
    ctl = _controller(request)
    await _check_run(request, scope, run_id)
    doc = body.model_dump(by_alias=True)
    out = await anyio.to_thread.run_sync(ctl.ack, scope.tenant, run_id, doc)
    return {"id": out.id, "state": out.state.value if out.state is not None else None}


@router.get(
    "/remediations",
    summary="Remediation actions, newest first",
    response_model=RemediationListOut,
    response_model_exclude_unset=True,
)
async def list_remediations(
    request: Request,
    scope: Reader,
    run_id: Annotated[str | None, Query(alias="runId", max_length=256)] = None,
    state: Annotated[str | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> dict[str, Any]:
    ctl = _controller(request)
    rows = await anyio.to_thread.run_sync(
        lambda: action_views(ctl, scope, ctl.actions(scope, run_id, state, limit))
    )
    return {"remediations": rows, "mode": ctl.policy.mode}


@router.get(
    "/remediations/{remediation_id}",
    summary="One action, with every phase timed",
    response_model=ActionOut,
    response_model_exclude_unset=True,
)
async def get_remediation(request: Request, remediation_id: Id, scope: Reader) -> dict[str, Any]:
    ctl = _controller(request)
    (out,) = await anyio.to_thread.run_sync(
        lambda: action_views(ctl, scope, [ctl.get(scope, remediation_id)])
    )
    return out


async def _decide(
    request: Request, remediation_id: int, scope: Scope, approve: bool
) -> dict[str, Any] | Response:
    if (forwarded := await forward_to_leader(request)) is not None:
        return forwarded
    ctl = _controller(request)
    fn = ctl.approve if approve else ctl.reject
    # Refused -> 409 by the app's error table
    (out,) = await anyio.to_thread.run_sync(
        lambda: action_views(ctl, scope, [fn(scope, remediation_id)])
    )
    return out


@router.post(
    "/remediations/{remediation_id}/approve",
    summary="Carry out an action awaiting approval (audited)",
    response_model=ActionOut,
    response_model_exclude_unset=True,
    responses={
        409: {
            "description": "The action is not awaiting approval, or its run has ended (a "
            "pending action of an ended run may only be rejected)"
        },
        **_FORWARDED,
    },
)
async def approve(request: Request, remediation_id: Id, scope: Writer) -> dict[str, Any] | Response:
    return await _decide(request, remediation_id, scope, True)


@router.post(
    "/remediations/{remediation_id}/reject",
    summary="Decline an action awaiting approval (audited)",
    response_model=ActionOut,
    response_model_exclude_unset=True,
    responses={409: {"description": "The action is not awaiting approval"}, **_FORWARDED},
)
async def reject(request: Request, remediation_id: Id, scope: Writer) -> dict[str, Any] | Response:
    return await _decide(request, remediation_id, scope, False)
