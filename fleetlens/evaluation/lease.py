"""The shard queue's lease protocol: lease, heartbeat, complete, fail.

Leasing is exactly-once on both engines. A lease is a conditional UPDATE that names the state
and lease token it saw (``WHERE id = ? AND state = ? AND lease_token = ?``) and counts the rows
it changed: of two workers racing for a shard, one changes a row and the other none. On
PostgreSQL the candidates are also read ``FOR UPDATE SKIP LOCKED`` so that racing workers take
different shards instead of colliding. Every later report (heartbeat, partial results,
completion, failure) carries the lease token, and a report whose token is no longer the shard's
changes nothing: a worker presumed dead cannot double-count a shard that was leased again.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, or_, select, update
from sqlalchemy.orm import Session

from ..errors import ConfigError, LeaseLost, NotFound
from ..store.eval_queries import TEXTS
from ..store.scope import Scope
from ..store.scoped import scoped
from .doc_types import BenchmarkSpec
from .example_types import Example
from .models import EvalShard, Evaluation
from .results import Results
from .rows import ExampleCache, SessionFactory, benchmark_spec


def _without_texts(
    scores: dict[str, dict[str, float | str]],
) -> dict[str, dict[str, float | str]]:
    """The scores as a shard row keeps them: an example's prompt, output and reference go to
    the telemetry store's per-example rows only (up to 12 kB an example)."""
    return {k: {m: v for m, v in per.items() if m not in TEXTS} for k, per in scores.items()}


