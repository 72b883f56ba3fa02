"""Alerts and incidents in the metadata store: the firing -> resolved lifecycle.

``apply`` takes the alerts that should be firing for a set of runs (from the engine) and
returns what must be notified: new alerts, reminders of old ones (every ``repeat_s``), and
resolutions. Alerts are deduplicated by fingerprint, grouped per run into an incident, and a new
page or ticket schedules the preservation of its failure window. Every read takes the caller's
scope; acknowledgement and manual resolution are audited.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import NotFound
from ..store.access import AccessStore
from ..store.metadata import MetadataStore
from ..store.scope import Scope
from ..store.scoped import all_tenants, infra_scoped, scoped
from .engine import Candidate
from .models import Alert, Incident, Preservation
from .notifiers import AlertPayload
from .runbooks import runbook_url
from .silences import ActiveSilences
from .silences import active as active_silences

__all__ = ["PRESERVE_S", "AlertStore", "AlertView", "IncidentView", "alert_view", "queue_order"]

PRESERVE_S = 600.0
"""A failure window keeps raw telemetry from T-10 min to T+10 min at full resolution."""

_SEVERITY_RANK = {"page": 2, "ticket": 1, "never": 0}


@dataclass(frozen=True)
class AlertView:
    """One alert: firing or resolved, acknowledged or not, and what raised it."""

    id: int
    fingerprint: str
    alertname: str
    severity: str
    audience: str
    state: str
    run_id: str
    labels: dict[str, str]
    annotations: dict[str, str]
    """summary, description, runbook_url."""
    finding: str | None
    """The key of the finding that raised it."""
    step: int | None
    starts_at: float
    ends_at: float | None
    acked_by: str | None
    acked_at: float | None
    incident_id: int | None
    notified_at: float | None
    tenant: str
    silenced_by: list[int] | None = None
    """The silences holding it back now; None where not looked up (lists look them up)."""


@dataclass(frozen=True)
class IncidentView:
    """An incident: a run's alerts grouped, their findings, open until none fires."""

    id: int
    run_id: str
    title: str
    severity: str
    status: str
    opened_at: float
    closed_at: float | None
    findings: list[str]
    """Keys of the findings its alerts name."""
    alerts: list[AlertView]


Alerts = list[AlertView]


def queue_order(a: AlertView) -> tuple[int, bool, float]:
    """On-call's order of firing alerts: pages before tickets, the ones nobody acknowledged or
    silenced first, then the longest firing."""
    handled = bool(a.acked_by) or bool(a.silenced_by)
    return (-_SEVERITY_RANK.get(a.severity, 0), handled, float(a.starts_at))


def alert_view(a: Alert) -> AlertView:
    return AlertView(
        id=a.id,
        fingerprint=a.fingerprint,
        alertname=a.alertname,
        severity=a.severity,
        audience=a.audience,
        state=a.state,
        run_id=a.run_id,
        labels=a.labels,
        annotations=a.annotations,
        finding=a.finding_key or None,
        step=a.step if a.step >= 0 else None,
        starts_at=a.starts_at,
        ends_at=a.ends_at,
        acked_by=a.acked_by or None,
        acked_at=a.acked_at,
        incident_id=a.incident_id,
        notified_at=a.notified_at,
        tenant=a.tenant,
    )


def _payload(a: Alert, base_url: str) -> AlertPayload:
    return AlertPayload(
        a.fingerprint,
        dict(a.labels),
        dict(a.annotations),
        a.starts_at,
        a.ends_at,
        f"{base_url}/v1/alerts/{a.id}" if base_url else "",
    )


