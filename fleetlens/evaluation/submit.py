"""Submitting an evaluation: validate the request, record its provenance, reuse a cached result
or queue its shards."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import ConfigError, NotFound
from ..store.graph_models import Checkpoint, ModelVersion
from ..store.scope import Scope
from ..store.scoped import scoped
from . import benchmarks as bm
from .adapters import Decoding, validate_spec
from .cache import EVALUATOR_VERSION, cache_key, canonical_hash
from .doc_types import AdapterSpec, BenchmarkProvenance, Provenance, SuiteSpec
from .judge import judge_config, judge_provenance
from .models import EvalShard, Evaluation
from .requests import EvaluationRequest
from .results import judge_regressions, stored_regressions
from .rows import EvaluationView, ExampleCache, SessionFactory, evaluation_view, shards_of
from .scheduler import NO_DEADLINE, parse_priority, plan_shards
from .suites import PERFORMANCE, SuiteRegistry, validate_prices


def _complete_identity(s: Session, scope: Scope, req: EvaluationRequest) -> EvaluationRequest:
    """Seed 001 s43 names ``modelVersion`` (or ``checkpointId``) alone: the tenant's one model
    version (checkpoint) of that name is meant; several are ambiguous, and refused."""
    if req.model_version and not req.model_id:
        q = scoped(select(ModelVersion), scope, within="project")
        rows = s.scalars(q.where(ModelVersion.version == req.model_version).limit(2)).all()
        if not rows:
            raise NotFound(f"modelVersion {req.model_version!r} does not exist")
        if len(rows) > 1:
            raise ConfigError(
                f"modelVersion {req.model_version!r} is a version of several models; "
                "name modelId too"
            )
        return replace(req, model_id=rows[0].model_id)
    if req.checkpoint_id and not req.run_id and not req.model_id:
        cq = scoped(select(Checkpoint), scope).where(Checkpoint.checkpoint_id == req.checkpoint_id)
        cks = s.scalars(cq.limit(2)).all()
        if not cks:
            raise NotFound(f"checkpointId {req.checkpoint_id!r} does not exist")
        if len(cks) > 1:
            raise ConfigError(f"checkpointId {req.checkpoint_id!r} is ambiguous; name runId too")
        return replace(req, run_id=cks[0].run_id)
    return req


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """The model being judged (empty strings where not named) and its content hash."""

    model_id: str
    model_version: str
    run_id: str
    checkpoint_id: str
    hash: str


def model_identity(
    s: Session, scope: Scope, req: EvaluationRequest, adapter: dict[str, Any]
) -> ModelIdentity:
    """The model being judged and its content hash (the checkpoint's checksum)."""
    model_id = model_version = run_id = checkpoint_id = digest = ""
    req = _complete_identity(s, scope, req)
    if req.model_id and req.model_version:
        q = scoped(select(ModelVersion), scope, within="project").where(
            ModelVersion.model_id == req.model_id, ModelVersion.version == req.model_version
        )
        mv = s.scalars(q).first()
        if mv is None:
            raise NotFound(f"model version {req.model_id}:{req.model_version} does not exist")
        model_id, model_version, run_id = mv.model_id, mv.version, mv.run_id
        checkpoint_id = mv.checkpoint_id
        if req.checkpoint_id and req.checkpoint_id != mv.checkpoint_id:
            raise ConfigError(
                f"checkpointId {req.checkpoint_id!r}: model version {mv.model_id}:{mv.version} "
                f"was registered from checkpoint {mv.checkpoint_id!r}"
            )
    elif req.run_id and req.checkpoint_id:
        run_id, checkpoint_id = req.run_id, req.checkpoint_id
    if checkpoint_id:
        ck = s.scalars(
            scoped(select(Checkpoint), scope).where(
                Checkpoint.run_id == run_id,
                Checkpoint.checkpoint_id == checkpoint_id,
            )
        ).first()
        if ck is None:
            raise NotFound(f"checkpoint {checkpoint_id} of run {run_id!r} does not exist")
        digest = ck.checksum
    # A caller-declared hash (a served model's weights digest) wins; without any, the
    # adapter spec itself identifies the model.
    return ModelIdentity(
        model_id=model_id,
        model_version=model_version,
        run_id=run_id,
        checkpoint_id=checkpoint_id,
        hash=req.model_hash or digest or "spec:" + canonical_hash(adapter),
    )


class Submissions:
    """Takes evaluation requests; one per store."""

    def __init__(
        self, session: SessionFactory, examples: ExampleCache, suites: SuiteRegistry
    ) -> None:
        self._session = session
        self._examples = examples
        self._suites = suites

    def _suite(self, scope: Scope, req: EvaluationRequest) -> SuiteSpec:
        """The inline ``suite`` (a JSON spec), or the registered one ``benchmarkSuite`` names."""
        ref = req.benchmark_suite
        if ref and req.suite:
            raise ConfigError("send suite (inline) or benchmarkSuite (a registered name), not both")
        if ref:
            found = self._suites.resolve(scope, ref)
            return SuiteSpec.model_validate(
                {**found.spec, "name": found.name, "version": found.version}
            )
        if not req.suite:
            raise ConfigError(
                "suite is missing: send suite {name, version, benchmarks} or benchmarkSuite NAME"
            )
        return SuiteSpec.model_validate(req.suite)

    def submit(self, scope: Scope, req: EvaluationRequest) -> EvaluationView:
        """Queue an evaluation (or reuse a cached result); returns at once."""
        suite = self._suite(scope, req)
        adapter = dict(req.adapter or suite.adapter or {})
        if not adapter:
            raise ConfigError(
                "adapter is missing: send adapter {kind: callable|openai|hf, ...}, or register "
                "the suite with a default adapter"
            )
        validate_spec(adapter)
        specs = [bm.normalize_spec(b) for b in suite.benchmarks or []]
        if not specs:
            raise ConfigError("suite.benchmarks is empty; name at least one benchmark")
        names = [b.name for b in specs]
        if "" in names or len(set(names)) != len(names) or PERFORMANCE in names:
            raise ConfigError(
                f"benchmark names {names} must be non-empty and unique in a suite "
                f"({PERFORMANCE!r} is reserved for latency and cost)"
            )
        if suite.prices is not None:
            validate_prices(suite.prices)
        decoding = Decoding.from_json(req.decoding or suite.decoding).as_json()
        priority = parse_priority(req.priority)
        shard_size = int(req.shard_size or 50)
        max_attempts = int(req.max_attempts or 3)
        if max_attempts < 1:
            raise ConfigError(f"maxAttempts {max_attempts} must be >= 1")
        sizes: list[tuple[str, int]] = []
        bench_prov = []
        for spec in specs:
            for metric in spec.scored_metrics:
                if metric not in bm.METRICS:
                    raise ConfigError(f"metric {metric!r} is unknown; use one of {bm.METRICS}")
            if "pass@k" in spec.metrics:
                most = max(spec.k or (1,))
                if most > decoding["n"]:
                    raise ConfigError(f"pass@{most} needs decoding.n >= {most}")
            rows = self._examples.load(spec)
            sizes.append((spec.name, len(rows)))
            judged = (
                {"judge": judge_provenance(judge_config(spec))} if "judge" in spec.metrics else {}
            )
            bench_prov.append(
                BenchmarkProvenance(
                    name=spec.name,
                    version=spec.version,
                    dataset_hash=bm.dataset_hash(rows),
                    prompt_template_version=str(spec.prompt_template.version),
                    metrics=list(spec.scored_metrics),
                    k=list(spec.k),
                    examples=len(rows),
                    **judged,
                )
            )
        plans = plan_shards(sizes, shard_size)
        now = time.time()
        eid = "ev-" + uuid.uuid4().hex[:16]
        with self._session() as s:
            model = model_identity(s, scope, req, adapter)
            priced = {"prices": suite.prices} if suite.prices else {}  # cost depends on them
            provenance = Provenance(
                model_hash=model.hash,
                benchmarks=bench_prov,
                evaluator_version=req.evaluator_version or EVALUATOR_VERSION,
                decoding=decoding,
                code_commit=req.code_commit,
                adapter=AdapterSpec.of(adapter).provenance(),
                **priced,
            )
            key = cache_key(provenance)
            provenance = provenance.model_copy(update={"cache_key": key})
            hit = None
            if not req.no_cache:
                # A result is reused across the tenant's projects: same inputs, same scores.
                hit = s.scalars(
                    scoped(select(Evaluation), scope)
                    .where(
                        Evaluation.cache_key == key,
                        Evaluation.state == "COMPLETED",
                    )
                    .order_by(Evaluation.id)
                ).first()
            row = Evaluation(
                tenant=scope.tenant,
                project=scope.project,
                evaluation_id=eid,
                model_id=model.model_id,
                model_version=model.model_version,
                run_id=model.run_id,
                checkpoint_id=model.checkpoint_id,
                adapter=adapter,
                # the benchmarks as sent (inline examples numbered by loading them)
                suite={**suite.spec(), "benchmarks": [b.as_json() for b in specs]},
                priority=priority,
                deadline=float(req.deadline) if req.deadline else None,
                state="QUEUED",
                cache_key=key,
                cached_from="",
                provenance=provenance.as_json(),
                metrics={},
                error="",
                created_at=now,
                completed_at=None,
                created_by=scope.actor,
                trigger_id=req.trigger_id,
            )
            if hit is not None:
                row.state, row.metrics, row.completed_at = "COMPLETED", dict(hit.metrics), now
                row.cached_from = hit.cached_from or hit.evaluation_id
                s.add(row)
                if row.model_id:  # the same scores, judged against this model's production
                    scores: dict[str, dict[str, dict[str, float]]] = {}
                    for sh in shards_of(s, scope.tenant, row.cached_from):
                        if sh.state == "done":
                            scores.setdefault(sh.benchmark, {}).update(sh.scores or {})  # type: ignore[arg-type]
                    row.regressions = stored_regressions(
                        judge_regressions(s, scope.tenant, row, scores, dict(row.metrics))
                    )
                return evaluation_view(row, [])
            s.add(row)
            locality = model.hash
            deadline = row.deadline if row.deadline is not None else NO_DEADLINE
            for p in plans:
                s.add(
                    EvalShard(
                        tenant=scope.tenant,
                        project=scope.project,
                        evaluation_id=eid,
                        shard_index=p.index,
                        benchmark=p.benchmark,
                        start=p.start,
                        stop=p.stop,
                        priority=priority,
                        deadline=deadline,
                        locality=locality,
                        state="queued",
                        lease_token="",
                        worker_id="",
                        lease_expires=0.0,
                        attempts=0,
                        max_attempts=max_attempts,
                        done=0,
                        scores={},
                        error="",
                        created_at=now,
                        updated_at=now,
                    )
                )
            return evaluation_view(row, [])
