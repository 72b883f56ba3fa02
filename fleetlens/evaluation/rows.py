"""What the evaluation modules share: the session factory, row look-ups, the JSON view of an
evaluation, and the cache of loaded benchmark examples."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import NotFound
from ..store.scope import Scope
from ..store.scoped import scoped
from . import benchmarks as bm
from .cache import canonical_hash
from .models import EvalShard, Evaluation
from .scheduler import PRIORITY_NAMES

SessionFactory = Callable[[], AbstractContextManager[Session]]

TERMINAL = ("COMPLETED", "FAILED")


class ExampleCache:
    """Benchmark examples by spec, the 32 most recently used kept in memory."""

    def __init__(self) -> None:
        self._examples: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def load(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        key = canonical_hash(spec)
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


def benchmark_spec(ev: Evaluation, benchmark: str) -> dict[str, Any]:
    benchmarks: list[dict[str, Any]] = list(ev.suite.get("benchmarks") or [])  # type: ignore[call-overload]
    return dict(next(b for b in benchmarks if b["name"] == benchmark))


def evaluation_json(r: Evaluation, shards: list[EvalShard] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "evaluationId": r.evaluation_id,
        "state": r.state,
        "modelId": r.model_id,
        "modelVersion": r.model_version,
        "runId": r.run_id,
        "checkpointId": r.checkpoint_id,
        "priority": PRIORITY_NAMES.get(r.priority, str(r.priority)),
        "deadline": r.deadline,
        "cacheHit": bool(r.cached_from),
        "cachedFrom": r.cached_from or None,
        "cacheKey": r.cache_key,
        "provenance": r.provenance,
        "metrics": r.metrics,
        "error": r.error,
        "createdAt": r.created_at,
        "completedAt": r.completed_at,
        "createdBy": r.created_by,
        "suite": {"name": r.suite.get("name"), "version": r.suite.get("version")},
        "triggerId": r.trigger_id or None,
        "regressions": r.regressions,
    }
    if shards is not None:
        out["shards"] = [
            {
                "shardId": sh.id,
                "index": sh.shard_index,
                "benchmark": sh.benchmark,
                "start": sh.start,
                "stop": sh.stop,
                "state": sh.state,
                "attempts": sh.attempts,
                "maxAttempts": sh.max_attempts,
                "done": sh.done,
                "total": sh.stop - sh.start,
                "worker": sh.worker_id,
                "error": sh.error,
            }
            for sh in shards
        ]
        total = sum(sh.stop - sh.start for sh in shards)
        out["progress"] = {
            "examplesDone": sum(sh.done for sh in shards),
            "examples": total,
            "shardsDone": sum(sh.state == "done" for sh in shards),
            "shardsFailed": sum(sh.state == "failed" for sh in shards),
            "shards": len(shards),
        }
    return out
