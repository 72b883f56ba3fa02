"""Reading evaluations and their results: per-example scores (on the shard rows and in the
telemetry store's ``eval_examples`` table) and the aggregation once every shard is settled."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from ..errors import ConfigError
from ..store.eval_queries import (
    TEXTS,
    ExampleScores,
    create_examples_table,
    insert_examples,
    read_examples,
)
from ..store.graph_models import ModelVersion
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.scoped import scoped
from ..store.telemetry import TelemetryStore
from . import benchmarks as bm
from .doc_types import RegressionRecord
from .lm_eval_tasks import MC_METRICS as _MC  # an example's detail: its choices' likelihoods
from .models import EvalShard, Evaluation, ModelAlias
from .performance import performance, price_for
from .regressions import find_regressions
from .rows import (
    TERMINAL,
    EvaluationView,
    SessionFactory,
    evaluation_view,
    find_evaluation,
    shards_of,
)
from .suites import PERFORMANCE


def judge_regressions(
    s: Session,
    tenant: str,
    ev: Evaluation,
    scores: dict[str, dict[str, dict[str, float]]],
    metrics: dict[str, Any],
) -> list[RegressionRecord] | None:
    """What this evaluation regressed against the production version's latest evaluation
    (and its suite's absolute bounds); None when there is nothing to judge by."""
    prod = s.scalars(
        scoped(select(ModelAlias), tenant).where(
            ModelAlias.model_id == ev.model_id, ModelAlias.alias == "production"
        )
    ).first()
    base: Evaluation | None = None
    if prod is not None and prod.version != ev.model_version:
        base = s.scalars(
            scoped(select(Evaluation), tenant)
            .where(
                Evaluation.model_id == ev.model_id,
                Evaluation.model_version == prod.version,
                Evaluation.state == "COMPLETED",
            )
            .order_by(Evaluation.id.desc())
        ).first()
    base_scores: dict[str, dict[str, dict[str, float]]] | None = None
    if base is not None:
        base_scores = {}
        for sh in shards_of(s, tenant, base.cached_from or base.evaluation_id):
            if sh.state == "done":
                base_scores.setdefault(sh.benchmark, {}).update(sh.scores or {})  # type: ignore[arg-type]
    gates = ev.suite.get("gates") if isinstance(ev.suite, dict) else None
    try:
        found = find_regressions(
            gates,  # type: ignore[arg-type]
            scores,
            metrics,
            base_scores,
            dict(base.metrics) if base is not None else None,
        )
    except ConfigError as exc:  # a gate that cannot judge these scores (McNemar on 0.5)
        return [RegressionRecord(kind="benchmark", metric="", status="error", reasons=[str(exc)])]
    if found is None:
        return None
    against = {
        "baseline_version": prod.version if prod else None,
        "baseline_evaluation": base.evaluation_id if base else None,
    }
    return [r.model_copy(update=against) for r in found]


def stored_regressions(found: list[RegressionRecord] | None) -> list[Any] | None:
    """Regressions as an evaluation's ``regressions`` column keeps them."""
    return None if found is None else [r.as_json() for r in found]


@dataclass(frozen=True, slots=True)
class ExampleRow:
    """One example's score on one metric, with its notes and texts ("" when it has none)."""

    benchmark: str
    shard_index: int
    example_id: str
    metric: str
    value: float
    loglikelihoods: str = ""  # multiple choice: the choices' scores
    rationale: str = ""  # a judge's rationale
    prompt: str = ""
    output: str = ""
    reference: str = ""


class Results:
    """Evaluations as read back, their per-example scores, and their final metrics."""

    def __init__(self, session: SessionFactory, telemetry: TelemetryStore | None = None) -> None:
        self._session = session
        self._telemetry = telemetry
        if telemetry is not None:
            create_examples_table(telemetry)

    def get(self, scope: Scope, evaluation_id: str) -> EvaluationView:
        with self._session() as s:
            row = find_evaluation(s, scope, evaluation_id)
            return evaluation_view(row, shards_of(s, scope.tenant, evaluation_id))

    def evaluations(
        self, scope: Scope, model_id: str = "", limit: int = 100
    ) -> list[EvaluationView]:
        with self._session() as s:
            q = scoped(select(Evaluation), scope, within="project")
            if model_id:
                q = q.where(Evaluation.model_id == model_id)
            rows = s.scalars(q.order_by(Evaluation.id.desc()).limit(limit)).all()
            return [evaluation_view(r, None) for r in rows]

    def scores(self, scope: Scope, evaluation_id: str) -> dict[str, dict[str, dict[str, float]]]:
        """Per-example scores by benchmark (a cache hit's come from the evaluation it reused)."""
        with self._session() as s:
            row = find_evaluation(s, scope, evaluation_id)
            source = row.cached_from or row.evaluation_id
            out: dict[str, dict[str, dict[str, float]]] = {}
            for sh in shards_of(s, scope.tenant, source):
                if sh.state == "done":
                    out.setdefault(sh.benchmark, {}).update(sh.scores or {})  # type: ignore[arg-type]
            return out

    def example_rows(
        self, scope: Scope, evaluation_id: str, limit: int = 10000
    ) -> list[ExampleRow]:
        """Per-example scores as the telemetry store holds them."""
        with self._session() as s:
            row = find_evaluation(s, scope, evaluation_id)
            source = row.cached_from or row.evaluation_id
        if self._telemetry is None:
            return []
        t = read_examples(TenantReader(self._telemetry, scope), source, limit)
        return [
            ExampleRow(
                benchmark=b,
                shard_index=i,
                example_id=e,
                metric=m,
                value=v,
                loglikelihoods=d if m in _MC else "",
                rationale="" if m in _MC else d,
                prompt=p,
                output=o,
                reference=r,
            )
            for b, i, e, m, v, d, p, o, r in zip(
                *(t.column(c).to_pylist() for c in t.column_names), strict=True
            )
        ]

    def write_examples(
        self, tenant: str, eid: str, bench: str, index: int, scores: dict[str, dict[str, Any]]
    ) -> None:
        if self._telemetry is None or not scores:
            return
        rows = ExampleScores([], [], [], [], [], [], [])
        for example_id, per in scores.items():
            notes = {k: v for k, v in per.items() if isinstance(v, str)}
            first = True
            for metric, value in per.items():
                if isinstance(value, str):
                    continue  # a note (a judge's rationale, the example's texts) rides along
                rows.example_id.append(example_id)
                rows.metric.append(metric)
                rows.value.append(float(value))
                # a judge's rationale; a multiple-choice answer's choice log-likelihoods
                rationale = notes.get(metric.removesuffix("_score") + "_rationale")
                mc = notes.get("loglikelihoods", "") if metric in _MC else ""
                rows.detail.append(rationale or mc)
                columns = (rows.prompt, rows.output, rows.reference)
                for col, texts in zip(TEXTS, columns, strict=True):
                    texts.append(notes.get(col, "") if first else "")
                first = False
        insert_examples(self._telemetry, tenant, eid, bench, index, rows)

    def finalize(self, tenant: str, evaluation_id: str) -> str:
        """Aggregate once every shard is done or failed; failed shards leave the rest intact."""
        with self._session() as s:
            open_shards = s.scalar(
                scoped(select(func.count()).select_from(EvalShard), tenant, EvalShard).where(
                    EvalShard.evaluation_id == evaluation_id,
                    EvalShard.state.not_in(("done", "failed")),
                )
            )
            if open_shards:
                return "RUNNING"
            ev = s.scalars(
                scoped(select(Evaluation), tenant).where(Evaluation.evaluation_id == evaluation_id)
            ).one()
            if ev.state in TERMINAL:
                return ev.state
            shards = shards_of(s, tenant, evaluation_id)
            per_bench: dict[str, dict[str, dict[str, float]]] = {}
            for sh in shards:
                if sh.state == "done":
                    per_bench.setdefault(sh.benchmark, {}).update(sh.scores or {})  # type: ignore[arg-type]
            metrics: dict[str, Any] = {b: bm.aggregate(v) for b, v in per_bench.items()}
            price = price_for(ev.suite.get("prices"), dict(ev.adapter or {}))  # type: ignore[arg-type]
            perf = performance((e for v in per_bench.values() for e in v.values()), price)
            if perf:
                metrics[PERFORMANCE] = perf
            failed = [sh for sh in shards if sh.state == "failed"]
            state = "FAILED" if failed else "COMPLETED"
            error = "; ".join(
                f"shard {sh.shard_index} ({sh.benchmark} {sh.start}-{sh.stop}) failed after "
                f"{sh.attempts} attempts: {sh.error}"
                for sh in failed
            )
            res = s.execute(
                scoped(update(Evaluation), tenant)
                .where(Evaluation.id == ev.id, Evaluation.state.not_in(TERMINAL))
                .values(state=state, metrics=metrics, error=error[:4000], completed_at=time.time())
            )
            if res.rowcount == 1 and state == "COMPLETED" and ev.model_id:  # type: ignore[attr-defined]
                ev.regressions = stored_regressions(
                    judge_regressions(s, tenant, ev, per_bench, metrics)
                )
                mv = s.scalars(
                    scoped(select(ModelVersion), tenant).where(
                        ModelVersion.model_id == ev.model_id,
                        ModelVersion.version == ev.model_version,
                    )
                ).first()
                if mv is not None:
                    mv.evaluation_id = evaluation_id
                    flat = {f"{b}/{k}": v["mean"] for b, d in metrics.items() for k, v in d.items()}
                    mv.metrics = {**(mv.metrics or {}), **flat}
            return state
