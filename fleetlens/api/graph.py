"""The run graph API: lineage both ways, run comparison, checkpoints, model versions,
datasets and artifacts. Every store call takes the caller's Scope.

Include this router before the runs router: ``/v1/runs/compare`` must not be read as the run
named ``compare``.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..analysis.flops import accelerator
from ..collector.rows import nesting_problem
from ..errors import ConfigError, StoreError
from ..services.compare import CompareQueries, compare_runs
from ..store.graph import ARTIFACT_KINDS, GraphStore
from ..store.graph_files import server_read_refusal
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, UNKNOWN_NAME_RESPONSE, require
from .evaluations import eval_stores
from .graph_models import (
    ArtifactListOut,
    ArtifactOut,
    CheckpointListOut,
    CheckpointRecordedOut,
    CompareOut,
    DatasetOut,
    DrilldownOut,
    InfrastructureOut,
    ModelLineageOut,
    ModelListOut,
    ModelRegisteredOut,
    RunGraphOut,
    RunLineageOut,
)

__all__ = ["router"]

# Request bodies take JSON as it is: no 0 for false, no false for 0, no "1" for 1.
STRICT = ConfigDict(strict=True)

router = APIRouter(prefix="/v1", tags=["run graph"], responses=ERROR_RESPONSES)

Reader = Annotated[Scope, Depends(require("read"))]
Writer = Annotated[Scope, Depends(require("write"))]


def _svc(request: Request) -> Any:
    return request.app.state.services


async def _run(fn: Any) -> Any:
    return await anyio.to_thread.run_sync(fn)  # ConfigError -> 400 by the app's error table


# Object stores the server may read with its own credentials. Anything else is refused: http(s)
# would let a caller make the server fetch internal addresses, ``memory:`` reads the process,
# and fsspec's chained URLs (``simplecache::file:///...``) wrap a local path in a remote scheme.
CHECKSUM_TIMEOUT_S = 120.0
# Checksums run on their own threads, so slow objects cannot take the threads every request's
# authentication needs; one waiting past the timeout for a thread answers 503 with Retry-After.
CHECKSUM_THREADS = 4


async def _checksum_run(request: Request, fn: Any) -> Any:
    """Run ``fn`` (which reads files to checksum them) on the checksum threads, in bounded time."""
    state = request.app.state
    limiter = getattr(state, "checksum_threads", None)
    if limiter is None:
        limiter = state.checksum_threads = anyio.CapacityLimiter(CHECKSUM_THREADS)
    try:
        with anyio.fail_after(CHECKSUM_TIMEOUT_S):
            return await anyio.to_thread.run_sync(fn, limiter=limiter, abandon_on_cancel=True)
    except TimeoutError:
        raise StoreError(
            f"checksumming took over {CHECKSUM_TIMEOUT_S:.0f} s or waited too long for a "
            "checksum thread; retry later, or send the sha256"
        ) from None


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
async def run_lineage(request: Request, run_id: str, scope: Reader) -> dict[str, Any]:
    svc = _svc(request)

    def work() -> dict[str, Any]:
        out = GraphStore(svc.metadata).run_lineage(scope, run_id)
        infra = CompareQueries(svc.telemetry, scope).infrastructure(run_id)
        return {**out, "infrastructure": InfrastructureOut.of(infra)}

    return dict(await _run(work))


@router.get(
    "/lineage/models/{model_id}/{version}",
    summary="Model version -> evaluation -> checkpoint -> step -> run -> config, dataset, code",
    response_model=ModelLineageOut,
    response_model_exclude_unset=True,
)
async def model_lineage(
    request: Request, model_id: str, version: str, scope: Reader, verify: bool = False
) -> dict[str, Any]:
    svc = _svc(request)

    def work() -> dict[str, Any]:
        g = GraphStore(svc.metadata)
        out = g.model_lineage(scope, model_id, version)
        if verify:
            roots = svc.config.readable_roots
            uris = [out["checkpoint"].get("uri") or ""] + [
                str(s.get("uri", "")) for s in (out["run"].get("dataset") or {}).get("shards", [])
            ]
            refused = [r for u in uris if u and (r := server_read_refusal(u, roots))]
            if not refused:
                out = g.model_lineage(scope, model_id, version, verify=True)
            else:
                out["verification"] = {
                    "ok": None,
                    "reason": f"{refused[0]}; verify local files with "
                    "`fleetlens lineage model --verify`",
                }
        return out

    return dict(await (_checksum_run(request, work) if verify else _run(work)))


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
) -> dict[str, Any]:
    svc = _svc(request)

    def work() -> dict[str, Any]:
        g = GraphStore(svc.metadata)
        cur = g.model_lineage(scope, model_id, version)
        if not baseline:
            raise ConfigError("name the baseline version: ?baseline=VERSION")
        base = g.model_lineage(scope, model_id, baseline)
        runs = [base["run"]["runId"], cur["run"]["runId"]]
        path = [
            f"model {model_id}:{version}",
            *([f"evaluation {cur['evaluation']['evaluationId']}"] if cur["evaluation"] else []),
            f"checkpoint {cur['checkpoint']['checkpointId']} (step {cur['step']})",
            f"run {runs[1]}",
            f"diff vs run {runs[0]} (model {model_id}:{baseline})",
        ]
        metrics = {
            k: {"baseline": base["model"]["metrics"].get(k), "version": v}
            for k, v in cur["model"]["metrics"].items()
        }
        out: dict[str, Any] = {"path": path, "metrics": metrics, "model": cur, "baseline": base}
        if runs[0] == runs[1]:
            out["comparison"] = None
            out["conclusion"] = "both versions come from the same run; compare their steps"
            return out
        cmp = compare_runs(svc.telemetry, svc.metadata, scope, runs)
        out["comparison"] = CompareOut.of(cmp)
        c = cmp.conclusions[0]
        out["conclusion"] = (
            "possible systems issue: infrastructure metrics changed"
            if c["infrastructureChanged"]
            else "likely training/config issue: infrastructure metrics are normal"
            if c["configurationChanged"]
            else "no infrastructure or configuration change found"
        )
        return out

    return dict(await _run(work))


# -- registration ---------------------------------------------------------------------------


class DescribeBody(BaseModel):
    model_config = STRICT

    config: dict[str, Any] | None = None
    code: dict[str, Any] | str | None = Field(None, description="commit, or {repo, commit, dirty}")
    dataset: dict[str, Any] | str | None = Field(None, description="'name:version' or an object")
    launchCommand: str | None = None
    environment: dict[str, Any] | None = None
    experimentId: str | None = None

    @field_validator("config", "code", "dataset", "environment")
    @classmethod
    def _nesting(cls, v: Any) -> Any:
        if (problem := nesting_problem(v)) is not None:
            raise ValueError(problem)
        return v


@router.post(
    "/runs/{run_id}/describe",
    summary="Record a run's config, code, dataset, command",
    response_model=RunGraphOut,
    response_model_exclude_unset=True,
    responses=UNKNOWN_NAME_RESPONSE,
)
async def describe_run(
    request: Request, run_id: str, body: DescribeBody, scope: Writer
) -> dict[str, Any]:
    svc = _svc(request)
    config = body.config
    if config is not None and config.get("accelerator") is not None:
        # Stored under the table's name ("h100" -> H100-SXM), so MFU and the workload baselines
        # see one name; an unknown one is a 422 listing the known names.
        config = {**config, "accelerator": accelerator(str(config["accelerator"])).name}
    return dict(
        await _run(
            lambda: GraphStore(svc.metadata).describe_run(
                scope,
                run_id,
                config=config,
                code=body.code,
                dataset=body.dataset,
                launch_command=body.launchCommand,
                environment=body.environment,
                experiment_id=body.experimentId,
            )
        )
    )


class CheckpointBody(BaseModel):
    model_config = STRICT

    step: int = Field(ge=0, le=2**62, strict=True)
    uri: str = ""
    checkpointId: str = ""
    jobId: str = ""
    sizeBytes: int | None = Field(None, ge=0, le=2**62, strict=True)
    checksum: str = Field("", description="sha256:<hex>")
    durationSeconds: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False, strict=True)
    sync: bool = True
    ok: bool = True
    time: float | None = Field(None, ge=0, le=1e12, allow_inf_nan=False, strict=True)


@router.get(
    "/runs/{run_id}/checkpoints", summary="A run's checkpoints", response_model=CheckpointListOut
)
async def list_checkpoints(request: Request, run_id: str, scope: Reader) -> dict[str, Any]:
    svc = _svc(request)
    rows = await _run(lambda: GraphStore(svc.metadata).checkpoints(scope, run_id))
    return {"runId": run_id, "checkpoints": rows}


@router.post(
    "/runs/{run_id}/checkpoints",
    summary="Record a checkpoint the SDK did not see",
    response_model=CheckpointRecordedOut,
    response_model_exclude_unset=True,
)
async def add_checkpoint(
    request: Request, run_id: str, body: CheckpointBody, scope: Writer
) -> dict[str, Any]:
    svc = _svc(request)
    evals, _ = eval_stores(request.app.state)

    def work() -> dict[str, Any]:
        out = GraphStore(svc.metadata).record_checkpoint(
            scope,
            run_id,
            body.step,
            uri=body.uri,
            job_id=body.jobId,
            size_bytes=body.sizeBytes,
            checksum=body.checksum,
            duration_s=body.durationSeconds,
            sync=body.sync,
            ok=body.ok,
            at=body.time,
            checkpoint_id=body.checkpointId,
        )
        if out["checksum"] and out["ok"]:  # verified: its content hash is known
            project = svc.metadata.get_run(scope, run_id).project
            out["triggered"] = evals.fire(
                scope.tenant,
                project,
                "checkpoint",
                run_id=run_id,
                checkpoint_id=out["checkpointId"],
                checkpoint_uri=out["uri"],
            )
        return out

    return dict(await _run(work))


class ArtifactBody(BaseModel):
    model_config = STRICT

    name: str = Field(min_length=1)
    uri: str = Field(min_length=1)
    kind: str = Field("other", description=", ".join(ARTIFACT_KINDS))
    sha256: str = ""


@router.get(
    "/runs/{run_id}/artifacts",
    summary="A run's artifacts (pointers and checksums)",
    response_model=ArtifactListOut,
)
async def list_artifacts(request: Request, run_id: str, scope: Reader) -> dict[str, Any]:
    svc = _svc(request)
    rows = await _run(lambda: GraphStore(svc.metadata).artifacts(scope, run_id))
    return {"runId": run_id, "artifacts": rows}


@router.post(
    "/runs/{run_id}/artifacts", summary="Register an artifact of a run", response_model=ArtifactOut
)
async def add_artifact(
    request: Request, run_id: str, body: ArtifactBody, scope: Writer
) -> dict[str, Any]:
    svc = _svc(request)
    refused = None if body.sha256 else server_read_refusal(body.uri, svc.config.readable_roots)
    if refused:
        raise HTTPException(400, f"send the artifact's sha256: {refused}")
    return dict(
        await _checksum_run(
            request,
            lambda: GraphStore(svc.metadata).register_artifact(
                scope,
                run_id,
                body.name,
                body.uri,
                kind=body.kind,
                sha256=body.sha256,
                compute_checksum=not body.sha256,
            ),
        )
    )


class ModelBody(BaseModel):
    model_config = STRICT

    modelId: str = Field(min_length=1)
    version: str = Field(min_length=1)
    runId: str = Field(min_length=1)
    checkpointId: str = ""
    step: int | None = Field(None, ge=0, le=2**62, strict=True)
    evaluationId: str | None = None
    metrics: dict[str, Annotated[float, Field(strict=True)]] | None = None


@router.get("/models", summary="Registered model versions", response_model=ModelListOut)
async def list_models(
    request: Request, scope: Reader, model_id: Annotated[str | None, Query(alias="modelId")] = None
) -> dict[str, Any]:
    svc = _svc(request)
    rows = await _run(lambda: GraphStore(svc.metadata).model_versions(scope, model_id))
    return {"models": rows}


@router.post(
    "/models",
    summary="Register a model version from a checkpoint",
    status_code=201,
    response_model=ModelRegisteredOut,
)
async def register_model(request: Request, body: ModelBody, scope: Writer) -> dict[str, Any]:
    svc = _svc(request)
    evals, _ = eval_stores(request.app.state)

    def work() -> dict[str, Any]:
        out = GraphStore(svc.metadata).register_model_version(
            scope,
            body.modelId,
            body.version,
            body.runId,
            checkpoint_id=body.checkpointId,
            step=body.step,
            evaluation_id=body.evaluationId,
            metrics=body.metrics,
        )
        svc.access.audit(
            scope.tenant,
            scope.actor,
            "model.register",
            f"model:{body.modelId}:{body.version}",
            {"runId": body.runId, "checkpointId": out["checkpointId"]},
            scope.remote,
        )
        graph = GraphStore(svc.metadata)
        ck = next(
            (
                c
                for c in graph.checkpoints(scope, body.runId)
                if c["checkpointId"] == out["checkpointId"]
            ),
            {},
        )
        out["triggered"] = evals.fire(
            scope.tenant,
            svc.metadata.get_run(scope, body.runId).project,
            "model",
            model_id=body.modelId,
            version=body.version,
            run_id=body.runId,
            checkpoint_id=out["checkpointId"],
            checkpoint_uri=str(ck.get("uri", "")),
        )
        return out

    return dict(await _run(work))


class DatasetBody(BaseModel):
    model_config = STRICT

    name: str = Field(min_length=1)
    version: str = ""
    contentHash: str = ""
    uri: str = ""
    shards: list[dict[str, Any]] = Field(default_factory=list, description="[{uri, sha256}]")


@router.post(
    "/datasets",
    summary="Register a dataset version (content-addressed)",
    status_code=201,
    response_model=DatasetOut,
)
async def register_dataset(request: Request, body: DatasetBody, scope: Writer) -> dict[str, Any]:
    svc = _svc(request)
    return dict(
        await _run(
            lambda: GraphStore(svc.metadata).register_dataset(
                scope,
                body.name,
                body.version,
                content_hash=body.contentHash,
                uri=body.uri,
                shards=body.shards,
            )
        )
    )


@router.get(
    "/datasets/{name}/{version}",
    summary="A dataset version and its shards",
    response_model=DatasetOut,
)
async def get_dataset(request: Request, name: str, version: str, scope: Reader) -> dict[str, Any]:
    svc = _svc(request)
    return dict(await _run(lambda: GraphStore(svc.metadata).dataset(scope, name, version)))
