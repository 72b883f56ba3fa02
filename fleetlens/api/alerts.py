"""Alerts and incidents: list, acknowledge, resolve; the policy in force; silences."""

from __future__ import annotations

import time
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from ..alerts.rules import prometheus_rules
from ..alerts.silences import SilenceStore
from ..store.scope import Scope
from .alert_models import (
    AlertListOut,
    AlertOut,
    AlertPolicyOut,
    IncidentDetailOut,
    SilenceListOut,
    SilenceOut,
)
from .auth import ERROR_RESPONSES, require, require_any
from .remediation import action_json
from .remediation_models import ActionOut

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["alerts"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]
Writer = Annotated[Scope, Depends(require("write"))]
Acker = Annotated[Scope, Depends(require_any("write", "remediate"))]
Id = Annotated[int, Path(ge=1, le=2**62)]


@router.get(
    "/alerts",
    summary="Alerts, newest first",
    response_model=AlertListOut,
    response_model_exclude_unset=True,
)
async def list_alerts(
    request: Request,
    scope: Reader,
    state: Literal["firing", "resolved"] | None = None,
    run_id: Annotated[str | None, Query(alias="runId", max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> AlertListOut:
    svc = request.app.state.services
    alerts = await anyio.to_thread.run_sync(
        lambda: svc.alert_store.list(scope, state, run_id, limit)
    )
    return AlertListOut(alerts=[AlertOut.of(a) for a in alerts])


@router.get(
    "/alerts/policy",
    summary="The alert policy in force (defaults and overrides)",
    response_model=AlertPolicyOut,
)
async def policy(request: Request, scope: Reader) -> AlertPolicyOut:
    mon = request.app.state.services.monitor
    return AlertPolicyOut.model_validate(
        {
            "policy": mon.policy.as_dict(),
            "projectOverrides": mon.project_overrides,
            "prometheusRules": prometheus_rules(mon.policy),
        }
    )


@router.get(
    "/alerts/{alert_id}",
    summary="One alert, with the finding that raised it",
    response_model=AlertOut,
    response_model_exclude_unset=True,
)
async def get_alert(request: Request, alert_id: Id, scope: Reader) -> AlertOut:
    svc = request.app.state.services
    alert = await anyio.to_thread.run_sync(svc.alert_store.get, scope, alert_id)
    ctl = svc.monitor.remediation
    if ctl is None:
        return AlertOut.of(alert)
    actions = await anyio.to_thread.run_sync(ctl.for_alert, scope, alert_id)
    return AlertOut.of(alert, [ActionOut.model_validate(action_json(a)) for a in actions])


@router.post(
    "/alerts/{alert_id}/ack",
    summary="Acknowledge an alert (audited); on-call: any tenant's infrastructure alert",
    response_model=AlertOut,
    response_model_exclude_unset=True,
)
async def ack(request: Request, alert_id: Id, scope: Acker) -> AlertOut:
    svc = request.app.state.services
    out = await anyio.to_thread.run_sync(svc.alert_store.ack, scope, alert_id)
    return AlertOut.of(out)


@router.post(
    "/alerts/{alert_id}/resolve",
    summary="Resolve an alert by hand (audited)",
    response_model=AlertOut,
    response_model_exclude_unset=True,
)
async def resolve(request: Request, alert_id: Id, scope: Writer) -> AlertOut:
    svc = request.app.state.services
    out, payload = await anyio.to_thread.run_sync(svc.alert_store.resolve, scope, alert_id)
    if payload is not None:
        svc.delivery.submit([payload])
    return AlertOut.of(out)


@router.get(
    "/incidents/{incident_id}",
    summary="An incident: its alerts, findings and remediation actions",
    response_model=IncidentDetailOut,
    response_model_exclude_unset=True,
)
async def incident(request: Request, incident_id: Id, scope: Reader) -> IncidentDetailOut:
    svc = request.app.state.services
    inc = await anyio.to_thread.run_sync(svc.alert_store.incident, scope, incident_id)
    ctl = svc.monitor.remediation
    if ctl is None:
        return IncidentDetailOut.of(inc)
    actions = await anyio.to_thread.run_sync(ctl.for_incident, scope, incident_id)
    return IncidentDetailOut.of(inc, [ActionOut.model_validate(action_json(a)) for a in actions])


# -- silences ---------------------------------------------------------------------------------

InfraReader = Annotated[Scope, Depends(require_any("read", "read:infra"))]


class SilenceBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    matchers: dict[
        Annotated[str, Field(min_length=1, max_length=128)],
        Annotated[str, Field(min_length=1, max_length=512)],
    ] = Field(
        min_length=1,
        max_length=16,
        description="label -> value, all equal for an alert to be held back "
        '(e.g. {"alertname": "FatalHardwareFault", "node": "gpu-17"})',
    )
    comment: str = Field(min_length=1, max_length=1024, description="why; shown to whoever looks")
    durationSeconds: float | None = Field(None, gt=0, allow_inf_nan=False)
    endsAt: float | None = Field(None, gt=0, allow_inf_nan=False, description="or an end time")
    startsAt: float | None = Field(None, gt=0, allow_inf_nan=False, description="default: now")


def _silences(request: Request) -> SilenceStore:
    svc = request.app.state.services
    return SilenceStore(svc.metadata, svc.access)


@router.post(
    "/silences",
    summary="Silence alerts: matching ones keep firing but notify no one until it ends",
    status_code=201,
    response_model=SilenceOut,
)
async def create_silence(request: Request, body: SilenceBody, scope: Acker) -> SilenceOut:
    if (body.durationSeconds is None) == (body.endsAt is None):
        raise HTTPException(400, "give durationSeconds or endsAt (one of them)")
    start = body.startsAt if body.startsAt is not None else time.time()
    ends = body.endsAt if body.endsAt is not None else start + float(body.durationSeconds or 0)
    store = _silences(request)
    out = await anyio.to_thread.run_sync(
        lambda: store.create(scope, body.matchers, ends, body.comment, start)
    )
    return SilenceOut.of(out)


@router.get(
    "/silences",
    summary="Silences in force or to come, and those ended in the last day",
    response_model=SilenceListOut,
)
async def list_silences(request: Request, scope: InfraReader) -> SilenceListOut:
    store = _silences(request)
    found = await anyio.to_thread.run_sync(store.list, scope)
    return SilenceListOut(silences=[SilenceOut.of(s) for s in found])


@router.delete(
    "/silences/{silence_id}", summary="Expire a silence now (audited)", response_model=SilenceOut
)
async def expire_silence(request: Request, silence_id: Id, scope: Acker) -> SilenceOut:
    store = _silences(request)
    return SilenceOut.of(await anyio.to_thread.run_sync(store.expire, scope, silence_id))