@dataclass(frozen=True, slots=True)
class ShardLease:
    """A leased shard: what to run, with what, and the token every report must carry. The
    benchmark spec (without its examples), the examples, the adapter and the decoding are the
    JSON the evaluation was submitted with."""

    shard_id: int
    evaluation_id: str
    index: int
    benchmark: BenchmarkSpec  # without its examples
    start: int
    stop: int
    examples: list[Example]
    completed_ids: list[str]  # examples scored by an earlier attempt
    adapter: dict[str, Any]
    decoding: dict[str, Any]
    locality: str
    lease_token: str
    lease_expires: float
    attempt: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The lease, extended."""

    shard_id: int
    lease_expires: float


@dataclass(frozen=True, slots=True)
class ShardReport:
    """A shard's state after a report (queued: it will be retried), and its evaluation's."""

    shard_id: int
    state: str
    evaluation_state: str


class Leases:
    """Hands shards to workers and takes their reports, each under the lease it holds."""

    def __init__(
        self, session: SessionFactory, dialect: str, examples: ExampleCache, results: Results
    ) -> None:
        self._session = session
        self._dialect = dialect
        self._examples = examples
        self._results = results

    def lease(
        self, scope: Scope, worker_id: str, prefer_locality: str = "", lease_s: float = 30.0
    ) -> ShardLease | None:
        """Hand the next shard to ``worker_id``, or None when nothing is runnable."""
        for _ in range(8):
            now = time.time()
            expired: list[tuple[str, str]] = []
            with self._session() as s:
                q = scoped(select(EvalShard), scope, within="project").where(
                    or_(
                        EvalShard.state == "queued",
                        (EvalShard.state == "leased") & (EvalShard.lease_expires < now),
                    ),
                )
                local = case((EvalShard.locality == prefer_locality, 0), else_=1)
                q = q.order_by(
                    EvalShard.priority,
                    EvalShard.deadline,
                    local,
                    EvalShard.created_at,
                    EvalShard.id,
                ).limit(4)
                if self._dialect == "postgresql":
                    q = q.with_for_update(skip_locked=True)
                candidates = s.scalars(q).all()
                if not candidates:
                    return None
                for c in candidates:
                    seen = (
                        EvalShard.id == c.id,
                        EvalShard.state == c.state,
                        EvalShard.lease_token == c.lease_token,
                    )
                    if c.state == "leased" and c.attempts >= c.max_attempts:
                        # Its last allowed attempt died without a word: the shard failed.
                        res = s.execute(
                            scoped(update(EvalShard), c.tenant)
                            .where(*seen)
                            .values(
                                state="failed",
                                lease_token="",
                                updated_at=now,
                                error=f"lease expired on attempt {c.attempts} of {c.max_attempts} "
                                f"(worker {c.worker_id} stopped reporting)",
                            )
                        )
                        if res.rowcount == 1:  # type: ignore[attr-defined]
                            expired.append((c.tenant, c.evaluation_id))
                        continue
                    token, attempt = uuid.uuid4().hex, c.attempts + 1
                    res = s.execute(
                        scoped(update(EvalShard), c.tenant)
                        .where(*seen)
                        .values(
                            state="leased",
                            lease_token=token,
                            worker_id=worker_id,
                            lease_expires=now + lease_s,
                            attempts=EvalShard.attempts + 1,
                            updated_at=now,
                        )
                    )
                    if res.rowcount != 1:  # type: ignore[attr-defined]
                        continue  # another worker took it between our read and our write
                    s.execute(
                        scoped(update(Evaluation), c.tenant)
                        .where(
                            Evaluation.evaluation_id == c.evaluation_id,
                            Evaluation.state == "QUEUED",
                        )
                        .values(state="RUNNING")
                    )
                    ev = s.scalars(
                        scoped(select(Evaluation), c.tenant).where(
                            Evaluation.evaluation_id == c.evaluation_id
                        )
                    ).one()
                    payload = self._payload(ev, c, token, now + lease_s, attempt)
                    break
                else:
                    payload = None
            for tenant, eid in expired:
                self._results.finalize(tenant, eid)
            if payload is not None:
                return payload
        return None

    def _payload(
        self, ev: Evaluation, sh: EvalShard, token: str, expires: float, attempt: int
    ) -> ShardLease:
        spec = benchmark_spec(ev, sh.benchmark)
        examples = self._examples.load(spec)[sh.start : sh.stop]
        decoding = ev.provenance.get("decoding", {})
        return ShardLease(
            shard_id=sh.id,
            evaluation_id=ev.evaluation_id,
            index=sh.shard_index,
            benchmark=spec.without_examples(),
            start=sh.start,
            stop=sh.stop,
            examples=examples,
            completed_ids=sorted((sh.scores or {}).keys()),
            adapter=dict(ev.adapter),
            decoding=dict(decoding) if isinstance(decoding, dict) else {},
            locality=sh.locality,
            lease_token=token,
            lease_expires=expires,
            attempt=attempt,
        )

    def _owned(self, s: Session, scope: Scope, shard_id: int) -> EvalShard:
        q = scoped(select(EvalShard), scope, within="project").where(EvalShard.id == shard_id)
        sh = s.scalars(q).first()
        if sh is None:
            raise NotFound(f"shard {shard_id} does not exist")
        return sh

    def heartbeat(
        self,
        scope: Scope,
        shard_id: int,
        token: str,
        lease_s: float = 30.0,
        partial: dict[str, dict[str, float | str]] | None = None,
    ) -> Heartbeat:
        """Extend the lease; record partial per-example results (keyed by example id)."""
        now = time.time()
        with self._session() as s:
            sh = self._owned(s, scope, shard_id)
            values: dict[str, Any] = {"lease_expires": now + lease_s, "updated_at": now}
            if partial:
                merged = {**(sh.scores or {}), **_without_texts(partial)}
                values.update(scores=merged, done=len(merged))
            res = s.execute(
                scoped(update(EvalShard), scope)
                .where(
                    EvalShard.id == shard_id,
                    EvalShard.lease_token == token,
                    EvalShard.state == "leased",
                )
                .values(**values)
            )
            if res.rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(f"shard {shard_id}: this lease is no longer held; drop the shard")
        return Heartbeat(shard_id=shard_id, lease_expires=now + lease_s)

    def complete(
        self, scope: Scope, shard_id: int, token: str, scores: dict[str, dict[str, float | str]]
    ) -> ShardReport:
        now = time.time()
        with self._session() as s:
            sh = self._owned(s, scope, shard_id)
            if sh.lease_token != token or sh.state != "leased":
                raise LeaseLost(f"shard {shard_id}: this lease is no longer held; result dropped")
            spec_ids = {str(e["id"]) for e in self._shard_examples(s, sh)}
            merged: dict[str, dict[str, float | str]] = {**(sh.scores or {}), **scores}  # type: ignore[dict-item]
            if set(merged) != spec_ids:
                missing = sorted(spec_ids - set(merged))[:5]
                extra = sorted(set(merged) - spec_ids)[:5]
                raise ConfigError(
                    f"shard {shard_id} results do not cover its examples: "
                    f"missing {missing}, unexpected {extra}"
                )
            res = s.execute(
                scoped(update(EvalShard), scope)
                .where(
                    EvalShard.id == shard_id,
                    EvalShard.lease_token == token,
                    EvalShard.state == "leased",
                )
                .values(
                    state="done",
                    scores=_without_texts(merged),
                    done=len(merged),
                    updated_at=now,
                    error="",
                )
            )
            if res.rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(f"shard {shard_id}: this lease is no longer held; result dropped")
            tenant, eid, bench, index = sh.tenant, sh.evaluation_id, sh.benchmark, sh.shard_index
        self._results.write_examples(tenant, eid, bench, index, merged)
        state = self._results.finalize(tenant, eid)
        return ShardReport(shard_id=shard_id, state="done", evaluation_state=state)

    def fail(self, scope: Scope, shard_id: int, token: str, error: str) -> ShardReport:
        """A failed attempt: the shard alone goes back to the queue, or fails at its limit."""
        now = time.time()
        with self._session() as s:
            sh = self._owned(s, scope, shard_id)
            final = sh.attempts >= sh.max_attempts
            res = s.execute(
                scoped(update(EvalShard), scope)
                .where(
                    EvalShard.id == shard_id,
                    EvalShard.lease_token == token,
                    EvalShard.state == "leased",
                )
                .values(
                    state="failed" if final else "queued",
                    lease_token="",
                    error=error[:4000],
                    updated_at=now,
                )
            )
            if res.rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(f"shard {shard_id}: this lease is no longer held")
            tenant, eid = sh.tenant, sh.evaluation_id
        state = self._results.finalize(tenant, eid) if final else "RUNNING"
        return ShardReport(
            shard_id=shard_id, state="failed" if final else "queued", evaluation_state=state
        )

    def _shard_examples(self, s: Session, sh: EvalShard) -> list[Example]:
        ev = s.scalars(
            scoped(select(Evaluation), sh.tenant).where(
                Evaluation.evaluation_id == sh.evaluation_id
            )
        ).one()
        return self._examples.load(benchmark_spec(ev, sh.benchmark))[sh.start : sh.stop]
