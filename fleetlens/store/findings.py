"""Findings of the analysis loop in the metadata store: upserts, reads, cursors, baselines.

Findings live beside the run graph (SQLite embedded, PostgreSQL at scale) because they are few
and are read by run; the telemetry they were computed from stays in ClickHouse. The loop writes
for any tenant (it is the server's own process); every read takes the caller's scope.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import delete, select

from ..analysis.rootcause import Diagnosis
from .metadata import MetadataStore
from .models import AnalysisCursor, Finding, Run, WorkloadBaseline
from .scope import Scope

__all__ = ["FindingsStore", "RunToAnalyze", "finding_json"]


class RunToAnalyze:
    def __init__(self, tenant: str, run_id: str, last_seen: float, world: int,
                 config: dict[str, Any], state: dict[str, Any]) -> None:  # fmt: skip
        self.tenant, self.run_id, self.last_seen = tenant, run_id, last_seen
        self.world, self.config, self.state = world, config, state


def finding_json(f: Finding) -> dict[str, Any]:
    return {
        "key": f.key,
        "kind": f.kind,
        "diagnosis": f.diagnosis,
        "owner": f.owner,
        "confidence": f.confidence,
        "summary": f.summary,
        "step": f.step,
        "startStep": f.start_step,
        "endStep": f.end_step if f.end_step >= 0 else None,
        "time": f.time,
        "jobId": f.job_id or None,
        "ranks": list(f.ranks or []),
        "nodes": list(f.nodes or []),
        "gpus": list(f.gpus or []),
        "rack": f.rack or None,
        "evidence": list(f.evidence or []),
        "firstSeen": f.first_seen,
        "updatedAt": f.updated_at,
    }


class FindingsStore:
    """Findings, cursors and baselines, on the metadata store's database."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata
        self._session = metadata._session  # one database, one session factory

    # ---- the loop's side ------------------------------------------------------------------
    def runs_with_new_data(self, limit: int = 50) -> list[RunToAnalyze]:
        """Runs whose ``last_seen`` moved since the loop's last pass over them (oldest first)."""
        with self._session() as s:
            rows = s.execute(
                select(Run, AnalysisCursor)
                .outerjoin(
                    AnalysisCursor,
                    (AnalysisCursor.tenant == Run.tenant) & (AnalysisCursor.run_id == Run.run_id),
                )
                .where((AnalysisCursor.id.is_(None)) | (Run.last_seen > AnalysisCursor.seen_last))
                .order_by(Run.last_seen)
                .limit(limit)
            ).all()
            return [
                RunToAnalyze(
                    r.tenant,
                    r.run_id,
                    r.last_seen,
                    r.world_size,
                    dict(r.config or {}),
                    dict(c.state or {}) if c is not None else {},
                )
                for r, c in rows
            ]

    def save_cursor(
        self, tenant: str, run_id: str, seen_last: float, state: dict[str, Any]
    ) -> None:
        """Store the loop's state; ``seen_last`` -1 asks for another pass (work left over)."""
        with self._session() as s:
            c = s.scalars(
                select(AnalysisCursor).where(
                    AnalysisCursor.tenant == tenant, AnalysisCursor.run_id == run_id
                )
            ).first()
            now = time.time()
            if c is None:
                s.add(AnalysisCursor(tenant=tenant, run_id=run_id, seen_last=seen_last,
                                     state=state, updated_at=now))  # fmt: skip
            else:
                c.seen_last, c.state, c.updated_at = seen_last, state, now

    def upsert(self, tenant: str, run_id: str, found: list[Diagnosis],
               replace_kind: str | None = None) -> list[Finding]:  # fmt: skip
        """Insert or update findings by key; the earliest detection is kept. With
        ``replace_kind``, findings of that kind not in ``found`` are removed (reclassified)."""
        now = time.time()
        out = []
        with self._session() as s:
            existing = {
                f.key: f
                for f in s.scalars(
                    select(Finding).where(Finding.tenant == tenant, Finding.run_id == run_id)
                )
            }
            keys = {d.key for d in found}
            if replace_kind:
                for k, f in existing.items():
                    if f.kind == replace_kind and k not in keys:
                        s.delete(f)
            for d in found:
                old = existing.get(d.key)
                if old is None:
                    f = Finding(tenant=tenant, run_id=run_id, key=d.key, first_seen=now,
                                step=d.step, time=d.time, start_step=d.start_step,
                                end_step=d.end_step, confidence=0.0)  # fmt: skip
                    s.add(f)
                    existing[d.key] = f
                else:
                    f = old
                if old is not None and (d.diagnosis != f.diagnosis or d.step < f.step):
                    f.step, f.time = d.step, d.time
                # A failure stays a failure: a warning about the same thing (e.g. ECC still
                # climbing after the Xid it announced) does not downgrade it.
                if not (old is not None and f.kind == "failure" and d.kind != "failure"):
                    f.kind, f.diagnosis, f.owner = d.kind, d.diagnosis, d.owner
                    f.summary = d.summary[:1024]
                f.confidence = max(d.confidence, f.confidence or 0.0)
                f.start_step = min(d.start_step, f.start_step)
                if d.end_step < 0 or d.kind == "straggler":
                    f.end_step = d.end_step
                else:
                    f.end_step = max(d.end_step, f.end_step)
                f.job_id, f.rack = d.job_id, d.rack
                f.ranks, f.nodes, f.gpus = d.ranks[:4096], d.nodes[:1024], d.gpus[:1024]
                f.evidence = d.evidence[:50]
                f.updated_at = now
                if f not in out:
                    out.append(f)
        return out

    def baseline(self, tenant: str, signature: str, metric: str) -> dict[str, Any]:
        with self._session() as s:
            b = s.scalars(
                select(WorkloadBaseline).where(
                    WorkloadBaseline.tenant == tenant,
                    WorkloadBaseline.signature == signature,
                    WorkloadBaseline.metric == metric,
                )
            ).first()
            return dict(b.values or {}) if b is not None else {}

    def save_baseline(
        self, tenant: str, signature: str, metric: str, values: dict[str, Any]
    ) -> None:
        with self._session() as s:
            b = s.scalars(
                select(WorkloadBaseline).where(
                    WorkloadBaseline.tenant == tenant,
                    WorkloadBaseline.signature == signature,
                    WorkloadBaseline.metric == metric,
                )
            ).first()
            if b is None:
                s.add(WorkloadBaseline(tenant=tenant, signature=signature, metric=metric,
                                       values=values, updated_at=time.time()))  # fmt: skip
            else:
                b.values, b.updated_at = values, time.time()

    # ---- the API's side -------------------------------------------------------------------
    def list(
        self, scope: Scope, run_id: str, kinds: tuple[str, ...] | None = None
    ) -> list[dict[str, Any]]:
        """A run's findings (the caller has checked the run against its scope)."""
        with self._session() as s:
            q = select(Finding).where(Finding.tenant == scope.tenant, Finding.run_id == run_id)
            if kinds:
                q = q.where(Finding.kind.in_(kinds))
            rows = s.scalars(q.order_by(Finding.step, Finding.key)).all()
            return [finding_json(f) for f in rows]

    def clear(self, tenant: str, run_id: str) -> None:
        with self._session() as s:
            s.execute(delete(Finding).where(Finding.tenant == tenant, Finding.run_id == run_id))