class AlertStore:
    def __init__(
        self,
        metadata: MetadataStore,
        access: AccessStore,
        base_url: str = "",
        repeat_s: float = 4 * 3600.0,
    ) -> None:
        self._session = metadata.session  # one database, one session factory
        self.access = access
        self.base_url = base_url
        self.repeat_s = repeat_s

    def apply(
        self,
        tenant: str,
        run_ids: Iterable[str] | None,
        candidates: list[Candidate],
        now: float | None = None,
        *,
        names: Collection[str] | None = None,
        exclude: Collection[str] = (),
    ) -> list[AlertPayload]:
        """Reconcile the stored alerts of ``run_ids`` (None: every run) with what should fire
        now; only alerts named in ``names`` (None: any) and not in ``exclude``, so passes that
        raise different alerts (runs, evaluations) do not resolve each other's."""
        now = time.time() if now is None else now
        out: list[AlertPayload] = []
        by_fp = {c.fingerprint: c for c in candidates}
        with self._session() as s:
            q = scoped(select(Alert), tenant)
            if run_ids is not None:
                q = q.where(Alert.run_id.in_(set(run_ids)))
            if names is not None:
                q = q.where(Alert.alertname.in_(list(names)))
            if exclude:
                q = q.where(Alert.alertname.not_in(list(exclude)))
            stored = {a.fingerprint: a for a in s.scalars(q).all()}
            silences = active_silences(s, tenant, now)
            for fp, c in by_fp.items():
                ann = {**c.annotations, "runbook_url": runbook_url(c.rule, self.base_url)}
                a = stored.get(fp)
                if a is not None and a.state != "firing" and c.ends_at is not None:
                    continue  # it already fired and cleared
                if a is None:
                    a = Alert(
                        tenant=tenant,
                        fingerprint=fp,
                        alertname=c.rule.name,
                        severity=c.rule.severity,
                        audience=c.rule.audience,
                        state="firing",
                        run_id=c.labels.get("run_id", ""),
                        labels=c.labels,
                        annotations=ann,
                        finding_key=c.finding_key,
                        step=c.step,
                        starts_at=c.starts_at,
                        ends_at=None,
                        updated_at=now,
                        notified_at=None,
                        acked_by="",
                    )
                    s.add(a)
                    s.flush()
                    self._join_incident(s, a, now)
                    self._preserve(s, a, now)
                elif a.state != "firing":
                    if a.acked_by == "resolved-by-operator" and a.finding_key == c.finding_key:
                        continue  # an operator cleared it; the same finding does not re-fire
                    a.state, a.starts_at, a.ends_at = "firing", c.starts_at, None
                    a.labels, a.annotations, a.updated_at = c.labels, ann, now
                    a.finding_key, a.step, a.notified_at = c.finding_key, c.step, None
                    a.acked_by, a.acked_at = "", None
                    self._join_incident(s, a, now)
                    self._preserve(s, a, now)
                else:
                    a.annotations, a.updated_at = ann, now
                # A silenced alert notifies no one (nor is it reminded of); once the silence is
                # over, the next pass notifies it if it still fires.
                due = a.notified_at is None or now - a.notified_at >= self.repeat_s
                if due and not silences.matching(a.labels, a.audience):
                    a.notified_at = now
                    out.append(_payload(a, self.base_url))
                if c.ends_at is not None:  # cleared since: on record as fired, then resolved
                    a.state, a.ends_at, a.updated_at = "resolved", c.ends_at, now
                    if a.notified_at is not None:  # receivers heard it fire: tell them it ended
                        out.append(_payload(a, self.base_url))
                    self._maybe_close(s, tenant, a.incident_id, now)
            for fp, a in stored.items():
                if a.state == "firing" and fp not in by_fp:
                    a.state, a.ends_at, a.updated_at = "resolved", now, now
                    if a.notified_at is not None:
                        out.append(_payload(a, self.base_url))
                    self._maybe_close(s, tenant, a.incident_id, now)
        return out

    @staticmethod
    def _join_incident(s: Session, a: Alert, now: float) -> None:
        inc = s.scalars(
            scoped(select(Incident), a.tenant).where(
                Incident.run_id == a.run_id, Incident.status == "open"
            )
        ).first()
        if inc is None:
            inc = Incident(
                tenant=a.tenant,
                run_id=a.run_id,
                status="open",
                opened_at=now,
                closed_at=None,
                severity=a.severity,
                findings=[],
                title=f"{a.alertname} on run {a.run_id}: {a.annotations.get('summary', '')}"[:500],
            )
            s.add(inc)
            s.flush()
        if _SEVERITY_RANK[a.severity] > _SEVERITY_RANK.get(inc.severity, 0):
            inc.severity = a.severity
        if a.finding_key and a.finding_key not in inc.findings:
            inc.findings = [*inc.findings, a.finding_key]
        a.incident_id = inc.id

    @staticmethod
    def _maybe_close(s: Session, tenant: str, incident_id: int | None, now: float) -> None:
        if incident_id is None:
            return
        s.flush()
        firing = s.scalars(
            scoped(select(Alert.id), tenant).where(
                Alert.incident_id == incident_id, Alert.state == "firing"
            )
        ).first()
        if firing is None:
            inc = s.get(Incident, incident_id)
            if inc is not None and inc.status == "open":
                inc.status, inc.closed_at = "closed", now

    @staticmethod
    def _preserve(s: Session, a: Alert, now: float) -> None:
        if a.severity not in ("page", "ticket") or a.labels.get("evaluation_id"):
            return  # an evaluation's regression has no training telemetry window to keep
        node = a.labels.get("node", "")
        s.add(
            Preservation(
                tenant=a.tenant,
                run_id=a.run_id,
                nodes=[node] if node else [],
                fingerprint=a.fingerprint,
                t0=a.starts_at - PRESERVE_S,
                t1=a.starts_at + PRESERVE_S,
                copied_until=a.starts_at - PRESERVE_S,
            )
        )

    # -- preservation, for the server loop ----------------------------------------------------

    def pending_preservations(self, now: float) -> list[Preservation]:
        with self._session() as s:
            rows = s.scalars(
                all_tenants(select(Preservation)).where(
                    Preservation.copied_until < Preservation.t1, Preservation.copied_until < now
                )
            ).all()
            return list(rows)

    def mark_preserved(self, pid: int, until: float) -> None:
        with self._session() as s:
            p = s.get(Preservation, pid)
            if p is not None:
                p.copied_until = max(p.copied_until, until)

    # -- reads and operator actions -----------------------------------------------------------

    def list_infra(
        self, scope: Scope, state: str | None = None, limit: int = 200
    ) -> list[AlertView]:
        """Alerts for infrastructure on-call (audience ``infra_oncall``: hardware faults, drained
        nodes), each with its ``tenant``: every tenant's for a scope with ``cross_tenant_infra``
        (role oncall), the caller's tenant's for any other."""
        with self._session() as s:
            q = infra_scoped(select(Alert), scope).where(Alert.audience == "infra_oncall")
            if state:
                q = q.where(Alert.state == state)
            rows = s.scalars(q.order_by(Alert.updated_at.desc()).limit(limit)).all()
            return self._silenced(s, [alert_view(a) for a in rows if self._visible(scope, a)])

    def list(
        self, scope: Scope, state: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[AlertView]:
        """The caller's alerts, newest first, each with the silences holding it back."""
        with self._session() as s:
            q = scoped(select(Alert), scope)
            if state:
                q = q.where(Alert.state == state)
            if run_id:
                q = q.where(Alert.run_id == run_id)
            rows = s.scalars(q.order_by(Alert.updated_at.desc()).limit(limit)).all()
            return self._silenced(s, [alert_view(a) for a in rows if self._visible(scope, a)])

    @staticmethod
    def _silenced(s: Session, alerts: Alerts) -> Alerts:
        """Each alert with the silences holding it back now (none for a resolved one)."""
        now = time.time()
        by_tenant: dict[str, ActiveSilences] = {}
        out: Alerts = []
        for a in alerts:
            if a.state != "firing":
                out.append(replace(a, silenced_by=[]))
                continue
            if a.tenant not in by_tenant:
                by_tenant[a.tenant] = active_silences(s, a.tenant, now)
            out.append(replace(a, silenced_by=by_tenant[a.tenant].matching(a.labels, a.audience)))
        return out

    @staticmethod
    def _visible(scope: Scope, a: Alert) -> bool:
        return not scope.project or a.labels.get("project") == scope.project

    def _get(self, s: Session, scope: Scope, alert_id: int) -> Alert:
        """The alert if the scope sees it: its tenant's, or for on-call (``read:infra``) any
        tenant's infrastructure alert, as :meth:`list_infra` lists them."""
        if scope.cross_tenant_infra:
            q = infra_scoped(select(Alert), scope).where(Alert.audience == "infra_oncall")
        else:
            q = scoped(select(Alert), scope)
        a = s.scalars(q.where(Alert.id == alert_id)).first()
        if a is None or not self._visible(scope, a):
            raise NotFound(f"alert {alert_id} does not exist")
        return a

    def get(self, scope: Scope, alert_id: int) -> AlertView:
        with self._session() as s:
            return alert_view(self._get(s, scope, alert_id))

    def ack(self, scope: Scope, alert_id: int) -> AlertView:
        with self._session() as s:
            a = self._get(s, scope, alert_id)
            a.acked_by, a.acked_at = scope.actor, time.time()
            out, tenant = alert_view(a), a.tenant
        self.access.audit(
            tenant,
            scope.actor,
            "alert.ack",
            f"alert:{alert_id}",
            {"alertname": out.alertname, "run": out.run_id},
            scope.remote,
        )
        return out

    def resolve(self, scope: Scope, alert_id: int) -> tuple[AlertView, AlertPayload | None]:
        """An operator clears an alert (e.g. the GPU was replaced); it is notified as resolved."""
        now = time.time()
        payload = None
        with self._session() as s:
            a = self._get(s, scope, alert_id)
            if a.state == "firing":
                a.state, a.ends_at, a.updated_at = "resolved", now, now
                a.acked_by, a.acked_at = "resolved-by-operator", now
                payload = _payload(a, self.base_url)
                self._maybe_close(s, scope.tenant, a.incident_id, now)
            out = alert_view(a)
        self.access.audit(
            scope.tenant,
            scope.actor,
            "alert.resolve",
            f"alert:{alert_id}",
            {"alertname": out.alertname, "run": out.run_id},
            scope.remote,
        )
        return out, payload

    def incident(self, scope: Scope, incident_id: int) -> IncidentView:
        with self._session() as s:
            inc = s.scalars(
                scoped(select(Incident), scope).where(Incident.id == incident_id)
            ).first()
            if inc is None:
                raise NotFound(f"incident {incident_id} does not exist")
            alerts = s.scalars(
                scoped(select(Alert), scope)
                .where(Alert.incident_id == inc.id)
                .order_by(Alert.starts_at)
            ).all()
            if scope.project and not any(self._visible(scope, a) for a in alerts):
                raise NotFound(f"incident {incident_id} does not exist")
            return IncidentView(
                id=inc.id,
                run_id=inc.run_id,
                title=inc.title,
                severity=inc.severity,
                status=inc.status,
                opened_at=inc.opened_at,
                closed_at=inc.closed_at,
                findings=list(inc.findings),
                alerts=[alert_view(a) for a in alerts],
            )
