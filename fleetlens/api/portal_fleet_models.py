"""The JSON of the fleet pages' documents: on-call (``/v1/portal/oncall``), capacity
(``/v1/portal/capacity``) and the runs list (``/v1/portal/runs``), beside
:mod:`fleetlens.api.portal_models`, whose conventions these follow: camelCase on the wire,
unknown keys refused, a key a document leaves out in some answers has a default.

The on-call document is one of two views (``view``): ``tenant`` (the caller's jobs, nodes,
alerts) or ``infra`` (every tenant's nodes, drains and infrastructure alerts, nothing of the
runs but their ids); a list whose items differ between the views takes either item.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..services.capacity import CohortFigures, FleetBucket, JobTally
from ..services.portal_types import NodeEvent, RecentSpread
from .alert_models import AlertOut, SilenceOut
from .fleet_models import PoolGoodputOut
from .models import ApiModel, RunOut
from .portal_models import PortalEventOut
from .remediation_models import ActionOut

__all__ = [
    "CapacityBucketOut",
    "CapacityCohortOut",
    "CapacityJobsOut",
    "CapacityPeriodOut",
    "InfraAlertOut",
    "InfraIncidentOut",
    "NodeAlertEventOut",
    "NodeEventOut",
    "NodeRunOut",
    "OnCallIncidentOut",
    "OnCallJobOut",
    "OnCallNodeOut",
    "OnCallOut",
    "PortalCapacityOut",
    "PortalRunRowOut",
    "PortalRunSort",
    "PortalRunsOut",
    "RunSpreadOut",
    "WaterfallStepOut",
]


# ---- /portal/oncall -----------------------------------------------------------------------
class RunSpreadOut(ApiModel):
    """Per-rank spread over the last steps: (slowest - mean compute) / mean."""

    steps: int
    compute_max_ms: float | None
    compute_mean_ms: float | None
    spread: float | None

    @classmethod
    def of(cls, s: RecentSpread) -> RunSpreadOut:
        return cls(
            steps=s.steps,
            compute_max_ms=s.compute_max_ms,
            compute_mean_ms=s.compute_mean_ms,
            spread=s.spread,
        )


class OnCallJobOut(RunOut):
    """A live job with its goodput against the policy's threshold (tenant view)."""

    goodput: float = Field(description="runtime x program goodput")
    runtime_goodput: float
    threshold: float
    below: bool
    spread: RunSpreadOut | None = Field(description="null before the first step")


class NodeAlertEventOut(ApiModel):
    """A node's fault as a firing hardware alert names it."""

    time: float
    kind: str = Field(description="the alert's name")
    message: str
    gpu: str | None = Field(default=None, description="infra view: the alert's gpu label")


class NodeRunOut(ApiModel):
    tenant: str
    run_id: str


class OnCallNodeOut(ApiModel):
    """A node with faults: fatal and recoverable counts and its latest fault events."""

    node: str
    fatal: int
    recoverable: int
    events: list[PortalEventOut | NodeAlertEventOut] = Field(description="the latest five")
    from_alerts: bool | None = Field(
        default=None, description="tenant view: listed for its alerts (no fault event named it)"
    )
    jobs: list[str] | None = Field(
        default=None, description="tenant view: the live runs placed on it"
    )
    runs: list[NodeRunOut] | None = Field(
        default=None, description="infra view: the runs whose alerts name it"
    )


class NodeEventOut(ApiModel):
    """An event on a node, with its tenant (infra view): no rank or step."""

    time: float
    tenant: str
    run_id: str
    kind: str
    node: str
    gpu: int | None
    message: str

    @classmethod
    def of(cls, e: NodeEvent) -> NodeEventOut:
        return cls(
            time=e.time,
            tenant=e.tenant,
            run_id=e.run_id,
            kind=e.kind,
            node=e.node,
            gpu=e.gpu,
            message=e.message,
        )


class InfraAlertOut(ApiModel):
    """What infrastructure on-call sees of an alert: the node it names, not the run's labels."""

    id: int
    alertname: str
    severity: str
    tenant: str
    run_id: str
    node: str | None
    gpu: str | None
    rack: str | None
    summary: str
    starts_at: float
    incident_id: int | None
    acked_by: str | None
    silenced_by: list[int]
    acked_at: float | None
    runbook_url: str | None


class OnCallIncidentOut(ApiModel):
    """An incident of the tenant's firing alerts (tenant view)."""

    id: int
    run_id: str
    title: str
    severity: str
    status: str
    opened_at: float
    closed_at: float | None
    findings: list[str] = Field(description="the findings' keys")


class InfraIncidentOut(ApiModel):
    """An incident of infrastructure alerts, with its tenant (infra view)."""

    id: int
    tenant: str
    run_id: str
    alerts: list[str] = Field(description="'ALERTNAME on NODE' per alert")


