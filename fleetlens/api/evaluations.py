"""The evaluation API: submit and follow evaluations, the shard lease protocol workers speak,
quality gates, and model aliases (promotion).

Workers are ordinary clients with a write token: they lease a shard, heartbeat while they run
it (sending partial results), and report it done or failed. Every call is scoped to the
caller's tenant, so a worker only ever sees its own tenant's shards.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from ..evaluation.registry import Registry
from ..evaluation.store import EvalStore
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .evaluation_models import (
    EvaluationListOut,
    EvaluationOut,
    ExampleRowOut,
    ExamplesOut,
    HeartbeatOut,
    LeaseOut,
    ShardReportOut,
    SuiteListOut,
    SuiteOut,
    TriggerListOut,
    TriggerOut,
)
from .gate_models import (
    AliasesOut,
    AliasMoveOut,
    AliasSetOut,
    GateDecisionListOut,
    GateDecisionOut,
)

__all__ = ["eval_stores", "router"]

# Request bodies take JSON as it is: no 0 for false, no false for 0, no "1" for 1.
STRICT = ConfigDict(strict=True)

router = APIRouter(prefix="/v1", tags=["evaluation"], responses=ERROR_RESPONSES)

Reader = Annotated[Scope, Depends(require("read"))]
Writer = Annotated[Scope, Depends(require("write"))]
ShardId = Annotated[int, Path(ge=1, le=2**62)]
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"description": "The lease is no longer held, or a promotion was refused"}
}


def _stores(request: Request) -> tuple[EvalStore, Registry]:
    return eval_stores(request.app.state)


def eval_stores(state: Any) -> tuple[EvalStore, Registry]:
    """One EvalStore per app (it creates its ClickHouse table once, and caches benchmarks)."""
    stores: tuple[EvalStore, Registry] | None = getattr(state, "evaluation_stores", None)
    if stores is None:
        svc = state.services
        evals = EvalStore(svc.metadata, svc.telemetry)
        stores = (evals, Registry(svc.metadata, evals, svc.access))
        state.evaluation_stores = stores
    return stores


async def _run(fn: Any) -> Any:
    # LeaseLost and PromotionRefused (409), ConfigError (400): the app's one error table.
    return await anyio.to_thread.run_sync(fn)


# -- evaluations ----------------------------------------------------------------------------


class EvaluationBody(BaseModel):
    model_config = STRICT

    modelId: str = ""
    modelVersion: str = ""
    runId: str = ""
    checkpointId: str = ""
    modelHash: str = Field("", description="content hash of the weights, when no checkpoint")
    adapter: dict[str, Any] | None = Field(
        None, description="{kind: callable|openai|hf, ...}; default: the suite's"
    )
    suite: dict[str, Any] | None = Field(None, description="{name, version, benchmarks: [...]}")
    benchmarkSuite: str = Field("", description="a registered suite: name or name@version")
    decoding: dict[str, Any] = Field(default_factory=dict)
    priority: str = Field("P2", description="P0 safety .. P3 exploratory")
    deadline: float | None = Field(None, ge=0, le=1e12, allow_inf_nan=False)
    shardSize: int = Field(50, ge=1, le=100_000)
    maxAttempts: int = Field(3, ge=1, le=20)
    codeCommit: str = ""
    noCache: bool = False


@router.post(
    "/evaluations",
    response_model=EvaluationOut,
    response_model_exclude_unset=True,
    summary="Queue an evaluation of a model version or checkpoint on a suite",
    status_code=202,
)
async def submit(request: Request, body: EvaluationBody, scope: Writer) -> EvaluationOut:
    evals, _ = _stores(request)
    return EvaluationOut.of(await _run(lambda: evals.submit(scope, body.model_dump())))


@router.get(
    "/evaluations",
    summary="Evaluations, newest first",
    response_model=EvaluationListOut,
    response_model_exclude_unset=True,
)
async def list_evaluations(
    request: Request,
    scope: Reader,
    model_id: Annotated[str, Query(alias="modelId")] = "",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> EvaluationListOut:
    evals, _ = _stores(request)
    rows = await _run(
        lambda: [EvaluationOut.of(v) for v in evals.evaluations(scope, model_id, limit)]
    )
    return EvaluationListOut(evaluations=rows)


@router.get(
    "/evaluations/{evaluation_id}",
    summary="An evaluation, its metrics and its shards",
    response_model=EvaluationOut,
    response_model_exclude_unset=True,
)
async def get_evaluation(request: Request, evaluation_id: str, scope: Reader) -> EvaluationOut:
    evals, _ = _stores(request)
    return EvaluationOut.of(await _run(lambda: evals.get(scope, evaluation_id)))


@router.get(
    "/evaluations/{evaluation_id}/examples",
    summary="Per-example scores",
    response_model=ExamplesOut,
    response_model_exclude_unset=True,
)
async def evaluation_examples(
    request: Request,
    evaluation_id: str,
    scope: Reader,
    limit: Annotated[int, Query(ge=1, le=1_000_000)] = 10000,
) -> ExamplesOut:
    evals, _ = _stores(request)
    # Up to a million rows: their models are built in the worker thread too.
    rows = await _run(
        lambda: [ExampleRowOut.of(r) for r in evals.example_rows(scope, evaluation_id, limit)]
    )
    return ExamplesOut(evaluation_id=evaluation_id, examples=rows)


# -- suites and the triggers that use them --------------------------------------------------


class SuiteBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    version: str = Field(min_length=1, max_length=128)
    description: str = ""
    benchmarks: list[dict[str, Any]] = Field(min_length=1)
    gates: list[dict[str, Any]] | None = Field(None, description="gate policies, as POST /v1/gates")
    decoding: dict[str, Any] | None = None
    adapter: dict[str, Any] | None = Field(None, description="the default adapter (a template)")
    prices: dict[str, dict[str, float]] | None = Field(
        None, description="model or endpoint (or *) -> {inputPer1kTokens, outputPer1kTokens}"
    )


@router.post(
    "/evaluation-suites",
    response_model=SuiteOut,
    response_model_exclude_unset=True,
    summary="Register a named, versioned suite (benchmarks, gates, decoding)",
    status_code=201,
    responses={409: {"description": "That version exists with other content"}},
)
async def register_suite(request: Request, body: SuiteBody, scope: Writer) -> SuiteOut:
    evals, _ = _stores(request)
    spec = body.model_dump(exclude_none=True)
    return SuiteOut.of(await _run(lambda: evals.suites.register(scope, spec)))


@router.get(
    "/evaluation-suites",
    summary="Registered suites, every version",
    response_model=SuiteListOut,
    response_model_exclude_unset=True,
)
async def list_suites(
    request: Request, scope: Reader, name: Annotated[str, Query(max_length=128)] = ""
) -> SuiteListOut:
    evals, _ = _stores(request)
    rows = await _run(lambda: evals.suites.suites(scope, name))
    return SuiteListOut(suites=[SuiteOut.of(v) for v in rows])


@router.get(
    "/evaluation-suites/{ref}",
    summary="A suite: name (newest version) or name@version",
    response_model=SuiteOut,
    response_model_exclude_unset=True,
)
async def get_suite(request: Request, ref: str, scope: Reader) -> SuiteOut:
    evals, _ = _stores(request)
    return SuiteOut.of(await _run(lambda: evals.suites.resolve(scope, ref)))


class TriggerBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    on: str = Field(description="model (a version registered), checkpoint (verified), alias")
    suite: str = Field(min_length=1, description="a registered suite: name or name@version")
    project: str = Field("", description="empty: every project")
    modelId: str = Field("", description="empty: any model")
    alias: str = ""
    adapter: dict[str, Any] | None = Field(
        None, description="template: {checkpointUri}, {runId}, {modelId}, {modelVersion}"
    )
    priority: str = Field("P1", pattern="^P[0-3]$")


@router.post(
    "/evaluation-triggers",
    response_model=TriggerOut,
    summary="A policy: evaluate new model versions or verified checkpoints on a suite",
    status_code=201,
)
async def add_trigger(request: Request, body: TriggerBody, scope: Writer) -> TriggerOut:
    evals, _ = _stores(request)
    return TriggerOut.of(await _run(lambda: evals.suites.add_trigger(scope, body.model_dump())))


@router.get(
    "/evaluation-triggers",
    summary="The policies that start evaluations",
    response_model=TriggerListOut,
)
async def list_triggers(request: Request, scope: Reader) -> TriggerListOut:
    evals, _ = _stores(request)
    rows = await _run(lambda: evals.suites.triggers(scope))
    return TriggerListOut(triggers=[TriggerOut.of(t) for t in rows])


# -- the worker protocol --------------------------------------------------------------------


# One example's scores: numbers by metric, and notes beside them (a judge's ``judge_rationale``).
Scores = dict[str, dict[str, float | Annotated[str, Field(max_length=16_384)]]]


class LeaseBody(BaseModel):
    model_config = STRICT

    workerId: str = Field(min_length=1, max_length=256)
    preferLocality: str = ""
    leaseS: float = Field(30.0, gt=0, le=3600)


class HeartbeatBody(BaseModel):
    model_config = STRICT

    leaseToken: str
    leaseS: float = Field(30.0, gt=0, le=3600)
    partial: Scores | None = None


class CompleteBody(BaseModel):
    model_config = STRICT

    leaseToken: str
    scores: Scores


class FailBody(BaseModel):
    model_config = STRICT

    leaseToken: str
    error: str = ""


@router.post(
    "/eval-shards/lease",
    response_model=LeaseOut,
    summary="Lease the next shard (204: nothing to do)",
    responses={204: {"description": "No shard is runnable now"}},
)
async def lease(request: Request, body: LeaseBody, scope: Writer) -> Any:
    evals, _ = _stores(request)
    out = await _run(lambda: evals.lease(scope, body.workerId, body.preferLocality, body.leaseS))
    return Response(status_code=204) if out is None else LeaseOut.of(out)


@router.post(
    "/eval-shards/{shard_id}/heartbeat",
    response_model=HeartbeatOut,
    summary="Extend a lease and report partial results",
    responses=_CONFLICT,
)
async def heartbeat(
    request: Request, shard_id: ShardId, body: HeartbeatBody, scope: Writer
) -> HeartbeatOut:
    evals, _ = _stores(request)
    return HeartbeatOut.of(
        await _run(
            lambda: evals.heartbeat(scope, shard_id, body.leaseToken, body.leaseS, body.partial)
        )
    )


@router.post(
    "/eval-shards/{shard_id}/complete",
    summary="Report a shard's results",
    responses=_CONFLICT,
    response_model=ShardReportOut,
)
async def complete(
    request: Request, shard_id: ShardId, body: CompleteBody, scope: Writer
) -> ShardReportOut:
    evals, _ = _stores(request)
    return ShardReportOut.of(
        await _run(lambda: evals.complete(scope, shard_id, body.leaseToken, body.scores))
    )


@router.post(
    "/eval-shards/{shard_id}/fail",
    summary="Report a failed attempt",
    responses=_CONFLICT,
    response_model=ShardReportOut,
)
async def fail(
    request: Request, shard_id: ShardId, body: FailBody, scope: Writer
) -> ShardReportOut:
    evals, _ = _stores(request)
    return ShardReportOut.of(
        await _run(lambda: evals.fail(scope, shard_id, body.leaseToken, body.error))
    )


# -- gates and promotion --------------------------------------------------------------------


class GateBody(BaseModel):
    model_config = STRICT

    modelId: str = Field(min_length=1)
    version: str = Field(min_length=1)
    policies: list[dict[str, Any]] = Field(
        description="[{metric: 'bench/metric', direction, maxRegression, hard, test, confidence}]"
    )
    candidateEvaluation: str = ""
    baselineAlias: str = "production"
    baselineEvaluation: str = ""


@router.post(
    "/gates",
    summary="Judge a candidate against the production alias",
    status_code=201,
    response_model=GateDecisionOut,
    response_model_exclude_unset=True,
)
async def run_gate(request: Request, body: GateBody, scope: Writer) -> GateDecisionOut:
    _, registry = _stores(request)
    return GateDecisionOut.of(
        await _run(
            lambda: registry.run_gate(
                scope,
                body.modelId,
                body.version,
                body.policies,
                candidate_evaluation=body.candidateEvaluation,
                baseline_alias=body.baselineAlias,
                baseline_evaluation=body.baselineEvaluation,
            )
        )
    )


@router.get(
    "/models/{model_id}/gates",
    summary="A model's gate decisions, newest first",
    response_model=GateDecisionListOut,
    response_model_exclude_unset=True,
)
async def list_decisions(
    request: Request,
    model_id: str,
    scope: Reader,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> GateDecisionListOut:
    _, registry = _stores(request)
    rows = await _run(lambda: registry.decisions(scope, model_id, limit))
    return GateDecisionListOut(model_id=model_id, decisions=[GateDecisionOut.of(d) for d in rows])


@router.get(
    "/gates/{decision_id}",
    summary="A gate decision record",
    response_model=GateDecisionOut,
    response_model_exclude_unset=True,
)
async def get_decision(request: Request, decision_id: str, scope: Reader) -> GateDecisionOut:
    _, registry = _stores(request)
    return GateDecisionOut.of(await _run(lambda: registry.decision(scope, decision_id)))


@router.get(
    "/models/{model_id}/aliases",
    summary="A model's aliases and every move of them",
    response_model=AliasesOut,
)
async def aliases(request: Request, model_id: str, scope: Reader) -> AliasesOut:
    _, registry = _stores(request)

    def work() -> AliasesOut:
        return AliasesOut(
            model_id=model_id,
            aliases=registry.aliases(scope, model_id),
            history=[AliasMoveOut.of(m) for m in registry.history(scope, model_id)],
        )

    out: AliasesOut = await _run(work)
    return out


class AliasBody(BaseModel):
    model_config = STRICT

    version: str = Field(min_length=1)
    decisionId: str = ""
    overrideReason: str = Field("", description="admin only: move a guarded alias without a gate")


@router.post(
    "/models/{model_id}/aliases/{alias}",
    response_model=AliasSetOut,
    summary="Move an alias (canary and production need a passing gate)",
    responses=_CONFLICT,
)
async def set_alias(
    request: Request, model_id: str, alias: str, body: AliasBody, scope: Writer
) -> AliasSetOut:
    evals, registry = _stores(request)

    def work() -> AliasSetOut:
        out = registry.set_alias(
            scope,
            model_id,
            alias,
            body.version,
            decision_id=body.decisionId,
            override_reason=body.overrideReason,
        )
        triggered = evals.fire(
            scope.tenant,
            out.project,
            "alias",
            model_id=model_id,
            version=body.version,
            alias=alias,
            run_id=out.run_id,
            checkpoint_id=out.checkpoint_id,
        )
        return AliasSetOut.of(out, triggered)

    result: AliasSetOut = await _run(work)
    return result
