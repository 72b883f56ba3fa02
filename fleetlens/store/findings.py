"""Findings of the analysis loop in the metadata store: upserts, reads, cursors, baselines.

Findings live beside the run graph (SQLite embedded, PostgreSQL at scale) because they are few
and are read by run; the telemetry they were computed from stays in ClickHouse. The loop writes
for any tenant (it is the server's own process); every read takes the caller's scope.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import delete, func, select

from .captures import capture_evidence, matches, run_captures
from .metadata import MetadataStore
from .models import AnalysisCursor, Finding, Run, WorkloadBaseline
from .scope import Scope
from .scoped import all_tenants, same_tenant, scoped

__all__ = ["FindingInput", "FindingRow", "FindingsStore", "RunToAnalyze"]

_CAPTURED = ("straggler", "slowdown")
"""The findings a triggered trace capture is evidence of (fleetlens.services.captures)."""
_KEEP_CAPTURES = 3


class FindingInput(Protocol):
    """What :meth:`FindingsStore.upsert` reads of a finding: the analyses' ``Diagnosis`` has it
    (the store does not import the analyses; they meet on this shape)."""

    @property
    def key(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def diagnosis(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def confidence(self) -> float: ...
    @property
    def summary(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def time(self) -> float | None: ...
    @property
    def start_step(self) -> int: ...
    @property
    def end_step(self) -> int: ...
    @property
    def job_id(self) -> str: ...
    @property
    def rack(self) -> str: ...
    @property
    def ranks(self) -> Sequence[int]: ...
    @property
    def nodes(self) -> Sequence[str]: ...
    @property
    def gpus(self) -> Sequence[str]: ...
    @property
    def evidence(self) -> Sequence[Any]: ...


class RunToAnalyze:
    def __init__(
        self,
        tenant: str,
        run_id: str,
        last_seen: float,
        world: int,
        config: dict[str, Any],
        state: dict[str, Any],
        arrivals: int = 0,
        arrived: bool = True,
    ) -> None:
        self.tenant, self.run_id, self.last_seen = tenant, run_id, last_seen
        self.world, self.config, self.state = world, config, state
        # The run's registry writes when read, and whether any came since the last pass
        # (data arrived, whatever its times: an import's scalars, a rank's late rows).
        self.arrivals, self.arrived = arrivals, arrived


@dataclass(frozen=True)
class FindingRow:
    """A stored finding as the rest of the server reads it (the API, alerting, remediation).
    ``end_step`` is None while the finding is ongoing; ``time`` is when it was detected."""

    key: str
    diagnosis: str
    kind: str
    owner: str = ""
    confidence: float = 0.0
    summary: str = ""
    step: int = -1
    start_step: int = -1
    end_step: int | None = None
    time: float | None = None
    job_id: str | None = None
    ranks: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    rack: str | None = None
    evidence: list[dict[str, Any]] = field(default_factory=list)
    first_seen: float = 0.0
    updated_at: float = 0.0

    @classmethod
    def of(cls, f: Finding) -> FindingRow:
        return cls(
            key=f.key,
            diagnosis=f.diagnosis,
            kind=f.kind,
            owner=f.owner,
            confidence=f.confidence,
            summary=f.summary,
            step=f.step,
            start_step=f.start_step,
            end_step=f.end_step if f.end_step >= 0 else None,
            time=f.time,
            job_id=f.job_id or None,
            ranks=list(f.ranks or []),
            nodes=list(f.nodes or []),
            gpus=list(f.gpus or []),
            rack=f.rack or None,
            evidence=list(f.evidence or []),
            first_seen=f.first_seen,
            updated_at=f.updated_at,
        )


class FindingsStore:
    """Findings, cursors and baselines, on the metadata store's database."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata
        self._session = metadata.session  # one database, one session factory

    # ---- the loop's side ------------------------------------------------------------------
    def runs_with_new_data(self, limit: int = 50) -> list[RunToAnalyze]:
        """Runs with data that arrived since the loop's last pass over them (oldest first): their
        ``last_seen`` moved, or their registry was written (older data came), or the last pass
        asked for another."""
        with self._session() as s:
            rows = s.execute(
                all_tenants(select(Run, AnalysisCursor))
                .outerjoin(
                    AnalysisCursor,
                    same_tenant(AnalysisCursor, Run) & (AnalysisCursor.run_id == Run.run_id),
                )
                .where(
                    (AnalysisCursor.id.is_(None))
                    | (Run.last_seen > AnalysisCursor.seen_last)
                    | (Run.arrivals != AnalysisCursor.arrivals_seen)
                )
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
                    r.arrivals,
                    c is None or r.arrivals != c.arrivals_seen,
                )
                for r, c in rows
            ]

    def save_cursor(
        self,
        tenant: str,
        run_id: str,
        seen_last: float,
        state: Mapping[str, object],
        arrivals: int,
    ) -> None:
        """Store the loop's state (as JSON); ``seen_last`` -1 asks for another pass (work left
        over); ``arrivals`` is the run's count of registry writes the pass read (a write after
        it brings the run back)."""
        with self._session() as s:
            c = s.scalars(
                scoped(select(AnalysisCursor), tenant).where(AnalysisCursor.run_id == run_id)
            ).first()
            now = time.time()
            if c is None:
                s.add(
                    AnalysisCursor(
                        tenant=tenant,
                        run_id=run_id,
                        seen_last=seen_last,
                        arrivals_seen=arrivals,
                        state=dict(state),
                        updated_at=now,
                    )
                )
            else:
                c.seen_last, c.state, c.updated_at = seen_last, dict(state), now
                c.arrivals_seen = arrivals

    def upsert(
        self,
        tenant: str,
        run_id: str,
        found: Sequence[FindingInput],
        replace_kind: str | None = None,
    ) -> list[Finding]:
        """Insert or update findings by key; the earliest detection is kept (a straggler's is
        restated from the data each pass; ``first_seen`` keeps when it first appeared). With
        ``replace_kind``, findings of that kind not in ``found`` are removed (reclassified)."""
        now = time.time()
        out = []
        with self._session() as s:
            existing = {
                f.key: f
                for f in s.scalars(scoped(select(Finding), tenant).where(Finding.run_id == run_id))
            }
            keys = {d.key for d in found}
            if replace_kind:
                for k, f in existing.items():
                    if f.kind == replace_kind and k not in keys:
                        s.delete(f)
            for d in found:
                old = existing.get(d.key)
                if old is None:
                    f = Finding(
                        tenant=tenant,
                        run_id=run_id,
                        key=d.key,
                        first_seen=now,
                        step=d.step,
                        time=d.time,
                        start_step=d.start_step,
                        end_step=d.end_step,
                        confidence=0.0,
                    )
                    s.add(f)
                    existing[d.key] = f
                else:
                    f = old
                # A straggler finding is the verdict of the committed steps: a provisional one
                # (from steps not all ranks had reported) is corrected, not kept as earliest.
                restated = d.kind == "straggler"
                if old is not None and (d.diagnosis != f.diagnosis or d.step < f.step or restated):
                    f.step, f.time = d.step, d.time
                # A failure stays a failure: a warning about the same thing (e.g. ECC still
                # climbing after the Xid it announced) does not downgrade it.
                if not (old is not None and f.kind == "failure" and d.kind != "failure"):
                    f.kind, f.diagnosis, f.owner = d.kind, d.diagnosis, d.owner
                    f.summary = d.summary[:1024]
                f.confidence = max(d.confidence, f.confidence or 0.0)
                f.start_step = d.start_step if restated else min(d.start_step, f.start_step)
                if d.end_step < 0 or d.kind == "straggler":
                    f.end_step = d.end_step
                else:
                    f.end_step = max(d.end_step, f.end_step)
                f.job_id, f.rack = d.job_id, d.rack
                kept = old is not None and d.kind == "hang" and not d.ranks and list(f.ranks or [])
                if kept:
                    # Who the others waited for is seen while the hang lasts (heartbeats); a
                    # pass after it ended restates its length and keeps whom it named.
                    f.summary = f"{d.summary}; ranks {kept[:16]} stopped behind the others"[:1024]
                    f.evidence = [
                        *d.evidence[:49],
                        {"metric": "ranks named while hung", "value": kept[:64]},
                    ]
                    f.updated_at = now
                    if f not in out:
                        out.append(f)
                    continue
                f.ranks, f.nodes = list(d.ranks[:4096]), list(d.nodes[:1024])
                f.gpus = list(d.gpus[:1024])
                f.evidence = list(d.evidence[:50])
                f.updated_at = now
                if f not in out:
                    out.append(f)
        return out

    def baseline(self, tenant: str, signature: str, metric: str) -> dict[str, Any]:
        with self._session() as s:
            b = s.scalars(
                scoped(select(WorkloadBaseline), tenant).where(
                    WorkloadBaseline.signature == signature, WorkloadBaseline.metric == metric
                )
            ).first()
            return dict(b.values or {}) if b is not None else {}

    def save_baseline(
        self, tenant: str, signature: str, metric: str, values: dict[str, Any]
    ) -> None:
        with self._session() as s:
            b = s.scalars(
                scoped(select(WorkloadBaseline), tenant).where(
                    WorkloadBaseline.signature == signature, WorkloadBaseline.metric == metric
                )
            ).first()
            if b is None:
                s.add(
                    WorkloadBaseline(
                        tenant=tenant,
                        signature=signature,
                        metric=metric,
                        values=values,
                        updated_at=time.time(),
                    )
                )
            else:
                b.values, b.updated_at = values, time.time()

    # ---- the API's side -------------------------------------------------------------------
    def rows(
        self, scope: Scope, run_id: str, kinds: tuple[str, ...] | None = None
    ) -> list[FindingRow]:
        """A run's findings (the caller has checked the run against its scope)."""
        with self._session() as s:
            q = scoped(select(Finding), scope).where(Finding.run_id == run_id)
            if kinds:
                q = q.where(Finding.kind.in_(kinds))
            rows = s.scalars(q.order_by(Finding.step, Finding.key)).all()
            out = [FindingRow.of(f) for f in rows]
            if any(r.kind in _CAPTURED for r in out):
                caps = run_captures(s, scope, run_id)
                for r in (r for r in out if r.kind in _CAPTURED):
                    span = (r.key, r.ranks, r.start_step, r.end_step)
                    got = [capture_evidence(c) for c in caps if matches(c, *span)]
                    r.evidence.extend(got[-_KEEP_CAPTURES:])
            return out

    def diagnoses(self, scope: Scope, run_ids: list[str]) -> dict[str, dict[str, int]]:
        """Run -> diagnosis -> how many findings (the caller has checked the runs)."""
        out: dict[str, dict[str, int]] = {}
        if not run_ids:
            return out
        with self._session() as s:
            q = (
                scoped(select(Finding.run_id, Finding.diagnosis, func.count()), scope, Finding)
                .where(Finding.run_id.in_(run_ids))
                .group_by(Finding.run_id, Finding.diagnosis)
            )
            for run, diagnosis, n in s.execute(q).all():
                out.setdefault(run, {})[diagnosis] = int(n)
        return out

    def clear(self, tenant: str, run_id: str) -> None:
        with self._session() as s:
            s.execute(scoped(delete(Finding), tenant).where(Finding.run_id == run_id))
