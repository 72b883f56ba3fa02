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
from .evaluation_requests import (
    AliasBody,
    CompleteBody,
    EvaluationBody,
    FailBody,
    GateBody,
    HeartbeatBody,
    LeaseBody,
    SuiteBody,
    TriggerBody,
)
from .gate_models import (
    AliasesOut,
    AliasMoveOut,
    AliasSetOut,
    GateDecisionListOut,
    GateDecisionOut,
)

__all__ = ["eval_stores", "router"]

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


@router.post(
    "/evaluations",
    response_model=EvaluationOut,
    response_model_exclude_unset=True,
    summary="Queue an evaluation of a model version or checkpoint on a suite",
    status_code=202,
)
async def submit(request: Request, body: EvaluationBody, scope: Writer) -> EvaluationOut:
    evals, _ = _stores(request)
    return EvaluationOut.of(await _run(lambda: evals.submit(scope, body.request())))


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
    spec = body.spec()
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


@router.post(
    "/evaluation-triggers",
    response_model=TriggerOut,
    summary="A policy: evaluate new model versions or verified checkpoints on a suite",
    status_code=201,
)
async def add_trigger(request: Request, body: TriggerBody, scope: Writer) -> TriggerOut:
    evals, _ = _stores(request)
    return TriggerOut.of(await _run(lambda: evals.suites.add_trigger(scope, body.request())))


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


@router.post(
    "/eval-shards/lease",
    response_model=LeaseOut,
    summary="Lease the next shard (204: nothing to do)",
    responses={204: {"description": "No shard is runnable now"}},
)
async def lease(request: Request, body: LeaseBody, scope: Writer) -> Any:
    evals, _ = _stores(request)
    out = await _run(lambda: evals.lease(scope, body.worker_id, body.prefer_locality, body.lease_s))
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
            lambda: evals.heartbeat(scope, shard_id, body.lease_token, body.lease_s, body.partial)
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
        await _run(lambda: evals.complete(scope, shard_id, body.lease_token, body.scores))
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
        await _run(lambda: evals.fail(scope, shard_id, body.lease_token, body.error))
    )


# -- gates and promotion --------------------------------------------------------------------


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
                body.model_id,
                body.version,
                body.policies,
                candidate_evaluation=body.candidate_evaluation,
                baseline_alias=body.baseline_alias,
                baseline_evaluation=body.baseline_evaluation,
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
            decision_id=body.decision_id,
            override_reason=body.override_reason,
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
