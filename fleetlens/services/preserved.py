"""A run's preserved failure windows: when, why, what was kept, and the rows themselves.

A page or ticket alert schedules a window (``Preservation``: T-10 min to T+10 min around the
alert's start) and the monitoring loop copies the run's raw telemetry in it to the
``preserved_<table>`` tables, which retention never trims (:mod:`fleetlens.alerts.preserve`,
:mod:`fleetlens.store.preserved_queries`).
This read model answers what those windows hold: the alert and the finding that caused each,
the bounds, how far the copy got, and per table the count of rows kept; and, one table of one
window at a time, the rows, bounded and paginated.

Windows that overlap (a fatal Xid and the hang it causes) copy the same rows twice; counts and
rows are read ``DISTINCT`` so each row shows once per window.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from ..alerts.models import Alert, Preservation
from ..errors import ConfigError, NotFound
from ..schema import RecordKind
from ..store.findings import FindingRow, FindingsStore
from ..store.metadata import MetadataStore
from ..store.preserved_queries import PreservedQueries, preserved_kinds
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.scoped import same_tenant, scoped
from ..store.telemetry import TelemetryStore

__all__ = [
    "PRESERVED_TABLES",
    "FailureBrief",
    "PreservedList",
    "PreservedRows",
    "PreservedWindow",
    "PreservedWindows",
    "WindowAlert",
    "finding_brief",
]

PRESERVED_TABLES = tuple(k.table for k in preserved_kinds())
"""The tables a window keeps: steps (with their phases), scalars, collectives, events, GPU and
node samples."""

_KINDS = {k.table: k for k in preserved_kinds()}


def _cell(v: Any) -> Any:
    """JSON has no NaN: a missing phase or sample value is null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


@dataclass(frozen=True, slots=True)
class FailureBrief:
    """A finding in a window's or an incident's answer: what, who owns it, where, when."""

    key: str
    kind: str
    diagnosis: str
    owner: str
    confidence: float
    summary: str
    step: int | None
    time: float | None
    job_id: str | None
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    gpus: tuple[str, ...]


def finding_brief(f: FindingRow) -> FailureBrief:
    """A finding as a window or an incident shows it (``step`` None when unknown)."""
    return FailureBrief(
        key=f.key,
        kind=f.kind,
        diagnosis=f.diagnosis,
        owner=f.owner,
        confidence=f.confidence,
        summary=f.summary,
        step=f.step if f.step >= 0 else None,
        time=f.time,
        job_id=f.job_id,
        ranks=tuple(f.ranks),
        nodes=tuple(f.nodes),
        gpus=tuple(f.gpus),
    )


@dataclass(frozen=True, slots=True)
class WindowAlert:
    """The alert that scheduled a window."""

    id: int
    alertname: str
    severity: str
    state: str
    starts_at: float
    ends_at: float | None
    age_s: float
    summary: str
    incident_id: int | None


@dataclass(frozen=True, slots=True)
class PreservedWindow:
    """A failure window: when, why, its bounds, how far the copy got, rows kept per table."""

    id: int
    run_id: str
    failure_at: float
    start: float
    end: float
    copied_until: float
    complete: bool
    nodes: tuple[str, ...]
    alert: WindowAlert | None
    failure: FailureBrief | None
    kept: dict[str, int]


@dataclass(frozen=True, slots=True)
class PreservedList:
    """A page of a run's windows, the latest first."""

    run_id: str
    tables: tuple[str, ...]
    limit: int
    offset: int
    windows: tuple[PreservedWindow, ...]


@dataclass(frozen=True, slots=True)
class PreservedRows:
    """A page of one table's rows in one window (each row: its columns, as stored)."""

    run_id: str
    window_id: int
    table: str
    start: float
    end: float
    total: int
    limit: int
    offset: int
    rows: tuple[dict[str, Any], ...]