class OnCallOut(ApiModel):
    """The on-call page's document: ``tenant`` or ``infra`` view (``jobs`` in the first only)."""

    generated_at: float
    view: Literal["tenant", "infra"]
    jobs: list[OnCallJobOut] | None = Field(default=None, description="tenant view only")
    nodes: list[OnCallNodeOut]
    drains: list[PortalEventOut | NodeEventOut]
    remediations: list[ActionOut]
    alerts: list[AlertOut | InfraAlertOut]
    incidents: list[OnCallIncidentOut | InfraIncidentOut]
    silences: list[SilenceOut]


# ---- /portal/capacity ---------------------------------------------------------------------
class CapacityPeriodOut(ApiModel):
    """The window the document covers (UNIX seconds) and the hours asked (null: all)."""

    start: float = Field(alias="from")
    to: float
    hours: float
    asked: float | None


class WaterfallStepOut(ApiModel):
    step: str = Field(description="in service, scheduling/runtime/program loss, useful")
    gpu_hours: float = Field(description="losses negative")


class CapacityBucketOut(ApiModel):
    """One bucket of the period (an hour or a day): GPU-hours in service, held, useful."""

    start: float = Field(alias="from")
    to: float
    in_service_gpu_hours: float | None
    held_gpu_hours: float
    useful_gpu_hours: float
    utilization: float | None
    goodput: float | None
    loss_by_cause: dict[str, float]
    cost_per_useful_gpu_hour: float | None
    spare_gpus: float | None = Field(description="GPUs in service no run held, on average")

    @classmethod
    def of(cls, b: FleetBucket, price: float) -> CapacityBucketOut:
        return cls.model_validate(
            {
                "from": b.start,
                "to": b.end,
                "inServiceGpuHours": b.in_service,
                "heldGpuHours": b.held,
                "usefulGpuHours": b.useful,
                "utilization": b.utilization,
                "goodput": b.goodput,
                "lossByCause": b.loss_by_cause,
                "costPerUsefulGpuHour": b.cost_per_useful_gpu_hour(price),
                "spareGpus": b.spare_gpus,
            }
        )


class CapacityCohortOut(ApiModel):
    size: str = Field(description="1-8 GPUs, 9-64 GPUs, 65-512 GPUs, 513+ GPUs, unknown size")
    runs: int
    held_gpu_hours: float
    useful_gpu_hours: float
    goodput: float | None

    @classmethod
    def of(cls, c: CohortFigures) -> CapacityCohortOut:
        return cls(
            size=c.size,
            runs=c.runs,
            held_gpu_hours=c.held_gpu_hours,
            useful_gpu_hours=c.useful_gpu_hours,
            goodput=c.goodput,
        )


class CapacityJobsOut(ApiModel):
    """The period's jobs: how they ended and their GPU-hours by size."""

    by_status: dict[str, int]
    ended: int
    success_rate: float | None
    cohorts: list[CapacityCohortOut]

    @classmethod
    def of(cls, jobs: JobTally) -> CapacityJobsOut:
        return cls(
            by_status=jobs.by_status,
            ended=jobs.ended,
            success_rate=jobs.success_rate,
            cohorts=[CapacityCohortOut.of(c) for c in jobs.cohort_figures()],
        )


class PortalCapacityOut(ApiModel):
    """GPU-hours of the period: in service, held by runs, useful; losses by cause and cost."""

    period: CapacityPeriodOut
    pool: str | None
    pool_names: list[str]
    pools: list[PoolGoodputOut]
    utilization: float | None
    goodput: float | None
    in_service_gpu_hours: float | None = Field(description="null without capacity records")
    held_gpu_hours: float
    oversubscribed_gpu_hours: float
    waterfall: list[WaterfallStepOut]
    loss_by_cause: dict[str, float] = Field(description="GPU-hours per breakdown category")
    interruptions: dict[str, int]
    findings_by_cause: dict[str, int]
    price: float
    cost_per_useful_gpu_hour: float | None
    runs: int
    series: list[CapacityBucketOut]
    spare_gpus_min: float | None
    jobs: CapacityJobsOut
    warnings: list[str]


# ---- /portal/runs -------------------------------------------------------------------------
PortalRunSort = Literal[
    "lastSeen",
    "runId",
    "status",
    "goodput",
    "stepTime",
    "findings",
    "alerts",
    "duration",
    "worldSize",
]
"""What the runs list sorts by."""


class PortalRunRowOut(RunOut):
    """A run for triage: goodput, step time, findings, firing alerts and duration."""

    goodput: float | None = Field(description="runtime x program (null: not worked out)")
    step_time_ms: float | None
    tokens_per_second: float | None
    findings: dict[str, int] = Field(description="findings per diagnosis")
    findings_count: int
    alerts_firing: int
    duration_seconds: float


class PortalRunsOut(ApiModel):
    runs: list[PortalRunRowOut]
    total: int
    offset: int
    limit: int
    sort: PortalRunSort
    order: Literal["asc", "desc"]
    sorted_within: int | None = Field(
        description="sorted by goodput: the most recently active runs the sort covers"
    )
