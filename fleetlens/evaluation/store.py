"""Evaluations in the metadata store: submission, the shard queue, leases, results.

Leasing is exactly-once on both engines. A lease is a conditional UPDATE that names the state
and lease token it saw (``WHERE id = ? AND state = ? AND lease_token = ?``) and counts the rows
it changed: of two workers racing for a shard, one changes a row and the other none. On
PostgreSQL the candidates are also read ``FOR UPDATE SKIP LOCKED`` so that racing workers take
different shards instead of colliding. Every later report (heartbeat, partial results,
completion, failure) carries the lease token, and a report whose token is no longer the shard's
changes nothing: a worker presumed dead cannot double-count a shard that was leased again.

Per-example scores are kept on the shard row, keyed by example id (so a retry or a partial
report can never count an example twice), and copied into the telemetry store's
``eval_examples`` table for analysis.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from typing import Any

from sqlalchemy import case, func, or_, select, update
from sqlalchemy.orm import Session

from ..errors import ConfigError, NotFound
from ..store.graph_models import Checkpoint, ModelVersion
from ..store.metadata import MetadataStore
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from . import benchmarks as bm
from .adapters import Decoding, validate_spec
from .cache import EVALUATOR_VERSION, cache_key, canonical_hash
from .judge import JudgeConfig
from .models import EvalShard, Evaluation
from .scheduler import NO_DEADLINE, PRIORITY_NAMES, parse_priority, plan_shards

__all__ = ["EvalStore", "LeaseLost"]

TERMINAL = ("COMPLETED", "FAILED")
_EXAMPLES_DDL = """
CREATE TABLE IF NOT EXISTS {db}.eval_examples (
    tenant LowCardinality(String),
    evaluation_id String,
    benchmark LowCardinality(String),
    shard_index UInt32,
    example_id String,
    metric LowCardinality(String),
    value Float64,
    detail String DEFAULT '',
    at DateTime64(3) DEFAULT now64(3)
) ENGINE = ReplacingMergeTree
ORDER BY (tenant, evaluation_id, benchmark, example_id, metric)
"""


class LeaseLost(ConfigError):
    """The report's lease token is not the shard's any more (expired and leased again)."""


class EvalStore:
    """Evaluations and their shards; one per server, shared by its request threads."""

    def __init__(self, metadata: MetadataStore, telemetry: TelemetryStore | None = None) -> None:
        self._session = metadata._session
        self._dialect = metadata.engine.dialect.name
        self._telemetry = telemetry
        self._examples: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        if telemetry is not None:
            telemetry.command(_EXAMPLES_DDL.format(db=telemetry.database))

    # -- benchmarks -----------------------------------------------------------------------------

    def _load(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        key = canonical_hash(spec)
        rows = self._examples.get(key)
        if rows is None:
            rows = bm.load_examples(spec)
            self._examples[key] = rows
            while len(self._examples) > 32:
                self._examples.popitem(last=False)
        self._examples.move_to_end(key)
        return rows

    # -- submission -----------------------------------------------------------------------------

    def _model_hash(self, s: Session, scope: Scope, req: dict[str, Any]) -> dict[str, str]:
        """The model being judged and its content hash (the checkpoint's checksum)."""
        out = {"modelId": "", "modelVersion": "", "runId": "", "checkpointId": "", "hash": ""}
        if req.get("modelId") and req.get("modelVersion"):
            q = select(ModelVersion).where(
                ModelVersion.tenant == scope.tenant,
                ModelVersion.model_id == req["modelId"],
                ModelVersion.version == req["modelVersion"],
            )
            if scope.project:
                q = q.where(ModelVersion.project == scope.project)
            mv = s.scalars(q).first()
            if mv is None:
                raise NotFound(
                    f"model version {req['modelId']}:{req['modelVersion']} does not exist"
                )
            out.update(modelId=mv.model_id, modelVersion=mv.version, runId=mv.run_id)
            out["checkpointId"] = mv.checkpoint_id
        elif req.get("runId") and req.get("checkpointId"):
            out.update(runId=req["runId"], checkpointId=req["checkpointId"])
        if out["checkpointId"]:
            ck = s.scalars(
                select(Checkpoint).where(
                    Checkpoint.tenant == scope.tenant,
                    Checkpoint.run_id == out["runId"],
                    Checkpoint.checkpoint_id == out["checkpointId"],
                )
            ).first()
            if ck is None:
                raise NotFound(
                    f"checkpoint {out['checkpointId']} of run {out['runId']!r} does not exist"
                )
            out["hash"] = ck.checksum
        # A caller-declared hash (a served model's weights digest) wins; without any, the
        # adapter spec itself identifies the model.
        out["hash"] = str(
            req.get("modelHash") or out["hash"] or "spec:" + canonical_hash(req["adapter"])
        )
        return out

    def submit(self, scope: Scope, req: dict[str, Any]) -> dict[str, Any]:
        """Queue an evaluation (or reuse a cached result); returns at once."""
        adapter = dict(req.get("adapter") or {})
        validate_spec(adapter)
        req = {**req, "adapter": adapter}
        suite = dict(req.get("suite") or {})
        specs = [dict(b) for b in suite.get("benchmarks") or []]
        if not specs:
            raise ConfigError("suite.benchmarks is empty; name at least one benchmark")
        names = [str(b.get("name", "")) for b in specs]
        if "" in names or len(set(names)) != len(names):
            raise ConfigError(f"benchmark names {names} must be non-empty and unique in a suite")
        decoding = Decoding.from_json(req.get("decoding")).as_json()
        priority = parse_priority(req.get("priority", "P2"))
        shard_size = int(req.get("shardSize") or 50)
        max_attempts = int(req.get("maxAttempts") or 3)
        if max_attempts < 1:
            raise ConfigError(f"maxAttempts {max_attempts} must be >= 1")
        sizes: list[tuple[str, int]] = []
        bench_prov = []
        for spec in specs:
            for metric in spec.get("metrics") or ["exact_match"]:
                if metric not in bm.METRICS:
                    raise ConfigError(f"metric {metric!r} is unknown; use one of {bm.METRICS}")
            if "pass@k" in (spec.get("metrics") or []):
                ks = [int(k) for k in spec.get("k") or [1]]
                if max(ks) > decoding["n"]:
                    raise ConfigError(f"pass@{max(ks)} needs decoding.n >= {max(ks)}")
            rows = self._load(spec)
            sizes.append((spec["name"], len(rows)))
            bench_prov.append(
                {
                    "name": spec["name"],
                    "version": str(spec.get("version", "")),
                    "datasetHash": bm.dataset_hash(rows),
                    "promptTemplateVersion": str(
                        (spec.get("promptTemplate") or {}).get("version", "")
                    ),
                    "metrics": list(spec.get("metrics") or ["exact_match"]),
                    "k": list(spec.get("k") or []),
                    "examples": len(rows),
                    **(
                        {"judge": JudgeConfig.from_spec(spec).provenance()}
                        if "judge" in (spec.get("metrics") or [])
                        else {}
                    ),
                }
            )
        plans = plan_shards(sizes, shard_size)
        now = time.time()
        eid = "ev-" + uuid.uuid4().hex[:16]
        with self._session() as s:
            model = self._model_hash(s, scope, req)
            provenance = {
                "modelHash": model["hash"],
                "benchmarks": bench_prov,
                "evaluatorVersion": str(req.get("evaluatorVersion") or EVALUATOR_VERSION),
                "decoding": decoding,
                "codeCommit": str(req.get("codeCommit", "")),
                "adapter": {k: v for k, v in adapter.items() if k != "apiKeyEnv"},
            }
            key = cache_key(provenance)
            provenance["cacheKey"] = key
            hit = None
            if not req.get("noCache"):
                hit = s.scalars(
                    select(Evaluation)
                    .where(
                        Evaluation.tenant == scope.tenant,
                        Evaluation.cache_key == key,
                        Evaluation.state == "COMPLETED",
                    )
                    .order_by(Evaluation.id)
                ).first()
            row = Evaluation(
                tenant=scope.tenant, project=scope.project, evaluation_id=eid,
                model_id=model["modelId"], model_version=model["modelVersion"],
                run_id=model["runId"], checkpoint_id=model["checkpointId"], adapter=adapter,
                suite={**suite, "benchmarks": specs}, priority=priority,
                deadline=float(req["deadline"]) if req.get("deadline") else None,
                state="QUEUED", cache_key=key, cached_from="", provenance=provenance,
                metrics={}, error="", created_at=now, completed_at=None, created_by=scope.actor,
            )  # fmt: skip
            if hit is not None:
                row.state, row.metrics, row.completed_at = "COMPLETED", dict(hit.metrics), now
                row.cached_from = hit.cached_from or hit.evaluation_id
                s.add(row)
                return self._json(row, [])
            s.add(row)
            locality = model["hash"]
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
            return self._json(row, [])

    # -- reading --------------------------------------------------------------------------------

    @staticmethod
    def _evaluation(s: Session, scope: Scope, evaluation_id: str) -> Evaluation:
        q = select(Evaluation).where(
            Evaluation.tenant == scope.tenant, Evaluation.evaluation_id == evaluation_id
        )
        if scope.project:
            q = q.where(Evaluation.project == scope.project)
        row = s.scalars(q).first()
        if row is None:
            raise NotFound(f"evaluation {evaluation_id!r} does not exist")
        return row

    @staticmethod
    def _shards(s: Session, tenant: str, evaluation_id: str) -> list[EvalShard]:
        return list(
            s.scalars(
                select(EvalShard)
                .where(EvalShard.tenant == tenant, EvalShard.evaluation_id == evaluation_id)
                .order_by(EvalShard.shard_index)
            ).all()
        )

    def get(self, scope: Scope, evaluation_id: str) -> dict[str, Any]:
        with self._session() as s:
            row = self._evaluation(s, scope, evaluation_id)
            return self._json(row, self._shards(s, scope.tenant, evaluation_id))

    def evaluations(
        self, scope: Scope, model_id: str = "", limit: int = 100
    ) -> list[dict[str, Any]]:
        with self._session() as s:
            q = select(Evaluation).where(Evaluation.tenant == scope.tenant)
            if scope.project:
                q = q.where(Evaluation.project == scope.project)
            if model_id:
                q = q.where(Evaluation.model_id == model_id)
            rows = s.scalars(q.order_by(Evaluation.id.desc()).limit(limit)).all()
            return [self._json(r, None) for r in rows]

    def scores(self, scope: Scope, evaluation_id: str) -> dict[str, dict[str, dict[str, float]]]:
        """Per-example scores by benchmark (a cache hit's come from the evaluation it reused)."""
        with self._session() as s:
            row = self._evaluation(s, scope, evaluation_id)
            source = row.cached_from or row.evaluation_id
            out: dict[str, dict[str, dict[str, float]]] = {}
            for sh in self._shards(s, scope.tenant, source):
                if sh.state == "done":
                    out.setdefault(sh.benchmark, {}).update(sh.scores or {})  # type: ignore[arg-type]
            return out

    def example_rows(
        self, scope: Scope, evaluation_id: str, limit: int = 10000
    ) -> list[dict[str, Any]]:
        """Per-example scores as the telemetry store holds them."""
        with self._session() as s:
            row = self._evaluation(s, scope, evaluation_id)
            source = row.cached_from or row.evaluation_id
        if self._telemetry is None:
            return []
        t = self._telemetry.query(
            f"SELECT benchmark, shard_index, example_id, metric, value, detail "
            f"FROM {self._telemetry.database}.eval_examples FINAL "
            "WHERE tenant = {tenant:String} AND evaluation_id = {eid:String} "
            "ORDER BY benchmark, example_id, metric LIMIT {lim:UInt32}",
            {"tenant": scope.tenant, "eid": source, "lim": int(limit)},
        )
        return [
            {
                "benchmark": b,
                "shardIndex": i,
                "exampleId": e,
                "metric": m,
                "value": v,
                **({"rationale": d} if d else {}),
            }
            for b, i, e, m, v, d in zip(
                *(t.column(c).to_pylist() for c in t.column_names), strict=True
            )
        ]

    @staticmethod
    def _json(r: Evaluation, shards: list[EvalShard] | None) -> dict[str, Any]:
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

    # -- leasing --------------------------------------------------------------------------------

    def lease(
        self, scope: Scope, worker_id: str, prefer_locality: str = "", lease_s: float = 30.0
    ) -> dict[str, Any] | None:
        """Hand the next shard to ``worker_id``, or None when nothing is runnable."""
        for _ in range(8):
            now = time.time()
            expired: list[tuple[str, str]] = []
            with self._session() as s:
                q = select(EvalShard).where(
                    EvalShard.tenant == scope.tenant,
                    or_(
                        EvalShard.state == "queued",
                        (EvalShard.state == "leased") & (EvalShard.lease_expires < now),
                    ),
                )
                if scope.project:
                    q = q.where(EvalShard.project == scope.project)
                local = case((EvalShard.locality == prefer_locality, 0), else_=1)
                q = q.order_by(
                    EvalShard.priority, EvalShard.deadline, local, EvalShard.created_at,
                    EvalShard.id,
                ).limit(4)  # fmt: skip
                if self._dialect == "postgresql":
                    q = q.with_for_update(skip_locked=True)
                candidates = s.scalars(q).all()
                if not candidates:
                    return None
                for c in candidates:
                    seen = (EvalShard.id == c.id, EvalShard.state == c.state,
                            EvalShard.lease_token == c.lease_token)  # fmt: skip
                    if c.state == "leased" and c.attempts >= c.max_attempts:
                        # Its last allowed attempt died without a word: the shard failed.
                        res = s.execute(
                            update(EvalShard)
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
                        update(EvalShard)
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
                        update(Evaluation)
                        .where(
                            Evaluation.tenant == c.tenant,
                            Evaluation.evaluation_id == c.evaluation_id,
                            Evaluation.state == "QUEUED",
                        )
                        .values(state="RUNNING")
                    )
                    ev = s.scalars(
                        select(Evaluation).where(
                            Evaluation.tenant == c.tenant,
                            Evaluation.evaluation_id == c.evaluation_id,
                        )
                    ).one()
                    payload = self._payload(ev, c, token, now + lease_s, attempt)
                    break
                else:
                    payload = None
            for tenant, eid in expired:
                self._finalize(tenant, eid)
            if payload is not None:
                return payload
        return None

    def _payload(
        self, ev: Evaluation, sh: EvalShard, token: str, expires: float, attempt: int
    ) -> dict[str, Any]:
        spec = _spec(ev, sh.benchmark)
        examples = self._load(spec)[sh.start : sh.stop]
        spec.pop("examples", None)
        return {
            "shardId": sh.id,
            "evaluationId": ev.evaluation_id,
            "index": sh.shard_index,
            "benchmark": spec,
            "start": sh.start,
            "stop": sh.stop,
            "examples": examples,
            "completedIds": sorted((sh.scores or {}).keys()),
            "adapter": ev.adapter,
            "decoding": ev.provenance.get("decoding", {}),
            "locality": sh.locality,
            "leaseToken": token,
            "leaseExpires": expires,
            "attempt": attempt,
        }

    def _owned(self, s: Session, scope: Scope, shard_id: int) -> EvalShard:
        q = select(EvalShard).where(EvalShard.tenant == scope.tenant, EvalShard.id == shard_id)
        if scope.project:
            q = q.where(EvalShard.project == scope.project)
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
        partial: dict[str, dict[str, float]] | None = None,
    ) -> dict[str, Any]:
        """Extend the lease; record partial per-example results (keyed by example id)."""
        now = time.time()
        with self._session() as s:
            sh = self._owned(s, scope, shard_id)
            values: dict[str, Any] = {"lease_expires": now + lease_s, "updated_at": now}
            if partial:
                merged = {**(sh.scores or {}), **partial}
                values.update(scores=merged, done=len(merged))
            res = s.execute(
                update(EvalShard)
                .where(
                    EvalShard.id == shard_id,
                    EvalShard.lease_token == token,
                    EvalShard.state == "leased",
                )
                .values(**values)
            )
            if res.rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(f"shard {shard_id}: this lease is no longer held; drop the shard")
        return {"shardId": shard_id, "leaseExpires": now + lease_s}

    def complete(
        self, scope: Scope, shard_id: int, token: str, scores: dict[str, dict[str, float]]
    ) -> dict[str, Any]:
        now = time.time()
        with self._session() as s:
            sh = self._owned(s, scope, shard_id)
            if sh.lease_token != token or sh.state != "leased":
                raise LeaseLost(f"shard {shard_id}: this lease is no longer held; result dropped")
            spec_ids = {str(e["id"]) for e in self._shard_examples(s, sh)}
            merged: dict[str, dict[str, float]] = {**(sh.scores or {}), **scores}  # type: ignore[dict-item]
            if set(merged) != spec_ids:
                missing = sorted(spec_ids - set(merged))[:5]
                extra = sorted(set(merged) - spec_ids)[:5]
                raise ConfigError(
                    f"shard {shard_id} results do not cover its examples: "
                    f"missing {missing}, unexpected {extra}"
                )
            res = s.execute(
                update(EvalShard)
                .where(
                    EvalShard.id == shard_id,
                    EvalShard.lease_token == token,
                    EvalShard.state == "leased",
                )
                .values(state="done", scores=merged, done=len(merged), updated_at=now, error="")
            )
            if res.rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(f"shard {shard_id}: this lease is no longer held; result dropped")
            tenant, eid, bench, index = sh.tenant, sh.evaluation_id, sh.benchmark, sh.shard_index
        self._write_examples(tenant, eid, bench, index, merged)
        state = self._finalize(tenant, eid)
        return {"shardId": shard_id, "state": "done", "evaluationState": state}

    def fail(self, scope: Scope, shard_id: int, token: str, error: str) -> dict[str, Any]:
        """A failed attempt: the shard alone goes back to the queue, or fails at its limit."""
        now = time.time()
        with self._session() as s:
            sh = self._owned(s, scope, shard_id)
            final = sh.attempts >= sh.max_attempts
            res = s.execute(
                update(EvalShard)
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
        state = self._finalize(tenant, eid) if final else "RUNNING"
        return {
            "shardId": shard_id,
            "state": "failed" if final else "queued",
            "evaluationState": state,
        }

    def _shard_examples(self, s: Session, sh: EvalShard) -> list[dict[str, Any]]:
        ev = s.scalars(
            select(Evaluation).where(
                Evaluation.tenant == sh.tenant, Evaluation.evaluation_id == sh.evaluation_id
            )
        ).one()
        return self._load(_spec(ev, sh.benchmark))[sh.start : sh.stop]

    def _write_examples(
        self, tenant: str, eid: str, bench: str, index: int, scores: dict[str, dict[str, Any]]
    ) -> None:
        if self._telemetry is None or not scores:
            return
        ex, met, val, det = [], [], [], []
        for example_id, per in scores.items():
            notes = {k: v for k, v in per.items() if isinstance(v, str)}
            for metric, value in per.items():
                if isinstance(value, str):
                    continue  # a note (a judge's rationale) rides with its score
                ex.append(example_id)
                met.append(metric)
                val.append(float(value))
                det.append(notes.get(metric.removesuffix("_score") + "_rationale", ""))
        self._telemetry.command_params(
            f"INSERT INTO {self._telemetry.database}.eval_examples "
            "(tenant, evaluation_id, benchmark, shard_index, example_id, metric, value, detail) "
            "SELECT {t:String}, {e:String}, {b:String}, {i:UInt32}, z.1, z.2, z.3, z.4 "
            "FROM (SELECT arrayJoin(arrayZip({ex:Array(String)}, {met:Array(String)}, "
            "{val:Array(Float64)}, {det:Array(String)})) AS z)",
            {
                "t": tenant,
                "e": eid,
                "b": bench,
                "i": index,
                "ex": ex,
                "met": met,
                "val": val,
                "det": det,
            },
        )

    def _finalize(self, tenant: str, evaluation_id: str) -> str:
        """Aggregate once every shard is done or failed; failed shards leave the rest intact."""
        with self._session() as s:
            open_shards = s.scalar(
                select(func.count()).where(
                    EvalShard.tenant == tenant,
                    EvalShard.evaluation_id == evaluation_id,
                    EvalShard.state.not_in(("done", "failed")),
                )
            )
            if open_shards:
                return "RUNNING"
            ev = s.scalars(
                select(Evaluation).where(
                    Evaluation.tenant == tenant, Evaluation.evaluation_id == evaluation_id
                )
            ).one()
            if ev.state in TERMINAL:
                return ev.state
            shards = self._shards(s, tenant, evaluation_id)
            per_bench: dict[str, dict[str, dict[str, float]]] = {}
            for sh in shards:
                if sh.state == "done":
                    per_bench.setdefault(sh.benchmark, {}).update(sh.scores or {})  # type: ignore[arg-type]
            metrics: dict[str, Any] = {b: bm.aggregate(v) for b, v in per_bench.items()}
            failed = [sh for sh in shards if sh.state == "failed"]
            state = "FAILED" if failed else "COMPLETED"
            error = "; ".join(
                f"shard {sh.shard_index} ({sh.benchmark} {sh.start}-{sh.stop}) failed after "
                f"{sh.attempts} attempts: {sh.error}"
                for sh in failed
            )
            res = s.execute(
                update(Evaluation)
                .where(Evaluation.id == ev.id, Evaluation.state.not_in(TERMINAL))
                .values(state=state, metrics=metrics, error=error[:4000], completed_at=time.time())
            )
            if res.rowcount == 1 and state == "COMPLETED" and ev.model_id:  # type: ignore[attr-defined]
                mv = s.scalars(
                    select(ModelVersion).where(
                        ModelVersion.tenant == tenant,
                        ModelVersion.model_id == ev.model_id,
                        ModelVersion.version == ev.model_version,
                    )
                ).first()
                if mv is not None:
                    mv.evaluation_id = evaluation_id
                    flat = {f"{b}/{k}": v["mean"] for b, d in metrics.items() for k, v in d.items()}
                    mv.metrics = {**(mv.metrics or {}), **flat}
            return state


def _spec(ev: Evaluation, benchmark: str) -> dict[str, Any]:
    benchmarks: list[dict[str, Any]] = list(ev.suite.get("benchmarks") or [])  # type: ignore[call-overload]
    return dict(next(b for b in benchmarks if b["name"] == benchmark))