class PreservedWindows:
    """The caller's view of its runs' failure windows (metadata and telemetry, both scoped)."""

    def __init__(self, metadata: MetadataStore, telemetry: TelemetryStore, scope: Scope) -> None:
        self.metadata = metadata
        self.scope = scope
        self.queries = PreservedQueries(TenantReader(telemetry, scope))

    def _windows(
        self, run_id: str, window_id: int | None = None, limit: int = 100, offset: int = 0
    ) -> list[tuple[Preservation, Alert | None]]:
        self.metadata.get_run(self.scope, run_id)  # 404 unless the caller may see the run
        with self.metadata.session() as s:
            q = scoped(
                select(Preservation, Alert).outerjoin(
                    Alert,
                    same_tenant(Alert, Preservation)
                    & (Alert.fingerprint == Preservation.fingerprint),
                ),
                self.scope,
                Preservation,
            ).where(Preservation.run_id == run_id)
            if window_id is not None:
                q = q.where(Preservation.id == window_id)
            q = q.order_by(Preservation.t0.desc(), Preservation.id.desc())
            rows = s.execute(q.limit(limit).offset(offset)).all()
            return [(p, a) for p, a in rows]

    def _count(self, kind: RecordKind, p: Preservation) -> int:
        return self.queries.kept_count(kind, p.run_id, list(p.nodes), p.t0, p.t1)

    def _window(
        self, p: Preservation, a: Alert | None, findings: dict[str, FindingRow], now: float
    ) -> PreservedWindow:
        finding = findings.get(a.finding_key) if a is not None and a.finding_key else None
        return PreservedWindow(
            id=p.id,
            run_id=p.run_id,
            failure_at=a.starts_at if a is not None else (p.t0 + p.t1) / 2,
            start=p.t0,
            end=p.t1,
            copied_until=p.copied_until,
            complete=p.copied_until >= p.t1,
            nodes=tuple(p.nodes),
            alert=None
            if a is None
            else WindowAlert(
                id=a.id,
                alertname=a.alertname,
                severity=a.severity,
                state=a.state,
                starts_at=a.starts_at,
                ends_at=a.ends_at,
                age_s=max(0.0, now - a.starts_at),
                summary=a.annotations.get("summary", ""),
                incident_id=a.incident_id,
            ),
            failure=finding_brief(finding) if finding is not None else None,
            kept={kind.table: self._count(kind, p) for kind in preserved_kinds()},
        )

    def list(self, run_id: str, limit: int = 20, offset: int = 0) -> PreservedList:
        """The run's windows, the latest first, each with its cause and its row counts."""
        windows = self._windows(run_id, limit=limit, offset=offset)
        findings = {f.key: f for f in FindingsStore(self.metadata).rows(self.scope, run_id)}
        now = time.time()
        return PreservedList(
            run_id=run_id,
            tables=PRESERVED_TABLES,
            limit=limit,
            offset=offset,
            windows=tuple(self._window(p, a, findings, now) for p, a in windows),
        )

    def rows(
        self, run_id: str, window_id: int, table: str, limit: int = 1000, offset: int = 0
    ) -> PreservedRows:
        """One table's rows in one window, in time order: ``limit`` of them from ``offset``."""
        kind = _KINDS.get(table)
        if kind is None:
            raise ConfigError(
                f"table {table!r} is not kept in a failure window; use one of "
                f"{', '.join(PRESERVED_TABLES)}"
            )
        found = self._windows(run_id, window_id, limit=1)
        if not found:
            raise NotFound(f"failure window {window_id} of run {run_id!r} does not exist")
        p, _ = found[0]
        got = self.queries.kept_rows(
            kind, p.run_id, list(p.nodes), p.t0, p.t1, limit, offset
        ).to_pylist()
        total = self._count(kind, p)
        return PreservedRows(
            run_id=run_id,
            window_id=p.id,
            table=table,
            start=p.t0,
            end=p.t1,
            total=total,
            limit=limit,
            offset=offset,
            # the tenant is the caller's; `_`-columns are the store's bookkeeping (``_stored``)
            rows=tuple(
                {k: _cell(v) for k, v in r.items() if k != "tenant" and not k.startswith("_")}
                for r in got
            ),
        )
