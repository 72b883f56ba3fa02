"""The JSON of the incidents list and of the preserved failure windows (beside
:mod:`fleetlens.api.models`, whose conventions these follow: camelCase on the wire, unknown
keys refused)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from .models import ApiModel

if TYPE_CHECKING:
    from ..services.incidents import IncidentAlert, IncidentEntry, IncidentPage, WindowRef
    from ..services.preserved import (
        FailureBrief,
        PreservedList,
        PreservedRows,
        PreservedWindow,
        WindowAlert,
    )

__all__ = [
    "FailureOut",
    "IncidentAlertOut",
    "IncidentListOut",
    "IncidentOut",
    "PreservedListOut",
    "PreservedRowsOut",
    "PreservedWindowOut",
    "TimeWindowRefOut",
    "WindowAlertOut",
]


class FailureOut(ApiModel):
    """A failure (or the finding an alert names) as an incident or a window shows it."""

    key: str
    kind: str
    diagnosis: str
    owner: str
    confidence: float
    summary: str
    step: int | None
    time: float | None
    job_id: str | None
    ranks: list[int]
    nodes: list[str]
    gpus: list[str]

    @classmethod
    def of(cls, f: FailureBrief) -> FailureOut:
        return cls(
            key=f.key,
            kind=f.kind,
            diagnosis=f.diagnosis,
            owner=f.owner,
            confidence=f.confidence,
            summary=f.summary,
            step=f.step,
            time=f.time,
            job_id=f.job_id,
            ranks=list(f.ranks),
            nodes=list(f.nodes),
            gpus=list(f.gpus),
        )


class IncidentAlertOut(ApiModel):
    id: int
    alertname: str
    severity: str
    audience: str
    state: str = Field(description="firing or resolved")
    starts_at: float
    ends_at: float | None
    age_s: float = Field(description="seconds since it started")
    acked_by: str | None
    summary: str
    node: str | None
    gpu: str | None
    ranks: list[int]
    finding: str | None

    @classmethod
    def of(cls, a: IncidentAlert) -> IncidentAlertOut:
        return cls(
            id=a.id,
            alertname=a.alertname,
            severity=a.severity,
            audience=a.audience,
            state=a.state,
            starts_at=a.starts_at,
            ends_at=a.ends_at,
            age_s=a.age_s,
            acked_by=a.acked_by,
            summary=a.summary,
            node=a.node,
            gpu=a.gpu,
            ranks=list(a.ranks),
            finding=a.finding,
        )


class TimeWindowRefOut(ApiModel):
    """A preserved failure window by id (GET /v1/runs/{run_id}/preserved/{id})."""

    id: int
    start: float = Field(alias="from")
    to: float

    @classmethod
    def of(cls, w: WindowRef) -> TimeWindowRefOut:
        return cls.model_validate({"id": w.id, "from": w.start, "to": w.end})


class IncidentOut(ApiModel):
    """One run's trouble: an incident of the alert store, or a failure no alert rule raised."""

    key: str = Field(description="incident:ID or failure:ID")
    id: int | None = Field(description="GET /v1/incidents/{id}; null when unalerted")
    title: str
    severity: str
    state: str = Field(description="open (an alert fires), closed, or unalerted")
    time: float = Field(description="when it happened: the first alert's start, or the failure's")
    opened_at: float
    closed_at: float | None
    age_s: float = Field(description="seconds since ``time``")
    duration_s: float | None = Field(description="open to closed (or now); null when unalerted")
    run_id: str
    project: str
    job_ids: list[str]
    diagnosis: str | None
    owner: str | None
    summary: str
    nodes: list[str]
    ranks: list[int]
    gpus: list[str]
    alerts: list[IncidentAlertOut]
    firing: int
    failures: list[FailureOut]
    windows: list[TimeWindowRefOut]
    links: dict[str, str] = Field(description="failurePage (the portal), failure, preserved")

    @classmethod
    def of(cls, e: IncidentEntry) -> IncidentOut:
        run = e.run_id
        return cls(
            key=e.key,
            id=e.id,
            title=e.title,
            severity=e.severity,
            state=e.state,
            time=e.time,
            opened_at=e.opened_at,
            closed_at=e.closed_at,
            age_s=e.age_s,
            duration_s=e.duration_s,
            run_id=e.run_id,
            project=e.project,
            job_ids=list(e.job_ids),
            diagnosis=e.diagnosis,
            owner=e.owner,
            summary=e.summary,
            nodes=list(e.nodes),
            ranks=list(e.ranks),
            gpus=list(e.gpus),
            alerts=[IncidentAlertOut.of(a) for a in e.alerts],
            firing=e.firing,
            failures=[FailureOut.of(f) for f in e.failures],
            windows=[TimeWindowRefOut.of(w) for w in e.windows],
            links={
                "failurePage": f"/runs/{run}/failure",
                "failure": f"/v1/runs/{run}/failure",
                "preserved": f"/v1/runs/{run}/preserved",
            },
        )


