"""``POST /v1/runs/{run_id}/flight-recorder``: a job's PyTorch Flight Recorder dumps, as written.

The body is JSON: ``{"jobId": "j1", "files": [{"name": "nccl_trace_rank_12", "data": BASE64}]}``
(``rank`` beside ``name`` when the file name does not end in the rank). ``data`` is the file
exactly as PyTorch wrote it: a pickle (read with an unpickler that refuses every global) or
JSON. The body is bounded (:data:`MAX_BODY_BYTES`, :data:`MAX_FILES`); a bad file is a 400 that
names it, and nothing is stored unless every file was read.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

import anyio
import msgspec
from fastapi import APIRouter, Depends, Request

from ..errors import BatchTooLarge, TraceFormatError
from ..services.flight_recorder import DumpFile, import_flight_recorder
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require_any
from .bodies import BodyBudget, read_upload
from .body_limit import OWN_BODY
from .ops_models import FlightRecorderImportOut

__all__ = ["MAX_BODY_BYTES", "MAX_FILES", "UPLOAD_COMPONENTS", "router"]

router = APIRouter(prefix="/v1", tags=["findings"], responses=ERROR_RESPONSES)

MAX_BODY_BYTES = 256 << 20
"""The largest upload: a dump is ~1-2 MB per rank with the default 2,000-entry buffer."""
MAX_FILES = 8192
"""The most dumps in one upload (one per rank)."""


class FlightRecorderFile(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    data: str  # base64 of the file's bytes
    rank: int | None = None


class FlightRecorderUpload(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    files: list[FlightRecorderFile] = []
    job_id: str | None = None


(_SCHEMA,), UPLOAD_COMPONENTS = msgspec.json.schema_components(
    [FlightRecorderUpload], ref_template="#/components/schemas/{name}"
)  # the components go into the OpenAPI document's (fleetlens/api/app.py)


def _files(body: bytes) -> tuple[list[DumpFile], str | None]:
    try:
        up = msgspec.json.decode(body, type=FlightRecorderUpload)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"body: {exc}") from exc
    if len(up.files) > MAX_FILES:
        raise BatchTooLarge(f"{len(up.files)} files; the limit is {MAX_FILES} per request")
    out = []
    for f in up.files:
        try:
            data = base64.b64decode(f.data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise TraceFormatError(f"{f.name}: `data` is not base64 ({exc})") from exc
        out.append(DumpFile(f.name, data, f.rank))
    return out, up.job_id


@router.post(
    "/runs/{run_id}/flight-recorder",
    summary="Import a job's NCCL Flight Recorder dumps: stuck collectives and missing ranks",
    response_model=FlightRecorderImportOut,
    description="Each file is a dump as PyTorch wrote it (pickle or JSON), base64 in `data`; "
    "its rank is the number that ends its name, or `rank`. The answer names the stuck "
    "collectives, the ranks missing from them with their nodes and GPUs (from the job's "
    "placement), and the last collective each rank completed per process group; each stuck "
    "collective is stored as a `hang` finding of the run (`GET /v1/runs/{run_id}/diagnosis`). "
    "The dumps of a job the server has never seen make its run (world size from the dumps).",
    openapi_extra={
        OWN_BODY: True,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _SCHEMA}},
        },
    },
    responses={
        400: {"description": "A file is not a dump (the error names it); nothing stored"},
        408: {"description": "The body did not arrive in time; retry later"},
        409: {
            "description": "The dumps are of a job of another size than the run's (both named); "
            "nothing stored"
        },
        413: {"description": f"Over {MAX_BODY_BYTES} bytes or {MAX_FILES} files; nothing stored"},
        429: {"description": "The server holds as many bodies as it may; retry after Retry-After"},
    },
)
async def post_flight_recorder(
    request: Request, run_id: str, scope: Annotated[Scope, Depends(require_any("write", "ingest"))]
) -> FlightRecorderImportOut:
    svc = request.app.state.services
    body = await read_upload(request, MAX_BODY_BYTES, "send the dumps of fewer ranks per request")
    budget: BodyBudget = request.app.state.body_budget

    def work() -> FlightRecorderImportOut:
        files, job_id = _files(body)
        return FlightRecorderImportOut.of(
            import_flight_recorder(svc.telemetry, svc.metadata, scope, run_id, files, job_id)
        )

    try:
        return await anyio.to_thread.run_sync(work)
    finally:
        budget.give(len(body))
