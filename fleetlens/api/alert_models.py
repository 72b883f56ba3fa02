"""The JSON of the alerts, incidents, alert policy and silences routes
(:mod:`fleetlens.api.alerts`), beside :mod:`fleetlens.api.models`, whose conventions these
follow: camelCase on the wire, unknown keys refused. The policy's rules keep their snake_case
keys (``for_s``, ``floor_s``, ``runbook_url``), as the policy file names them.

An alert or an incident lists the remediation actions it raised
(:class:`fleetlens.api.remediation_models.ActionOut`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..alerts.silences import SilenceView
from ..alerts.store import AlertView, IncidentView
from .models import ApiModel
from .remediation_models import ActionOut

__all__ = [
    "AlertListOut",
    "AlertOut",
    "AlertPolicyOut",
    "IncidentDetailOut",
    "InhibitOut",
    "PolicyOut",
    "PolicyRuleOut",
    "SilenceListOut",
    "SilenceOut",
]

Severity = Literal["page", "ticket", "never"]
Audience = Literal["researcher", "infra_oncall", "ml_platform"]


# ---- alerts and incidents -----------------------------------------------------------------
class AlertOut(ApiModel):
    """One alert: firing or resolved, acknowledged or not, and what raised it."""

    id: int
    fingerprint: str
    alertname: str
    severity: Severity
    audience: Audience
    state: Literal["firing", "resolved"]
    run_id: str
    labels: dict[str, str]
    annotations: dict[str, str] = Field(description="summary, description, runbook_url")
    finding: str | None = Field(description="the key of the finding that raised it")
    step: int | None
    starts_at: float
    ends_at: float | None
    acked_by: str | None
    acked_at: float | None
    incident_id: int | None
    notified_at: float | None
    silenced_by: list[int] = Field(
        default_factory=list,
        description="the silences holding it back now (the alerts list only)",
    )
    remediations: list[ActionOut] = Field(
        default_factory=list,
        description="the actions it raised (one alert, when remediation is on)",
    )
    live: bool | None = Field(
        default=None, description="the on-call page only: its run is still running (or hung)"
    )

    @classmethod
    def of(cls, a: AlertView, remediations: list[ActionOut] | None = None) -> AlertOut:
        """``silenced_by`` where the store looked the silences up (its lists);
        ``remediations`` where given (one alert, when remediation is on)."""
        fields: dict[str, Any] = {
            "id": a.id,
            "fingerprint": a.fingerprint,
            "alertname": a.alertname,
            "severity": a.severity,
            "audience": a.audience,
            "state": a.state,
            "run_id": a.run_id,
            "labels": a.labels,
            "annotations": a.annotations,
            "finding": a.finding,
            "step": a.step,
            "starts_at": a.starts_at,
            "ends_at": a.ends_at,
            "acked_by": a.acked_by,
            "acked_at": a.acked_at,
            "incident_id": a.incident_id,
            "notified_at": a.notified_at,
        }
        if a.silenced_by is not None:
            fields["silenced_by"] = a.silenced_by
        if remediations is not None:
            fields["remediations"] = remediations
        return cls.model_validate(fields)

    @classmethod
    def doc(cls, a: AlertView) -> dict[str, Any]:
        """The alert as a page's document holds it (the keys :meth:`of` sets)."""
        return cls.of(a).model_dump(by_alias=True, exclude_unset=True)


class AlertListOut(ApiModel):
    """Alerts, newest first."""

    alerts: list[AlertOut]


class IncidentDetailOut(ApiModel):
    """An incident of the alert store: its alerts, findings and remediation actions."""

    id: int
    run_id: str
    title: str
    severity: Severity
    status: Literal["open", "closed"]
    opened_at: float
    closed_at: float | None
    findings: list[str] = Field(description="keys of the findings its alerts name")
    alerts: list[AlertOut]
    remediations: list[ActionOut] = Field(
        default_factory=list, description="when remediation is on"
    )

    @classmethod
    def of(cls, i: IncidentView, remediations: list[ActionOut] | None = None) -> IncidentDetailOut:
        fields: dict[str, Any] = {
            "id": i.id,
            "run_id": i.run_id,
            "title": i.title,
            "severity": i.severity,
            "status": i.status,
            "opened_at": i.opened_at,
            "closed_at": i.closed_at,
            "findings": list(i.findings),
            "alerts": [AlertOut.of(a) for a in i.alerts],
        }
        if remediations is not None:
            fields["remediations"] = remediations
        return cls.model_validate(fields)

    @classmethod
    def summary_doc(cls, i: IncidentView) -> dict[str, Any]:
        """The incident as the on-call document lists it: without its alerts."""
        return cls.of(i).model_dump(by_alias=True, exclude_unset=True, exclude={"alerts"})


# ---- the policy ---------------------------------------------------------------------------
class PolicyRuleOut(ApiModel):
    """One alert rule: what raises it, how loud, and who hears it."""

    name: str
    signal: Literal["goodput", "hang", "finding", "metric", "evaluation"]
    severity: Severity
    audience: Audience
    description: str
    threshold: float | None = Field(description="goodput: the floor; hang: step-time multiple")
    for_s: float = Field(alias="for_s", description="how long the condition holds first")
    floor_s: float = Field(alias="floor_s", description="hang: never sooner than this")
    diagnoses: list[str] = Field(description="finding: which diagnoses raise it")
    kinds: list[str] = Field(description="finding, evaluation: only these kinds; empty: any")
    metric: str = Field(description="metric: the run metric it reads")
    op: str = Field(description="metric: above, drop or rise")
    runbook_url: str = Field(alias="runbook_url", description='"": this server\'s /runbooks page')


class InhibitOut(ApiModel):
    """While ``source`` fires for the same ``equal`` labels, ``target`` is suppressed."""

    source: str
    target: str
    equal: list[str]


class PolicyOut(ApiModel):
    """The server's alert policy: the defaults with the policy file's overrides."""

    rules: list[PolicyRuleOut]
    inhibit: list[InhibitOut]


class AlertPolicyOut(ApiModel):
    """The alert policy in force, each project's overrides, and the same as Prometheus rules."""

    policy: PolicyOut
    project_overrides: dict[str, dict[str, dict[str, Any]]] = Field(
        description="project -> rule name -> field -> value, as the policy file sets them"
    )
    prometheus_rules: str = Field(description="a Prometheus rule file (YAML)")


# ---- silences -----------------------------------------------------------------------------
class SilenceOut(ApiModel):
    """A silence: alerts matching all its matchers notify no one while it lasts."""

    id: int
    matchers: dict[str, str] = Field(description="label -> value")
    starts_at: float
    ends_at: float
    comment: str
    created_by: str
    created_at: float
    infra: bool = Field(description="made by infrastructure on-call, for every tenant")
    tenant: str

    @classmethod
    def of(cls, s: SilenceView) -> SilenceOut:
        return cls(
            id=s.id,
            matchers=dict(s.matchers),
            starts_at=s.starts_at,
            ends_at=s.ends_at,
            comment=s.comment,
            created_by=s.created_by,
            created_at=s.created_at,
            infra=s.infra,
            tenant=s.tenant,
        )

    @classmethod
    def doc(cls, s: SilenceView) -> dict[str, Any]:
        """The silence as a page's document holds it."""
        return cls.of(s).model_dump(by_alias=True)


class SilenceListOut(ApiModel):
    """Silences in force or to come, and those ended in the last day."""

    silences: list[SilenceOut]
