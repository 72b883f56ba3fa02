"""The JSON of the incidents list and of the preserved failure windows (beside
:mod:`fleetlens.api.models`, whose conventions these follow: camelCase on the wire, unknown
keys refused)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .models import ApiModel

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


class TimeWindowRefOut(ApiModel):
    """A preserved failure window by id (GET /v1/runs/{run_id}/preserved/{id})."""

    id: int
    start: float = Field(alias="from")
    to: float


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


class IncidentListOut(ApiModel):
    incidents: list[IncidentOut]
    limit: int
    offset: int
    now: float


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


class PreservedListOut(ApiModel):
    run_id: str
    tables: list[str]
    limit: int
    offset: int
    windows: list[PreservedWindowOut]


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
