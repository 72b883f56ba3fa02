"""Triggered profiler captures in the metadata store: asked, answered rank by rank, expired.

A capture names the ranks that profile a few steps (the lagging rank first, then its healthy
peer, or the ranks a person named), the finding that asked for it, and each rank's breakdown of
the captured steps once its trace has been imported (``results``, by rank). Reads take the
caller's scope; the monitor's refresh of the open captures reads every tenant's, on purpose.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from ..errors import NotFound
from ..traces.summary import RankSummary, decode_summary, snake_fields
from .metadata import MetadataStore
from .models import TraceCaptureRow
from .scope import Scope
from .scoped import all_tenants, scoped

__all__ = ["CAPTURE_STATES", "Capture", "CaptureEvidence", "CaptureStore", "CapturedRank"]

CAPTURE_STATES = ("requested", "partial", "done", "expired")
"""``requested``: no trace in yet; ``partial``: some ranks' traces in; ``done``: every rank's;
``expired``: not every rank's arrived in time (the ones that did are kept)."""
OPEN_STATES = ("requested", "partial")


@dataclass(frozen=True)
class Capture:
    """One capture as the rest of the server reads it."""

    id: int
    tenant: str
    run_id: str
    job_id: str
    ranks: tuple[int, ...]
    from_step: int
    steps: int
    warmup: int
    reason: str
    finding_key: str
    state: str
    message: str
    requested_at: float
    updated_at: float
    results: dict[int, RankSummary] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES

    @classmethod
    def of(cls, r: TraceCaptureRow) -> Capture:
        return cls(
            id=r.id,
            tenant=r.tenant,
            run_id=r.run_id,
            job_id=r.job_id,
            ranks=tuple(int(x) for x in r.ranks),
            from_step=r.from_step,
            steps=r.steps,
            warmup=r.warmup,
            reason=r.reason,
            finding_key=r.finding_key,
            state=r.state,
            message=r.message,
            requested_at=r.requested_at,
            updated_at=r.updated_at,
            results={int(k): decode_summary(v) for k, v in dict(r.results or {}).items()},
        )


class CaptureStore:
    _record = threading.Lock()  # one process's writers of results, whatever the store object

    def __init__(self, metadata: MetadataStore) -> None:
        self._session = metadata.session

    def create(
        self,
        tenant: str,
        run_id: str,
        job_id: str,
        from_step: int,
        ranks: Sequence[int],
        steps: int,
        warmup: int,
        reason: str,
        finding_key: str,
        now: float,
    ) -> Capture:
        with self._session() as s:
            row = TraceCaptureRow(
                tenant=tenant,
                run_id=run_id,
                job_id=job_id,
                ranks=[int(r) for r in ranks],
                from_step=from_step,
                steps=steps,
                warmup=warmup,
                reason=reason[:1024],
                finding_key=finding_key[:256],
                state="requested",
                message="",
                requested_at=now,
                updated_at=now,
                results={},
            )
            s.add(row)
            s.flush()
            return Capture.of(row)

    def open_captures(self) -> list[Capture]:
        """Every tenant's captures still waiting for traces (the monitor's pass)."""
        with self._session() as s:
            q = all_tenants(select(TraceCaptureRow)).where(TraceCaptureRow.state.in_(OPEN_STATES))
            return [Capture.of(r) for r in s.scalars(q.order_by(TraceCaptureRow.id))]

    def latest(self, tenant: str, run_id: str) -> Capture | None:
        """The run's newest capture, whatever its state (the gap between captures)."""
        with self._session() as s:
            q = scoped(select(TraceCaptureRow), tenant).where(TraceCaptureRow.run_id == run_id)
            row = s.scalars(q.order_by(TraceCaptureRow.id.desc()).limit(1)).first()
            return Capture.of(row) if row is not None else None

    def of_run(self, who: Scope | str, run_id: str, limit: int = 100) -> list[Capture]:
        """A run's captures, newest first (the caller has checked the run against its scope)."""
        with self._session() as s:
            q = scoped(select(TraceCaptureRow), who).where(TraceCaptureRow.run_id == run_id)
            rows = s.scalars(q.order_by(TraceCaptureRow.id.desc()).limit(limit))
            return [Capture.of(r) for r in rows]

    def get(self, who: Scope | str, run_id: str, capture_id: int) -> Capture:
        with self._session() as s:
            row = self._row(s, who, run_id, capture_id)
            return Capture.of(row)

    def record(
        self, who: Scope | str, run_id: str, capture_id: int, rank: int, result: RankSummary
    ) -> Capture:
        """Rank ``rank``'s breakdown is in: ``done`` once every named rank's is. A trace that
        arrives after the capture expired still counts (the job was only late)."""
        # Both ranks' traces come in at about the same time: the row is locked while one is
        # added (FOR UPDATE on PostgreSQL; one writer at a time in this process for SQLite).
        with self._record, self._session() as s:
            row = self._row(s, who, run_id, capture_id, lock=True)
            results = {str(k): v for k, v in dict(row.results or {}).items()}
            results[str(rank)] = result.stored()
            row.results = results
            got = {int(k) for k in results}
            row.state = "done" if got >= {int(r) for r in row.ranks} else "partial"
            row.updated_at = time.time()
            s.flush()
            return Capture.of(row)

    def expire(self, tenant: str, capture_id: int, message: str) -> None:
        with self._session() as s:
            q = scoped(select(TraceCaptureRow), tenant).where(TraceCaptureRow.id == capture_id)
            row = s.scalars(q).first()
            if row is not None and row.state in OPEN_STATES:
                row.state, row.message = "expired", message[:1024]
                row.updated_at = time.time()

    @staticmethod
    def _row(
        s: Any, who: Scope | str, run_id: str, capture_id: int, lock: bool = False
    ) -> TraceCaptureRow:
        q = scoped(select(TraceCaptureRow), who).where(
            TraceCaptureRow.run_id == run_id, TraceCaptureRow.id == capture_id
        )
        if lock:
            q = q.with_for_update()
        row = s.scalars(q).first()
        if row is None:
            raise NotFound(f"run {run_id} has no trace capture {capture_id}")
        return row  # type: ignore[no-any-return]


