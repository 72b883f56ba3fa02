"""Where remediation actions and their run events are stored: every query the controller needs.

Actions are rows of the ``remediations`` table (SQLAlchemy, :mod:`.models`) read and written as
:class:`~.machine.Action` values; the phases an action timed are written to the run's telemetry
as events (``drain``, ``remediation`` with ``category=recovery``), so the goodput breakdown
charges them to recovery. The telemetry also answers the two questions the controller asks of the
steps: the recent step durations and the last step of a job attempt.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from sqlalchemy import Select, func, select

from ..alerts.models import Alert
from ..errors import NotFound
from ..lifecycle import LIVE
from ..store.metadata import MetadataStore
from ..store.models import Run
from ..store.reader import TenantReader
from ..store.run_queries import RunTelemetryQueries
from ..store.scope import Scope
from ..store.scoped import all_tenants, infra_scoped, same_tenant, scoped
from ..store.telemetry import TelemetryStore
from .machine import ACTIVE, Action, State
from .models import Remediation

__all__ = ["Repository"]

_COLUMNS = (
    "tenant",
    "run_id",
    "job_id",
    "node",
    "reason",
    "summary",
    "finding_key",
    "alert_id",
    "incident_id",
    "mode",
    "decided_at",
    "updated_at",
    "approved_by",
    "world_before",
    "world_after",
    "stop_step",
    "resume_step",
    "checkpoint",
    "cost",
    "error",
)


def _action(r: Remediation) -> Action:
    return Action(
        id=r.id,
        state=State(r.state),
        ranks=tuple(r.ranks or ()),
        phases={k: (v[0], v[1]) for k, v in (r.phases or {}).items()},
        acks=tuple(r.acks or ()),
        actuators=tuple(r.actuators or ()),
        **{k: getattr(r, k) for k in _COLUMNS},
    )


def _write(r: Remediation, a: Action) -> None:
    for k in _COLUMNS:
        setattr(r, k, getattr(a, k))
    r.state = a.state.value
    r.ranks = list(a.ranks)
    r.phases = {k: [v[0], v[1]] for k, v in a.phases.items()}
    r.acks = list(a.acks)
    r.actuators = list(a.actuators)


class Repository:
    def __init__(self, metadata: MetadataStore, telemetry: TelemetryStore) -> None:
        self._metadata = metadata
        self._session = metadata.session
        self.telemetry = telemetry

    # -- actions -----------------------------------------------------------------------------

    def get(self, who: Scope | str, rid: int) -> Action | None:
        """Action ``rid`` if it belongs to ``who``'s tenant (any tenant's for on-call)."""
        if isinstance(who, Scope):
            q = infra_scoped(select(Remediation), who)
        else:
            q = scoped(select(Remediation), who)
        with self._session() as s:
            r = s.scalars(q.where(Remediation.id == rid)).first()
            return _action(r) if r is not None else None

    def add(self, a: Action) -> Action:
        """Store a new action; it comes back with its id."""
        with self._session() as s:
            r = Remediation()
            _write(r, a)
            s.add(r)
            s.flush()
            return _action(r)

    def save(self, a: Action) -> None:
        with self._session() as s:
            r = s.get(Remediation, a.id)
            if r is None:
                raise NotFound(f"remediation {a.id} is gone")
            _write(r, a)

    def _select(self, q: Select[Any], project: str = "", limit: int | None = None) -> list[Action]:
        if project:  # only actions on runs of the caller's project
            q = q.where(
                select(Run.id)
                .where(
                    same_tenant(Run, Remediation),
                    Run.run_id == Remediation.run_id,
                    Run.project == project,
                )
                .exists()
            )
        q = q.order_by(Remediation.decided_at.desc()).limit(limit)
        with self._session() as s:
            return [_action(r) for r in s.scalars(q)]

    def restarting(self, tenant: str, run_id: str) -> Action | None:
        """The run's action whose restarted job attempt has not answered yet."""
        rows = self._select(
            scoped(select(Remediation), tenant).where(
                Remediation.run_id == run_id, Remediation.state == State.RESTARTING.value
            )
        )
        return rows[0] if rows else None

    def active(self, states: tuple[State, ...] = ACTIVE) -> list[Action]:
        """Actions under way (the job is being told something), every tenant."""
        q = all_tenants(select(Remediation))
        return self._select(q.where(Remediation.state.in_([s.value for s in states])))

    def for_run(self, tenant: str, run_id: str) -> list[Action]:
        return self._select(scoped(select(Remediation), tenant).where(Remediation.run_id == run_id))

    def find(self, scope: Scope, run_id: str | None, state: str | None, limit: int) -> list[Action]:
        """Newest first; every tenant's for on-call, of the caller's project if it has one."""
        q = infra_scoped(select(Remediation), scope)
        if run_id:
            q = q.where(Remediation.run_id == run_id)
        if state:
            q = q.where(Remediation.state == state)
        return self._select(q, project=scope.project, limit=limit)

    def linked(
        self,
        tenant: str,
        project: str,
        alert_id: int | None = None,
        incident_id: int | None = None,
    ) -> list[Action]:
        """The actions raised by an alert, or by the alerts of an incident."""
        link = (
            Remediation.alert_id == alert_id
            if alert_id is not None
            else Remediation.incident_id == incident_id
        )
        return self._select(scoped(select(Remediation), tenant).where(link), project=project)

    def project_of(self, tenant: str, run_id: str) -> str | None:
        """The run's project; None when the run is not registered."""
        with self._session() as s:
            run = s.scalars(scoped(select(Run), tenant).where(Run.run_id == run_id)).first()
            return run.project if run is not None else None

    def ended(self, tenant: str, run_id: str, now: float) -> str | None:
        """The run's status when it has ended (FINISHED, FAILED, STOPPED): no job is left to
        take a node out of; None while it runs (or is not registered)."""
        with self._session() as s:
            run = s.scalars(scoped(select(Run), tenant).where(Run.run_id == run_id)).first()
            if run is None:
                return None
            status, _ = self._metadata.lifecycle(s, run, now)  # the run's status, as shown
            return None if status in LIVE else status

    def alert_for(
        self, tenant: str, run_id: str, finding_key: str
    ) -> tuple[int, int | None] | None:
        """(alert id, incident id) of the newest alert the finding raised."""
        with self._session() as s:
            alert = s.scalars(
                scoped(select(Alert), tenant)
                .where(Alert.run_id == run_id, Alert.finding_key == finding_key)
                .order_by(Alert.starts_at.desc())
            ).first()
            return (alert.id, alert.incident_id) if alert is not None else None

    def state_counts(self) -> dict[tuple[str, str], int]:
        """(tenant, state) -> how many actions, for /metrics."""
        with self._session() as s:
            q = all_tenants(select(Remediation.tenant, Remediation.state, func.count()))
            rows = s.execute(q.group_by(Remediation.tenant, Remediation.state)).all()
            return {(str(t), str(st)): int(n) for t, st, n in rows}

    # -- the run's telemetry -------------------------------------------------------------------

    def step_durations(self, tenant: str, run_id: str, n: int) -> list[float]:
        """The durations of the run's last ``n`` steps, oldest first."""
        return [float(d) for d in self._run_reads(tenant).step_durations(run_id, int(n))]

    def last_step(self, tenant: str, run_id: str, job_id: str, exclude: str = "") -> int | None:
        """The last step job attempt ``job_id`` ran; ``job_id`` "": any attempt but
        ``exclude``."""
        reads = self._run_reads(tenant)
        if job_id:
            return reads.attempt_last_step(run_id, job_id)
        return reads.others_last_step(run_id, exclude)

    def _run_reads(self, tenant: str) -> RunTelemetryQueries:
        return RunTelemetryQueries(TenantReader(self.telemetry, tenant))

    def write_event(
        self, a: Action, kind: str, at: float, attrs: dict[str, Any], job_id: str
    ) -> None:
        """One run event of the action (idempotent: a retried write is deduplicated)."""
        table = pa.table(
            {
                "time": pa.array([at]),
                "kind": pa.array([kind]),
                "step": pa.array([-1], pa.int64()),
                "rank": pa.array([-1], pa.int32()),
                "node_id": pa.array([a.node]),
                "gpu": pa.array([-1], pa.int32()),
                "message": pa.array([f"remediation #{a.id} ({a.reason}): {kind}"]),
                "attrs": pa.array([json.dumps(attrs)]),
            }
        )
        ctx = {
            "tenant": a.tenant,
            "project": self.project_of(a.tenant, a.run_id) or "",
            "run_id": a.run_id,
            "job_id": job_id,
        }
        self.telemetry.insert(
            "event",
            table,
            {k: v for k, v in ctx.items() if v},
            f"remediation-{a.id}-{kind}-{attrs.get('phase', '')}",
        )
