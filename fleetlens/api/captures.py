"""Triggered trace captures (:mod:`fleetlens.services.captures`): ask one, list a run's, and
the route each rank's torch integration uploads its trace file to."""

from __future__ import annotations

import time
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Path, Request, Response

from ..services.captures import Captures
from ..store.scope import Scope
from ..traces.importer import RankTrace
from .auth import ERROR_RESPONSES, require, require_any
from .bodies import drain
from .capture_models import CaptureIn, CaptureOut, CapturesOut
from .ingest import error_response
from .leader import forward_to_leader
from .trace_files import FILE_REFUSED, GZIP_UPLOAD, Rank, keep_file, refused_early

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["traces"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]
Writer = Annotated[Scope, Depends(require("write"))]
Uploader = Annotated[Scope, Depends(require_any("write", "ingest"))]
Id = Annotated[int, Path(ge=1, le=2**62)]


def _captures(request: Request) -> Captures:
    caps = request.app.state.services.monitor.captures
    if caps is None:
        raise HTTPException(503, "trace capture is not running on this server")
    return caps  # type: ignore[no-any-return]


@router.post(
    "/runs/{run_id}/traces/captures",
    summary="Ask a running job for a short profiler trace of some ranks",
    description="The ranks profile `steps` steps (after one warm-up step) once their next "
    "control poll hears of it; only ranks that offer capture do (`fleetlens.torch` with "
    "`FLEETLENS_TRACE_CAPTURE=1`). One open capture a run at a time (409 otherwise).",
    status_code=201,
    response_model=CaptureOut,
    responses={
        400: {"description": "The same rank named twice"},
        409: {"description": "The run has a capture still waiting for traces"},
        503: {"description": "No leader is reachable right now (several servers); retry"},
    },
)
async def post_capture(
    request: Request, run_id: str, body: CaptureIn, scope: Writer
) -> CaptureOut | Response:
    # the leader holds the ranks' polls (their pace sets the start step): it takes the request
    if (forwarded := await forward_to_leader(request)) is not None:
        return forwarded
    svc = request.app.state.services
    caps = _captures(request)

    def work() -> CaptureOut:
        svc.metadata.get_run(scope, run_id)
        return CaptureOut.of(caps.request(scope, run_id, body.ranks, body.steps, time.time()))

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/runs/{run_id}/traces/captures",
    summary="A run's triggered and requested profiler captures, newest first",
    response_model=CapturesOut,
)
async def get_captures(request: Request, run_id: str, scope: Reader) -> CapturesOut:
    svc = request.app.state.services
    caps = _captures(request)

    def work() -> CapturesOut:
        svc.metadata.get_run(scope, run_id)
        return CapturesOut(
            run_id=run_id, captures=[CaptureOut.of(c) for c in caps.of_run(scope, run_id)]
        )

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/runs/{run_id}/traces/captures/{capture_id}",
    summary="One capture: its state and each rank's breakdown once in",
    response_model=CaptureOut,
)
async def get_capture(request: Request, run_id: str, capture_id: Id, scope: Reader) -> CaptureOut:
    svc = request.app.state.services
    caps = _captures(request)

    def work() -> CaptureOut:
        svc.metadata.get_run(scope, run_id)
        return CaptureOut.of(caps.store.get(scope, run_id, capture_id))

    return await anyio.to_thread.run_sync(work)


@router.put(
    "/runs/{run_id}/traces/captures/{capture_id}/{rank}",
    summary="A rank's trace file of a capture (gzip-compressed Kineto JSON)",
    description="What the torch integration uploads once it has profiled the capture's steps. "
    "Kept for Perfetto as the rank's trace file (`/v1/runs/{run_id}/traces/files/{rank}`), "
    "its steps imported as the run's trace rows, its breakdown kept on the capture.",
    status_code=201,
    response_model=CaptureOut,
    openapi_extra=GZIP_UPLOAD,
    responses={
        400: {"description": "Not a trace with profiled steps; nothing kept"},
        404: {"description": "No such run or capture"},
        409: {"description": "The capture did not ask this rank"},
        **FILE_REFUSED,
        413: {
            "description": "Over `collector.max_trace_file_bytes`, or over 1 GiB "
            "decompressed; nothing kept"
        },
    },
)
async def put_capture_trace(
    request: Request, run_id: str, capture_id: Id, rank: Rank, scope: Uploader
) -> Any:
    svc = request.app.state.services
    caps = _captures(request)
    early = await refused_early(request)
    if early is not None:
        return early
    # 404 (no such run, not the caller's project's, no such capture) and 409 (a rank it did
    # not ask) before a byte is kept
    await anyio.to_thread.run_sync(svc.metadata.get_run, scope, run_id)
    c = await anyio.to_thread.run_sync(caps.store.get, scope, run_id, capture_id)
    if rank not in c.ranks:
        await drain(request)
        return error_response(409, f"capture {capture_id} did not ask rank {rank}", None)
    parsed: list[RankTrace] = []
    kept = await keep_file(
        request, scope, run_id, rank, lambda path: parsed.append(caps.parse(path, rank))
    )
    if not isinstance(kept, int):
        return kept

    def ingest(body: bytes) -> Any:
        return svc.ingestor.ingest(body, "application/msgpack", "gzip", scope.tenant, scope.project)

    got = await anyio.to_thread.run_sync(
        lambda: caps.receive(scope, run_id, capture_id, parsed[0], ingest)
    )
    return CaptureOut.of(got)
