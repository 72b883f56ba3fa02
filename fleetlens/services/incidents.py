"""The tenant's incidents, newest first: its runs' trouble in one list.

An entry is either an incident of the alert store (the page and ticket alerts of one run,
grouped while any of them fires: ``open``, then ``closed``) or a failure the analysis found that
no alert rule raised (``unalerted``: a software crash, say). Each says when, what failed
(diagnosis, owner, summary), where (jobs, nodes, ranks, GPUs), its alerts with their state and
age, the failure windows kept for it, and where to look next (the run's failure page).

Both kinds are ordered together in the database (one ``UNION ALL`` of ids and times), so a page
of the list costs one bounded query plus the details of that page, whatever the offset.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, literal, select, union_all
from sqlalchemy.orm import Session

from ..alerts.models import Alert, Incident, Preservation
from ..store.findings import FindingRow
from ..store.metadata import MetadataStore
from ..store.models import Finding, Run
from ..store.scope import Scope
from ..store.scoped import same_tenant, scoped
from .preserved import FailureBrief, finding_brief

__all__ = [
    "INCIDENT_STATES",
    "IncidentAlert",
    "IncidentEntry",
    "IncidentPage",
    "WindowRef",
    "list_incidents",
]

INCIDENT_STATES = ("open", "closed", "unalerted")


@dataclass(frozen=True, slots=True)
class IncidentAlert:
    """An alert of an incident: its state and age, and where it points (node, GPU, ranks)."""

    id: int
    alertname: str
    severity: str
    audience: str
    state: str
    starts_at: float
    ends_at: float | None
    age_s: float
    acked_by: str | None
    summary: str
    node: str | None
    gpu: str | None
    ranks: tuple[int, ...]
    finding: str | None


@dataclass(frozen=True, slots=True)
class WindowRef:
    """A preserved failure window kept for an incident, by id, with its bounds."""

    id: int
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class IncidentEntry:
    """One run's trouble: an incident of the alert store (``id``), or a failure no alert rule
    raised (``state`` unalerted, ``id`` and ``duration_s`` None)."""

    key: str
    id: int | None
    title: str
    severity: str
    state: str
    time: float
    opened_at: float
    closed_at: float | None
    age_s: float
    duration_s: float | None
    run_id: str
    project: str
    job_ids: tuple[str, ...]
    diagnosis: str | None
    owner: str | None
    summary: str
    nodes: tuple[str, ...]
    ranks: tuple[int, ...]
    gpus: tuple[str, ...]
    alerts: tuple[IncidentAlert, ...]
    firing: int
    failures: tuple[FailureBrief, ...]
    windows: tuple[WindowRef, ...]


@dataclass(frozen=True, slots=True)
class IncidentPage:
    """A page of the list, newest first, and the time it was read at."""

    incidents: tuple[IncidentEntry, ...]
    limit: int
    offset: int
    now: float


def _alert(a: Alert, now: float) -> IncidentAlert:
    return IncidentAlert(
        id=a.id,
        alertname=a.alertname,
        severity=a.severity,
        audience=a.audience,
        state=a.state,
        starts_at=a.starts_at,
        ends_at=a.ends_at,
        age_s=max(0.0, now - a.starts_at),
        acked_by=a.acked_by or None,
        summary=a.annotations.get("summary", ""),
        node=a.labels.get("node") or None,
        gpu=a.labels.get("gpu") or None,
        ranks=tuple(int(r) for r in a.labels.get("rank", "").split(",") if r.strip().isdigit()),
        finding=a.finding_key or None,
    )


def _on_run(model: Any) -> Any:
    """Join condition: the run a row of ``model`` belongs to."""
    return same_tenant(Run, model) & (Run.run_id == model.run_id)


def _union(values: Sequence[Sequence[Any]]) -> list[Any]:
    out: list[Any] = []
    for vs in values:
        for v in vs:
            if v not in out:
                out.append(v)
    return out


def _entry(
    run: Run,
    now: float,
    findings: list[Finding],
    alerts: list[Alert],
    windows: list[Preservation],
    *,
    key: str,
    id: int | None,
    title: str,
    severity: str,
    state: str,
    at: float,
    opened_at: float,
    closed_at: float | None,
    duration_s: float | None,
) -> IncidentEntry:
    fs = [finding_brief(FindingRow.of(f)) for f in findings]
    als = [_alert(a, now) for a in alerts]
    # What failed: the failure the analysis is surest of, else the loudest alert's diagnosis.
    top = max(fs, key=lambda f: (f.kind == "failure", f.confidence), default=None)
    diag = next((a.labels.get("diagnosis") for a in alerts if a.labels.get("diagnosis")), None)
    owner = next((a.labels.get("owner") for a in alerts if a.labels.get("owner")), None)
    return IncidentEntry(
        key=key,
        id=id,
        title=title,
        severity=severity,
        state=state,
        time=at,
        opened_at=opened_at,
        closed_at=closed_at,
        age_s=max(0.0, now - at),
        duration_s=duration_s,
        run_id=run.run_id,
        project=run.project,
        job_ids=tuple(_union([[f.job_id] for f in fs if f.job_id])),
        diagnosis=top.diagnosis if top else diag,
        owner=top.owner if top else owner,
        summary=top.summary if top else (als[0].summary if als else ""),
        nodes=tuple(_union([f.nodes for f in fs] + [[a.node] for a in als if a.node])),
        ranks=tuple(sorted(_union([f.ranks for f in fs] + [a.ranks for a in als]))),
        gpus=tuple(_union([f.gpus for f in fs])),
        alerts=tuple(als),
        firing=sum(1 for a in alerts if a.state == "firing"),
        failures=tuple(fs),
        windows=tuple(WindowRef(id=p.id, start=p.t0, end=p.t1) for p in windows),
    )


class _Page:
    """The details of one page of the list, read in a few queries."""

    def __init__(self, s: Session, scope: Scope) -> None:
        self.s, self.scope = s, scope

    def incident(self, inc: Incident, run: Run, now: float) -> IncidentEntry:
        alerts = list(
            self.s.scalars(
                scoped(select(Alert), self.scope)
                .where(Alert.incident_id == inc.id)
                .order_by(Alert.starts_at, Alert.id)
            ).all()
        )
        named = [[a.finding_key] for a in alerts if a.finding_key]
        keys = _union([[k] for k in inc.findings] + named)
        findings = (
            list(
                self.s.scalars(
                    scoped(select(Finding), self.scope).where(
                        Finding.run_id == inc.run_id, Finding.key.in_(keys)
                    )
                ).all()
            )
            if keys
            else []
        )
        fps = [a.fingerprint for a in alerts]
        windows = (
            list(
                self.s.scalars(
                    scoped(select(Preservation), self.scope)
                    .where(Preservation.run_id == inc.run_id, Preservation.fingerprint.in_(fps))
                    .order_by(Preservation.t0)
                ).all()
            )
            if fps
            else []
        )
        end = inc.closed_at if inc.closed_at is not None else now
        at = min((a.starts_at for a in alerts), default=inc.opened_at)
        return _entry(
            run,
            now,
            findings,
            alerts,
            windows,
            key=f"incident:{inc.id}",
            id=inc.id,
            title=inc.title,
            severity=inc.severity,
            state=inc.status,
            at=at,
            opened_at=inc.opened_at,
            closed_at=inc.closed_at,
            duration_s=max(0.0, end - inc.opened_at),
        )

    def failure(self, f: Finding, run: Run, now: float) -> IncidentEntry:
        at = f.time if f.time is not None else f.first_seen
        return _entry(
            run,
            now,
            [f],
            [],
            [],
            key=f"failure:{f.id}",
            id=None,
            title=f"{f.diagnosis} on run {f.run_id}: {f.summary}"[:500],
            severity="none",
            state="unalerted",
            at=at,
            opened_at=at,
            closed_at=None,
            duration_s=None,
        )


def list_incidents(
    metadata: MetadataStore,
    scope: Scope,
    state: str | None = None,
    since: float | None = None,
    run_id: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> IncidentPage:
    """A page of the caller's incidents, newest first (``state``: one of ``INCIDENT_STATES``;
    ``since``: opened, or failed, at or after this UNIX time)."""
    now = time.time()
    parts = []
    if state in (None, "open", "closed"):
        # An incident happened when its first alert started (it opens on the next pass).
        started = (
            select(func.min(Alert.starts_at))
            .where(same_tenant(Alert, Incident), Alert.incident_id == Incident.id)
            .correlate(Incident)
            .scalar_subquery()
        )
        t_inc = func.coalesce(started, Incident.opened_at)
        inc = scoped(
            scoped(
                select(
                    literal("incident").label("kind"), Incident.id.label("id"), t_inc.label("t")
                ).join(Run, _on_run(Incident)),
                scope,
                Incident,
            ),
            scope,
            Run,
            within="project",
        )
        if state:
            inc = inc.where(Incident.status == state)
        if since is not None:
            inc = inc.where(t_inc >= since)
        if run_id:
            inc = inc.where(Incident.run_id == run_id)
        parts.append(inc)
    if state in (None, "unalerted"):
        alerted = (
            select(Alert.id)
            .where(
                same_tenant(Alert, Finding),
                Alert.run_id == Finding.run_id,
                Alert.finding_key == Finding.key,
            )
            .correlate(Finding)
            .exists()
        )
        at = func.coalesce(Finding.time, Finding.first_seen)
        fail = scoped(
            scoped(
                select(literal("failure").label("kind"), Finding.id.label("id"), at.label("t"))
                .join(Run, _on_run(Finding))
                .where(Finding.kind == "failure", ~alerted),
                scope,
                Finding,
            ),
            scope,
            Run,
            within="project",
        )
        if since is not None:
            fail = fail.where(at >= since)
        if run_id:
            fail = fail.where(Finding.run_id == run_id)
        parts.append(fail)
    out: list[IncidentEntry] = []
    with metadata.session() as s:
        if parts:
            u = union_all(*parts).subquery()
            page = s.execute(
                select(u.c.kind, u.c.id)
                .order_by(u.c.t.desc(), u.c.kind, u.c.id.desc())
                .limit(limit)
                .offset(offset)
            ).all()
        else:
            page = []
        details = _Page(s, scope)
        for kind, oid in page:
            model: Any = Incident if kind == "incident" else Finding
            row = s.execute(
                scoped(select(model, Run).join(Run, _on_run(model)), scope, model, Run).where(
                    model.id == oid
                )
            ).first()
            if row is None:
                continue  # removed between the two reads
            obj, run = row
            entry = details.incident if kind == "incident" else details.failure
            out.append(entry(obj, run, now))
    return IncidentPage(incidents=tuple(out), limit=limit, offset=offset, now=now)
