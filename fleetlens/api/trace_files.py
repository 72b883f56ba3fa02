"""A run's profiler trace files: kept when ``fleetlens traces import --upload-files`` sends them,
served back for the portal's "Open in Perfetto" (:mod:`fleetlens.traces.files`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path as FilePath
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import FileResponse, Response

from ..store.scope import Scope
from ..traces.files import TraceFileRefused, TraceFiles
from .auth import ERROR_RESPONSES, require_any
from .bodies import BodyRefused, drain, timed_chunks
from .body_limit import OWN_BODY
from .ingest import error_response
from .ops_models import TraceFileOut

__all__ = ["FILE_REFUSED", "GZIP_UPLOAD", "Rank", "keep_file", "refused_early", "router"]

router = APIRouter(prefix="/v1", tags=["traces"], responses=ERROR_RESPONSES)

Rank = Annotated[int, Path(ge=0, le=2**31 - 1)]

GZIP_UPLOAD: dict[str, Any] = {
    OWN_BODY: True,
    "requestBody": {
        "required": True,
        "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
    },
}
"""The OpenAPI of a route whose body is a gzip-compressed trace file, read by the route."""
FILE_REFUSED: dict[int | str, dict[str, Any]] = {
    408: {"description": "The file did not arrive in time; nothing kept"},
    413: {"description": "Over `collector.max_trace_file_bytes`; nothing kept"},
    415: {"description": "Not gzip-compressed; nothing kept"},
    503: {"description": "The data directory is below its free-space floor; retry later"},
}
"""What :func:`refused_early` and :func:`keep_file` answer, nothing kept."""


@router.put(
    "/runs/{run_id}/traces/files/{rank}",
    summary="Keep a rank's profiler trace file (gzip-compressed Kineto JSON) for Perfetto",
    description="The file as the profiler wrote it (`*.json.gz`; `fleetlens traces import "
    "--upload-files` sends it after the rank's tables), streamed to disk under the data "
    "directory and replaced whole: a reader gets the previous file or the new one. At most "
    "`collector.max_trace_file_bytes`.",
    status_code=201,
    response_model=TraceFileOut,
    openapi_extra=GZIP_UPLOAD,
    responses={400: {"description": "An empty file; nothing kept"}, **FILE_REFUSED},
)
async def put_trace_file(
    request: Request,
    run_id: str,
    rank: Rank,
    scope: Annotated[Scope, Depends(require_any("write", "ingest"))],
) -> Any:
    early = await refused_early(request)
    if early is not None:
        return early
    svc = request.app.state.services
    await anyio.to_thread.run_sync(svc.metadata.get_run, scope, run_id)  # 404 before a byte
    size = await keep_file(request, scope, run_id, rank)
    if not isinstance(size, int):
        return size
    return {"runId": run_id, "rank": rank, "bytes": size}


async def refused_early(request: Request) -> Response | None:
    """A trace file refused before a byte is read: the data directory is below its free-space
    floor (503), or the declared size is over ``collector.max_trace_file_bytes`` (413)."""
    svc = request.app.state.services
    space = svc.ingestor.space
    if space is not None and space.full():
        await drain(request)
        refusal = space.refusal()
        return error_response(503, str(refusal), retry_after=refusal.retry_after)
    limit = svc.config.collector.max_trace_file_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        await drain(request)
        return error_response(
            413,
            f"the trace file is {declared} bytes; the limit is {limit} "
            "(collector.max_trace_file_bytes)",
            None,
        )
    return None


async def keep_file(
    request: Request,
    scope: Scope,
    run_id: str,
    rank: int,
    verify: Callable[[FilePath], Any] | None = None,
) -> int | Response:
    """Stream the body to the rank's trace file (``verify`` sees it whole before it replaces
    the previous one): its size, or the error answer with nothing kept."""
    svc = request.app.state.services
    collector = svc.config.collector
    try:
        return await TraceFiles(svc.config.data_dir).store(
            scope.tenant,
            run_id,
            rank,
            timed_chunks(request, collector.body_grace_s),
            collector.max_trace_file_bytes,
            verify,
        )
    except TraceFileRefused as refused:
        await drain(request)
        return error_response(refused.status, str(refused), None)
    except BodyRefused as refused:  # too slow (408), or the client went away
        return error_response(refused.status, refused.message, None, refused.retry_after)


@router.get(
    "/runs/{run_id}/traces/files/{rank}",
    summary="A rank's kept profiler trace file (gzip-compressed Kineto JSON)",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/gzip": {}}, "description": "The file as it was sent"},
        404: {"description": "No such run, or no file kept for this rank"},
    },
)
async def get_trace_file(
    request: Request,
    run_id: str,
    rank: Rank,
    scope: Annotated[Scope, Depends(require_any("read"))],
) -> Any:
    svc = request.app.state.services
    await anyio.to_thread.run_sync(svc.metadata.get_run, scope, run_id)
    path = TraceFiles(svc.config.data_dir).path(scope.tenant, run_id, rank)
    if not path.is_file():
        return error_response(
            404,
            f"run {run_id} keeps no trace file of rank {rank} (fleetlens traces import "
            f"PATH --run {run_id} --upload-files)",
            None,
        )
    return FileResponse(
        path, media_type="application/gzip", filename=f"{run_id}-rank{rank}.json.gz"
    )
