"""The run graph's registrations: what a run was made of, its checkpoints and artifacts, model
versions and datasets (:mod:`fleetlens.api.graph` includes this router). Every store call takes
the caller's Scope; a file the server checksums is read on the checksum threads, in bounded
time.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..analysis.flops import accelerator
from ..collector.rows import nesting_problem
from ..errors import StoreError
from ..store.graph import ARTIFACT_KINDS, GraphStore
from ..store.graph_files import server_read_refusal
from ..store.scope import Scope
from .auth import UNKNOWN_NAME_RESPONSE, require
from .evaluations import eval_stores
from .graph_models import (
    ArtifactListOut,
    ArtifactOut,
    CheckpointListOut,
    CheckpointOut,
    CheckpointRecordedOut,
    DatasetOut,
    ModelListOut,
    ModelRegisteredOut,
    ModelVersionOut,
    RunGraphOut,
)

__all__ = ["CHECKSUM_THREADS", "CHECKSUM_TIMEOUT_S", "checksum_run", "router", "run"]

# Request bodies take JSON as it is: no 0 for false, no false for 0, no "1" for 1.
STRICT = ConfigDict(strict=True)

# Without a prefix: :mod:`fleetlens.api.graph`'s router includes it under its own (/v1).
router = APIRouter()

Reader = Annotated[Scope, Depends(require("read"))]
Writer = Annotated[Scope, Depends(require("write"))]


def _svc(request: Request) -> Any:
    return request.app.state.services


async def run(fn: Any) -> Any:
    return await anyio.to_thread.run_sync(fn)  # ConfigError -> 400 by the app's error table


# Object stores the server may read with its own credentials. Anything else is refused: http(s)
# would let a caller make the server fetch internal addresses, ``memory:`` reads the process,
# and fsspec's chained URLs (``simplecache::file:///...``) wrap a local path in a remote scheme.
CHECKSUM_TIMEOUT_S = 120.0
# Checksums run on their own threads, so slow objects cannot take the threads every request's
# authentication needs; one waiting past the timeout for a thread answers 503 with Retry-After.
CHECKSUM_THREADS = 4


async def checksum_run(request: Request, fn: Any) -> Any:
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
) -> RunGraphOut:
    svc = _svc(request)
    config = body.config
    if config is not None and config.get("accelerator") is not None:
        # Stored under the table's name ("h100" -> H100-SXM), so MFU and the workload baselines
        # see one name; an unknown one is a 422 listing the known names.
        config = {**config, "accelerator": accelerator(str(config["accelerator"])).name}
    return RunGraphOut.of(
        await run(
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
async def list_checkpoints(request: Request, run_id: str, scope: Reader) -> CheckpointListOut:
    svc = _svc(request)
    rows = await run(lambda: GraphStore(svc.metadata).checkpoints(scope, run_id))
    return CheckpointListOut(run_id=run_id, checkpoints=[CheckpointOut.of(c) for c in rows])


@router.post(
    "/runs/{run_id}/checkpoints",
    summary="Record a checkpoint the SDK did not see",
    response_model=CheckpointRecordedOut,
    response_model_exclude_unset=True,
)
async def add_checkpoint(
    request: Request, run_id: str, body: CheckpointBody, scope: Writer
) -> CheckpointRecordedOut:
    svc = _svc(request)
    evals, _ = eval_stores(request.app.state)

    def work() -> CheckpointRecordedOut:
        ck = GraphStore(svc.metadata).record_checkpoint(
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
        if not (ck.checksum and ck.ok):
            return CheckpointRecordedOut.recorded(ck)
        # verified: its content hash is known
        project = svc.metadata.get_run(scope, run_id).project
        triggered = evals.fire(
            scope.tenant,
            project,
            "checkpoint",
            run_id=run_id,
            checkpoint_id=ck.checkpoint_id,
            checkpoint_uri=ck.uri,
        )
        return CheckpointRecordedOut.recorded(ck, triggered)

    out: CheckpointRecordedOut = await run(work)
    return out


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
async def list_artifacts(request: Request, run_id: str, scope: Reader) -> ArtifactListOut:
    svc = _svc(request)
    rows = await run(lambda: GraphStore(svc.metadata).artifacts(scope, run_id))
    return ArtifactListOut(run_id=run_id, artifacts=[ArtifactOut.of(a) for a in rows])


@router.post(
    "/runs/{run_id}/artifacts", summary="Register an artifact of a run", response_model=ArtifactOut
)
async def add_artifact(
    request: Request, run_id: str, body: ArtifactBody, scope: Writer
) -> ArtifactOut:
    svc = _svc(request)
    refused = None if body.sha256 else server_read_refusal(body.uri, svc.config.readable_roots)
    if refused:
        raise HTTPException(400, f"send the artifact's sha256: {refused}")
    return ArtifactOut.of(
        await checksum_run(
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
) -> ModelListOut:
    svc = _svc(request)
    rows = await run(lambda: GraphStore(svc.metadata).model_versions(scope, model_id))
    return ModelListOut(models=[ModelVersionOut.of(m) for m in rows])


@router.post(
    "/models",
    summary="Register a model version from a checkpoint",
    status_code=201,
    response_model=ModelRegisteredOut,
)
async def register_model(request: Request, body: ModelBody, scope: Writer) -> ModelRegisteredOut:
    svc = _svc(request)
    evals, _ = eval_stores(request.app.state)

    def work() -> ModelRegisteredOut:
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
            {"runId": body.runId, "checkpointId": out.checkpoint_id},
            scope.remote,
        )
        graph = GraphStore(svc.metadata)
        ck = next(
            (
                c
                for c in graph.checkpoints(scope, body.runId)
                if c.checkpoint_id == out.checkpoint_id
            ),
            None,
        )
        triggered = evals.fire(
            scope.tenant,
            svc.metadata.get_run(scope, body.runId).project,
            "model",
            model_id=body.modelId,
            version=body.version,
            run_id=body.runId,
            checkpoint_id=out.checkpoint_id,
            checkpoint_uri=ck.uri if ck is not None else "",
        )
        return ModelRegisteredOut.registered(out, triggered)

    registered: ModelRegisteredOut = await run(work)
    return registered


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
async def register_dataset(request: Request, body: DatasetBody, scope: Writer) -> DatasetOut:
    svc = _svc(request)
    return DatasetOut.of(
        await run(
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
async def get_dataset(request: Request, name: str, version: str, scope: Reader) -> DatasetOut:
    svc = _svc(request)
    return DatasetOut.of(await run(lambda: GraphStore(svc.metadata).dataset(scope, name, version)))
