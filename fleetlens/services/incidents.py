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
from typing import Any

from sqlalchemy import func, literal, select, union_all
from sqlalchemy.orm import Session

from ..alerts.models import Alert, Incident, Preservation
from ..store.findings import FindingRow
from ..store.metadata import MetadataStore
from ..store.models import Finding, Run
from ..store.scope import Scope
from ..store.scoped import same_tenant, scoped
from .preserved import finding_brief

__all__ = ["INCIDENT_STATES", "list_incidents"]

INCIDENT_STATES = ("open", "closed", "unalerted")


def _alert(a: Alert, now: float) -> dict[str, Any]:
    return {
        "id": a.id,
        "alertname": a.alertname,
        "severity": a.severity,
        "audience": a.audience,
        "state": a.state,
        "startsAt": a.starts_at,
        "endsAt": a.ends_at,
        "ageS": max(0.0, now - a.starts_at),
        "ackedBy": a.acked_by or None,
        "summary": a.annotations.get("summary", ""),
        "node": a.labels.get("node") or None,
        "gpu": a.labels.get("gpu") or None,
        "ranks": [int(r) for r in a.labels.get("rank", "").split(",") if r.strip().isdigit()],
        "finding": a.finding_key or None,
    }


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
) -> dict[str, Any]:
    fs = [finding_brief(FindingRow.of(f)) for f in findings]
    als = [_alert(a, now) for a in alerts]
    # What failed: the failure the analysis is surest of, else the loudest alert's diagnosis.
    top = max(fs, key=lambda f: (f["kind"] == "failure", f["confidence"]), default=None)
    diag = next((a.labels.get("diagnosis") for a in alerts if a.labels.get("diagnosis")), None)
    owner = next((a.labels.get("owner") for a in alerts if a.labels.get("owner")), None)
    return {
        "runId": run.run_id,
        "project": run.project,
        "jobIds": _union([[f["jobId"]] for f in fs if f["jobId"]]),
        "diagnosis": top["diagnosis"] if top else diag,
        "owner": top["owner"] if top else owner,
        "summary": top["summary"] if top else (als[0]["summary"] if als else ""),
        "nodes": _union([f["nodes"] for f in fs] + [[a["node"]] for a in als if a["node"]]),
        "ranks": sorted(_union([f["ranks"] for f in fs] + [a["ranks"] for a in als])),
        "gpus": _union([f["gpus"] for f in fs]),
        "alerts": als,
        "firing": sum(1 for a in alerts if a.state == "firing"),
        "failures": fs,
        "windows": [{"id": p.id, "from": p.t0, "to": p.t1} for p in windows],
        "links": {
            "failurePage": f"/runs/{run.run_id}/failure",
            "failure": f"/v1/runs/{run.run_id}/failure",
            "preserved": f"/v1/runs/{run.run_id}/preserved",
        },
    }


class _Page:
    """The details of one page of the list, read in a few queries."""

    def __init__(self, s: Session, scope: Scope) -> None:
        self.s, self.scope = s, scope

    def incident(self, inc: Incident, run: Run, now: float) -> dict[str, Any]:
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
        return {
            "key": f"incident:{inc.id}",
            "id": inc.id,
            "title": inc.title,
            "severity": inc.severity,
            "state": inc.status,
            "time": at,
            "openedAt": inc.opened_at,
            "closedAt": inc.closed_at,
            "ageS": max(0.0, now - at),
            "durationS": max(0.0, end - inc.opened_at),
            **_entry(run, now, findings, alerts, windows),
        }

    def failure(self, f: Finding, run: Run, now: float) -> dict[str, Any]:
        at = f.time if f.time is not None else f.first_seen
        return {
            "key": f"failure:{f.id}",
            "id": None,
            "title": f"{f.diagnosis} on run {f.run_id}: {f.summary}"[:500],
            "severity": "none",
            "state": "unalerted",
            "time": at,
            "openedAt": at,
            "closedAt": None,
            "ageS": max(0.0, now - at),
            "durationS": None,
            **_entry(run, now, [f], [], []),
        }


def list_incidents(
    metadata: MetadataStore,
    scope: Scope,
    state: str | None = None,
    since: float | None = None,
    run_id: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> dict[str, Any]:
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
    out: list[dict[str, Any]] = []
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
    return {"incidents": out, "limit": limit, "offset": offset, "now": now}
