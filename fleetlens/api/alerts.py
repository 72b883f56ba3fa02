"""Alerts and incidents: list, acknowledge, resolve; the policy in force."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, Path, Query, Request

from ..alerts.rules import prometheus_rules
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require, require_any
from .remediation import action_json

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["alerts"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]
Writer = Annotated[Scope, Depends(require("write"))]
Acker = Annotated[Scope, Depends(require_any("write", "remediate"))]
Id = Annotated[int, Path(ge=1, le=2**62)]


@router.get("/alerts", summary="Alerts, newest first")
async def list_alerts(
    request: Request,
    scope: Reader,
    state: Literal["firing", "resolved"] | None = None,
    run_id: Annotated[str | None, Query(alias="runId", max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> dict[str, Any]:
    svc = request.app.state.services
    alerts = await anyio.to_thread.run_sync(
        lambda: svc.alert_store.list(scope, state, run_id, limit)
    )
    return {"alerts": alerts}


@router.get("/alerts/policy", summary="The alert policy in force (defaults and overrides)")
async def policy(request: Request, scope: Reader) -> dict[str, Any]:
    mon = request.app.state.services.monitor
    return {
        "policy": mon.policy.as_dict(),
        "projectOverrides": mon.project_overrides,
        "prometheusRules": prometheus_rules(mon.policy),
    }


@router.get("/alerts/{alert_id}", summary="One alert, with the finding that raised it")
async def get_alert(request: Request, alert_id: Id, scope: Reader) -> dict[str, Any]:
    svc = request.app.state.services
    out: dict[str, Any] = await anyio.to_thread.run_sync(svc.alert_store.get, scope, alert_id)
    ctl = svc.monitor.remediation
    if ctl is not None:
        actions = await anyio.to_thread.run_sync(ctl.for_alert, scope, alert_id)
        out["remediations"] = [action_json(a) for a in actions]
    return out


@router.post(
    "/alerts/{alert_id}/ack",
    summary="Acknowledge an alert (audited); on-call: any tenant's infrastructure alert",
)
async def ack(request: Request, alert_id: Id, scope: Acker) -> dict[str, Any]:
    svc = request.app.state.services
    out: dict[str, Any] = await anyio.to_thread.run_sync(svc.alert_store.ack, scope, alert_id)
    return out


@router.post("/alerts/{alert_id}/resolve", summary="Resolve an alert by hand (audited)")
async def resolve(request: Request, alert_id: Id, scope: Writer) -> dict[str, Any]:
    svc = request.app.state.services
    out, payload = await anyio.to_thread.run_sync(svc.alert_store.resolve, scope, alert_id)
    if payload is not None:
        svc.delivery.submit([payload])
    return out  # type: ignore[no-any-return]


@router.get(
    "/incidents/{incident_id}", summary="An incident: its alerts, findings and remediation actions"
)
async def incident(request: Request, incident_id: Id, scope: Reader) -> dict[str, Any]:
    svc = request.app.state.services
    out: dict[str, Any] = await anyio.to_thread.run_sync(
        svc.alert_store.incident, scope, incident_id
    )
    ctl = svc.monitor.remediation
    if ctl is not None:
        actions = await anyio.to_thread.run_sync(ctl.for_incident, scope, incident_id)
        out["remediations"] = [action_json(a) for a in actions]
    return out