def captured_steps(c: Capture) -> tuple[int, int] | None:
    """The steps the capture's traces hold (the first rank's in), None before any is in."""
    for rank in c.ranks:
        r = c.results.get(rank)
        if r is not None and r.from_step is not None and r.to_step is not None:
            return r.from_step, r.to_step
    return None


@dataclass(frozen=True)
class CapturedRank:
    """A rank of a capture's evidence: ``lagging`` (the finding's rank), its healthy ``peer``,
    or ``named`` by a person; its summary once its trace is in (None: ``missing``)."""

    rank: int
    role: str
    summary: RankSummary | None


@dataclass(frozen=True)
class CaptureEvidence:
    """A capture as a finding's evidence item (signal ``trace_capture``): the steps its traces
    hold (None before any is in) and each rank's summary, the lagging rank first."""

    capture_id: int
    state: str
    from_step: int | None
    to_step: int | None
    ranks: tuple[CapturedRank, ...]
    signal: str = "trace_capture"

    @classmethod
    def of(cls, c: Capture) -> CaptureEvidence:
        span = captured_steps(c)
        ranks = []
        for i, rank in enumerate(c.ranks):
            role = "lagging" if i == 0 and c.finding_key else ("peer" if c.finding_key else "named")
            ranks.append(CapturedRank(rank, role, c.results.get(rank)))
        return cls(
            capture_id=c.id,
            state=c.state,
            from_step=span[0] if span else None,
            to_step=span[1] if span else None,
            ranks=tuple(ranks),
        )


def _rank_item(r: CapturedRank) -> dict[str, Any]:
    if r.summary is None:
        return {"rank": r.rank, "role": r.role, "missing": True}
    got = snake_fields(r.summary) if r.summary.steps else {"steps": 0}
    return {"rank": r.rank, "role": r.role, **got}


def capture_evidence(c: Capture) -> dict[str, Any]:
    """A finding's evidence item (:class:`CaptureEvidence`), snake_case keys: the API names them."""
    ev = CaptureEvidence.of(c)
    return {
        "signal": ev.signal,
        "capture_id": ev.capture_id,
        "state": ev.state,
        "from_step": ev.from_step,
        "to_step": ev.to_step,
        "ranks": [_rank_item(r) for r in ev.ranks],
    }


def matches(c: Capture, key: str, ranks: Sequence[int], start: int, end: int | None) -> bool:
    """Whether capture ``c`` is evidence of a finding (key, ranks, step span): the one it was
    asked for, or one whose ranks hold its first rank while its steps were captured."""
    span = captured_steps(c)
    if span is None or not c.ranks:
        return False
    if c.finding_key and c.finding_key == key:
        return True
    return c.ranks[0] in ranks and start <= span[0] and (end is None or end < 0 or span[0] <= end)


def run_captures(s: Any, who: Scope | str, run_id: str) -> list[Capture]:
    """A run's captures that hold at least one rank's trace, in a caller's session."""
    q = scoped(select(TraceCaptureRow), who).where(
        TraceCaptureRow.run_id == run_id, TraceCaptureRow.state != "requested"
    )
    return [Capture.of(r) for r in s.scalars(q.order_by(TraceCaptureRow.id))]