class IncidentListOut(ApiModel):
    incidents: list[IncidentOut]
    limit: int
    offset: int
    now: float

    @classmethod
    def of(cls, page: IncidentPage) -> IncidentListOut:
        return cls(
            incidents=[IncidentOut.of(e) for e in page.incidents],
            limit=page.limit,
            offset=page.offset,
            now=page.now,
        )


class WindowAlertOut(ApiModel):
    id: int
    alertname: str
    severity: str
    state: str
    starts_at: float
    ends_at: float | None
    age_s: float
    summary: str
    incident_id: int | None

    @classmethod
    def of(cls, a: WindowAlert) -> WindowAlertOut:
        return cls(
            id=a.id,
            alertname=a.alertname,
            severity=a.severity,
            state=a.state,
            starts_at=a.starts_at,
            ends_at=a.ends_at,
            age_s=a.age_s,
            summary=a.summary,
            incident_id=a.incident_id,
        )


class PreservedWindowOut(ApiModel):
    """A failure window: when, why, its bounds, how far the copy got, rows kept per table."""

    id: int
    run_id: str
    failure_at: float
    start: float = Field(alias="from")
    to: float
    copied_until: float
    complete: bool
    nodes: list[str]
    alert: WindowAlertOut | None
    failure: FailureOut | None
    kept: dict[str, int] = Field(description="rows kept per table")

    @classmethod
    def of(cls, w: PreservedWindow) -> PreservedWindowOut:
        return cls(
            id=w.id,
            run_id=w.run_id,
            failure_at=w.failure_at,
            to=w.end,
            copied_until=w.copied_until,
            complete=w.complete,
            nodes=list(w.nodes),
            alert=WindowAlertOut.of(w.alert) if w.alert is not None else None,
            failure=FailureOut.of(w.failure) if w.failure is not None else None,
            kept=dict(w.kept),
            **{"from": w.start},  # a Python keyword: the field is ``start``
        )


class PreservedListOut(ApiModel):
    run_id: str
    tables: list[str]
    limit: int
    offset: int
    windows: list[PreservedWindowOut]

    @classmethod
    def of(cls, p: PreservedList) -> PreservedListOut:
        return cls(
            run_id=p.run_id,
            tables=list(p.tables),
            limit=p.limit,
            offset=p.offset,
            windows=[PreservedWindowOut.of(w) for w in p.windows],
        )


class PreservedRowsOut(ApiModel):
    run_id: str
    window_id: int
    table: str
    start: float = Field(alias="from")
    to: float
    total: int = Field(description="rows of this table in the window")
    limit: int
    offset: int
    rows: list[dict[str, Any]]

    @classmethod
    def of(cls, r: PreservedRows) -> PreservedRowsOut:
        return cls(
            run_id=r.run_id,
            window_id=r.window_id,
            table=r.table,
            to=r.end,
            total=r.total,
            limit=r.limit,
            offset=r.offset,
            rows=list(r.rows),
            **{"from": r.start},
        )
