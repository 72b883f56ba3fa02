"""What the evaluation modules share: the session factory, row look-ups, the JSON view of an
evaluation, and the cache of loaded benchmark examples."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import NotFound
from ..store.scope import Scope
from ..store.scoped import scoped
from . import benchmarks as bm
from .cache import canonical_hash
from .doc_types import BenchmarkSpec
from .example_types import Example
from .models import EvalShard, Evaluation
from .scheduler import PRIORITY_NAMES

SessionFactory = Callable[[], AbstractContextManager[Session]]

TERMINAL = ("COMPLETED", "FAILED")


class ExampleCache:
    """Benchmark examples by spec, the 32 most recently used kept in memory."""

    def __init__(self) -> None:
        self._examples: OrderedDict[str, list[Example]] = OrderedDict()

    def load(self, spec: BenchmarkSpec) -> list[Example]:
        key = canonical_hash(spec.as_json())
        rows = self._examples.get(key)
        if rows is None:
            rows = bm.load_examples(spec)
            self._examples[key] = rows
            while len(self._examples) > 32:
                self._examples.popitem(last=False)
        self._examples.move_to_end(key)
        return rows


def find_evaluation(s: Session, scope: Scope, evaluation_id: str) -> Evaluation:
    q = scoped(select(Evaluation), scope, within="project")
    row = s.scalars(q.where(Evaluation.evaluation_id == evaluation_id)).first()
    if row is None:
        raise NotFound(f"evaluation {evaluation_id!r} does not exist")
    return row


def shards_of(s: Session, tenant: str, evaluation_id: str) -> list[EvalShard]:
    return list(
        s.scalars(
            scoped(select(EvalShard), tenant)
            .where(EvalShard.evaluation_id == evaluation_id)
            .order_by(EvalShard.shard_index)
        ).all()
    )


def benchmark_spec(ev: Evaluation, benchmark: str) -> BenchmarkSpec:
    """The evaluation's benchmark of that name, as it was submitted (and stored)."""
    benchmarks: list[dict[str, Any]] = list(ev.suite.get("benchmarks") or [])  # type: ignore[call-overload]
    return BenchmarkSpec.of(next(b for b in benchmarks if b["name"] == benchmark))


@dataclass(frozen=True, slots=True)
class ShardView:
    """One shard of an evaluation: a partition of one benchmark's examples."""

    shard_id: int
    index: int
    benchmark: str
    start: int
    stop: int
    state: str
    attempts: int
    max_attempts: int
    done: int  # examples scored so far
    total: int
    worker: str  # the worker that holds (or last held) it; empty if none
    error: str


@dataclass(frozen=True, slots=True)
class Progress:
    """Examples and shards settled so far."""

    examples_done: int
    examples: int
    shards_done: int
    shards_failed: int
    shards: int


@dataclass(frozen=True, slots=True)
class EvaluationView:
    """An evaluation as read back: what was judged, with what, and what came out. The
    provenance, metrics and regressions are the JSON stored with it (``Evaluation``'s
    columns), as stored; ``shards`` and ``progress`` are None when not asked for."""

    evaluation_id: str
    state: str
    model_id: str
    model_version: str
    run_id: str
    checkpoint_id: str
    priority: str
    deadline: float | None
    cache_hit: bool
    cached_from: str | None
    cache_key: str
    provenance: dict[str, Any]
    metrics: dict[str, Any]  # benchmark -> metric -> {mean, stderr, n}
    error: str
    created_at: float
    completed_at: float | None
    created_by: str
    suite_name: str | None  # None: the suite had none
    suite_version: str | None
    trigger_id: str | None
    regressions: list[dict[str, Any]] | None
    shards: list[ShardView] | None = None
    progress: Progress | None = None


def _text(v: object) -> str | None:
    return None if v is None else str(v)


def evaluation_view(r: Evaluation, shards: list[EvalShard] | None) -> EvaluationView:
    views: list[ShardView] | None = None
    progress: Progress | None = None
    if shards is not None:
        views = [
            ShardView(
                shard_id=sh.id,
                index=sh.shard_index,
                benchmark=sh.benchmark,
                start=sh.start,
                stop=sh.stop,
                state=sh.state,
                attempts=sh.attempts,
                max_attempts=sh.max_attempts,
                done=sh.done,
                total=sh.stop - sh.start,
                worker=sh.worker_id,
                error=sh.error,
            )
            for sh in shards
        ]
        progress = Progress(
            examples_done=sum(sh.done for sh in shards),
            examples=sum(sh.stop - sh.start for sh in shards),
            shards_done=sum(sh.state == "done" for sh in shards),
            shards_failed=sum(sh.state == "failed" for sh in shards),
            shards=len(shards),
        )
    return EvaluationView(
        evaluation_id=r.evaluation_id,
        state=r.state,
        model_id=r.model_id,
        model_version=r.model_version,
        run_id=r.run_id,
        checkpoint_id=r.checkpoint_id,
        priority=PRIORITY_NAMES.get(r.priority, str(r.priority)),
        deadline=r.deadline,
        cache_hit=bool(r.cached_from),
        cached_from=r.cached_from or None,
        cache_key=r.cache_key,
        provenance=r.provenance,
        metrics=r.metrics,
        error=r.error,
        created_at=r.created_at,
        completed_at=r.completed_at,
        created_by=r.created_by,
        suite_name=_text(r.suite.get("name")),
        suite_version=_text(r.suite.get("version")),
        trigger_id=r.trigger_id or None,
        regressions=r.regressions,
        shards=views,
        progress=progress,
    )
