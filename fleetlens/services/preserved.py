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

__all__ = ["PRESERVED_TABLES", "PreservedWindows"]

PRESERVED_TABLES = tuple(k.table for k in preserved_kinds())
"""The tables a window keeps: steps (with their phases), scalars, collectives, events, GPU and
node samples."""

_KINDS = {k.table: k for k in preserved_kinds()}


def _cell(v: Any) -> Any:
    """JSON has no NaN: a missing phase or sample value is null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def finding_brief(f: FindingRow) -> dict[str, Any]:
    """A finding in a window's or an incident's answer: what, who owns it, where, when."""
    return {
        "key": f.key,
        "kind": f.kind,
        "diagnosis": f.diagnosis,
        "owner": f.owner,
        "confidence": f.confidence,
        "summary": f.summary,
        "step": f.step if f.step >= 0 else None,
        "time": f.time,
        "jobId": f.job_id,
        "ranks": list(f.ranks),
        "nodes": list(f.nodes),
        "gpus": list(f.gpus),
    }


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

    def _json(
        self, p: Preservation, a: Alert | None, findings: dict[str, FindingRow], now: float
    ) -> dict[str, Any]:
        finding = findings.get(a.finding_key) if a is not None and a.finding_key else None
        return {
            "id": p.id,
            "runId": p.run_id,
            "failureAt": a.starts_at if a is not None else (p.t0 + p.t1) / 2,
            "from": p.t0,
            "to": p.t1,
            "copiedUntil": p.copied_until,
            "complete": p.copied_until >= p.t1,
            "nodes": list(p.nodes),
            "alert": None
            if a is None
            else {
                "id": a.id,
                "alertname": a.alertname,
                "severity": a.severity,
                "state": a.state,
                "startsAt": a.starts_at,
                "endsAt": a.ends_at,
                "ageS": max(0.0, now - a.starts_at),
                "summary": a.annotations.get("summary", ""),
                "incidentId": a.incident_id,
            },
            "failure": finding_brief(finding) if finding is not None else None,
            "kept": {kind.table: self._count(kind, p) for kind in preserved_kinds()},
        }

    def list(self, run_id: str, limit: int = 20, offset: int = 0) -> dict[str, Any]:
        """The run's windows, the latest first, each with its cause and its row counts."""
        windows = self._windows(run_id, limit=limit, offset=offset)
        findings = {f.key: f for f in FindingsStore(self.metadata).rows(self.scope, run_id)}
        now = time.time()
        return {
            "runId": run_id,
            "tables": list(PRESERVED_TABLES),
            "limit": limit,
            "offset": offset,
            "windows": [self._json(p, a, findings, now) for p, a in windows],
        }

    def rows(
        self, run_id: str, window_id: int, table: str, limit: int = 1000, offset: int = 0
    ) -> dict[str, Any]:
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
        return {
            "runId": run_id,
            "windowId": p.id,
            "table": table,
            "from": p.t0,
            "to": p.t1,
            "total": total,
            "limit": limit,
            "offset": offset,
            # the tenant is the caller's; `_`-columns are the store's bookkeeping (``_stored``)
            "rows": [
                {k: _cell(v) for k, v in r.items() if k != "tenant" and not k.startswith("_")}
                for r in got
            ],
        }
