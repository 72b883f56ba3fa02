"""The run graph API: lineage both ways and run comparison; the registrations (checkpoints,
model versions, datasets and artifacts) are :mod:`fleetlens.api.graph_registration`'s routes,
included here. Every store call takes the caller's Scope.

Include this router before the runs router: ``/v1/runs/compare`` must not be read as the run
named ``compare``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from ..errors import ConfigError
from ..services.compare import CompareQueries, compare_runs
from ..store.graph import GraphStore
from ..store.graph_files import server_read_refusal
from ..store.graph_types import DatasetInfo
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .compare_models import CompareOut
from .graph_models import DrilldownOut, MetricPairOut, ModelLineageOut, RunLineageOut
from .graph_registration import checksum_run as _checksum_run
from .graph_registration import router as registration_router
from .graph_registration import run as _run

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["run graph"], responses=ERROR_RESPONSES)

Reader = Annotated[Scope, Depends(require("read"))]


def _svc(request: Request) -> Any:
    return request.app.state.services


# -- comparison -----------------------------------------------------------------------------


@router.get(
    "/runs/compare",
    summary="Compare runs: config diff, speed, health, loss at matched steps, a conclusion",
    response_model=CompareOut,
    response_model_exclude_unset=True,
    description="Name the runs as `left` and `right`, or as `runs` (comma-separated, two or "
    "more; the first is the baseline).",
)
async def compare(
    request: Request,
    scope: Reader,
    left: str | None = None,
    right: str | None = None,
    runs: str | None = None,
) -> CompareOut:
    names = [r for r in (runs or "").split(",") if r] or [r for r in (left, right) if r]
    if len(names) < 2:
        raise HTTPException(400, "name two or more runs: ?left=A&right=B or ?runs=A,B,C")
    if len(names) > 50:
        raise HTTPException(400, f"{len(names)} runs; compare at most 50 at once")
    svc = _svc(request)
    cmp = await _run(lambda: compare_runs(svc.telemetry, svc.metadata, scope, names))
    return CompareOut.of(cmp)


# -- lineage --------------------------------------------------------------------------------


@router.get(
    "/lineage/runs/{run_id}",
    summary="Run lineage: config, code, dataset, jobs, checkpoints, models, nodes, GPUs, faults",
    response_model=RunLineageOut,
    response_model_exclude_unset=True,
)
async def run_lineage(request: Request, run_id: str, scope: Reader) -> RunLineageOut:
    svc = _svc(request)

    def work() -> RunLineageOut:
        lineage = GraphStore(svc.metadata).run_lineage(scope, run_id)
        infra = CompareQueries(svc.telemetry, scope).infrastructure(run_id)
        return RunLineageOut.with_infrastructure(lineage, infra)

    out: RunLineageOut = await _run(work)
    return out


@router.get(
    "/lineage/models/{model_id}/{version}",
    summary="Model version -> evaluation -> checkpoint -> step -> run -> config, dataset, code",
    response_model=ModelLineageOut,
    response_model_exclude_unset=True,
)
async def model_lineage(
    request: Request, model_id: str, version: str, scope: Reader, verify: bool = False
) -> ModelLineageOut:
    svc = _svc(request)

    def work() -> ModelLineageOut:
        g = GraphStore(svc.metadata)
        lineage = g.model_lineage(scope, model_id, version)
        if not verify:
            return ModelLineageOut.of(lineage)
        roots = svc.config.readable_roots
        ds = lineage.run.dataset
        shards = ds.shards if isinstance(ds, DatasetInfo) else []
        uris = [lineage.checkpoint.uri] + [str(s.get("uri", "")) for s in shards]
        refused = [r for u in uris if u and (r := server_read_refusal(u, roots))]
        if not refused:
            return ModelLineageOut.of(g.model_lineage(scope, model_id, version, verify=True))
        reason = f"{refused[0]}; verify local files with `fleetlens lineage model --verify`"
        return ModelLineageOut.of(lineage, {"ok": None, "reason": reason})

    out: ModelLineageOut = await (_checksum_run(request, work) if verify else _run(work))
    return out


@router.get(
    "/lineage/models/{model_id}/{version}/drilldown",
    summary="Why did this model version regress? Its run against the baseline version's run",
    response_model=DrilldownOut,
    response_model_exclude_unset=True,
)
async def model_drilldown(
    request: Request,
    model_id: str,
    version: str,
    scope: Reader,
    baseline: Annotated[
        str | None, Query(description="the baseline version of the same model")
    ] = None,
) -> DrilldownOut:
    svc = _svc(request)

    def work() -> DrilldownOut:
        g = GraphStore(svc.metadata)
        cur = g.model_lineage(scope, model_id, version)
        if not baseline:
            raise ConfigError("name the baseline version: ?baseline=VERSION")
        base = g.model_lineage(scope, model_id, baseline)
        runs = [base.run.run_id, cur.run.run_id]
        path = [
            f"model {model_id}:{version}",
            *([f"evaluation {cur.evaluation_id}"] if cur.evaluation_id is not None else []),
            f"checkpoint {cur.checkpoint.checkpoint_id} (step {cur.step})",
            f"run {runs[1]}",
            f"diff vs run {runs[0]} (model {model_id}:{baseline})",
        ]
        metrics = {
            k: MetricPairOut.model_validate({"baseline": base.model.metrics.get(k), "version": v})
            for k, v in cur.model.metrics.items()
        }
        if runs[0] == runs[1]:
            return DrilldownOut(
                path=path,
                metrics=metrics,
                model=ModelLineageOut.of(cur),
                baseline=ModelLineageOut.of(base),
                comparison=None,
                conclusion="both versions come from the same run; compare their steps",
            )
        cmp = compare_runs(svc.telemetry, svc.metadata, scope, runs)
        c = cmp.conclusions[0]
        return DrilldownOut(
            path=path,
            metrics=metrics,
            model=ModelLineageOut.of(cur),
            baseline=ModelLineageOut.of(base),
            comparison=CompareOut.of(cmp),
            conclusion="possible systems issue: infrastructure metrics changed"
            if c.infrastructure_changed
            else "likely training/config issue: infrastructure metrics are normal"
            if c.configuration_changed
            else "no infrastructure or configuration change found",
        )

    out: DrilldownOut = await _run(work)
    return out


router.include_router(registration_router)
