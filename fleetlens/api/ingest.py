"""``POST /v1/ingest`` (and ``/v1/ingest/batches``): the collector's front door, the busiest
route of the server.

Every rank of every job calls it once per flush, so it is served by a pure ASGI path
(:class:`IngestApp`, ahead of the framework's entry, routing and dependency solving, which cost
more than the rest of the request together); the FastAPI route of the same path stays for the
OpenAPI document and calls the same :func:`ingest_batch`. The order is the guarantee: limits and
quotas before the body is read, the body bounded while it arrives, the batch validated alone
(a bad one is refused naming its field), then stored by group commit and acknowledged once
durable, with the flush interval the server asks of its sender (:mod:`fleetlens.collector.pacing`).
``POST /v1/ingest/batches`` is the same for many batches in one request (a node relay's,
:mod:`fleetlens.agent.relay`): each validated, refused and acknowledged on its own.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import anyio
import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from ..collector.decode import decode_frames
from ..collector.ingest import Ingestor, IngestResult, Prepared
from ..errors import BatchTooLarge, FleetlensError, WireError, http_status
from ..store.scope import Scope
from ..wire import BatchFrame
from .auth import caller
from .bodies import BodyBudget, BodyRefused, drain, read_body

__all__ = [
    "IngestApp",
    "JsonAnswer",
    "error_response",
    "float_header",
    "ingest_batch",
    "ingest_batches",
]

log = logging.getLogger("fleetlens.ingest")


class JsonAnswer(Response):
    """A JSON answer of the ingest routes and of the app's errors, encoded once (msgspec) with
    its headers written out: Starlette's JSONResponse built them through a mutable mapping, on
    every one of a thousand requests a second."""

    media_type = "application/json"

    def __init__(
        self, content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None
    ) -> None:
        self.status_code = status_code
        self.background = None
        self.body = msgspec.json.encode(content)
        self.raw_headers = [
            (b"content-length", str(len(self.body)).encode("latin-1")),
            (b"content-type", b"application/json"),
        ]
        for name, value in (headers or {}).items():
            self.raw_headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))


def error_response(
    status: int,
    message: str,
    field: str | None = None,
    retry_after: int | None = None,
    headers: dict[str, str] | None = None,
) -> JsonAnswer:
    """An error answer. ``detail`` is FastAPI's key (its own 4xx use it), ``error`` the key the
    collector has always answered with; both carry the message, ``field`` the bad field."""
    hdrs = dict(headers or {})
    if retry_after is not None:
        hdrs["Retry-After"] = str(retry_after)
    body = {"detail": message, "error": message, "field": field}
    return JsonAnswer(body, status, hdrs)


def float_header(value: str | None) -> float | None:
    """A number a sender states in a header (``X-Fleetlens-Sent-At``: its UNIX time when it
    sent this attempt; ``X-Fleetlens-Flush-S``: its flush interval); None if absent or bad."""
    try:
        return float(value) if value else None
    except ValueError:
        return None


async def _receive(request: Request, scope: Scope) -> bytes | Response:
    """The body of an ingest request, or the refusal to answer instead.

    Limits and quotas come before the body is read and the body is bounded while it arrives;
    the body returned holds a slot of the ingest queue and its bytes of the memory budget, which
    the caller gives back with :func:`_release`.
    """
    svc: Any = request.app.state.services
    space = svc.ingestor.space
    if space is not None and space.full():  # nothing is tried on a full disk
        svc.batches.labels("out_of_space").inc()
        await drain(request)
        refusal = space.refusal()
        return error_response(503, str(refusal), retry_after=refusal.retry_after)
    limit = svc.config.collector.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        svc.batches.labels("too_large").inc()
        await drain(request)
        return error_response(413, f"body is {declared} bytes; the limit is {limit}", None)
    # A chunked body (no Content-Length) is charged to the rate, the memory budget and the
    # queue by what actually arrives, after it arrived (fleetlens/api/bodies.py).
    known = int(declared) if declared is not None and declared.isdigit() else None
    if scope.tenant not in svc.quotas:
        await anyio.to_thread.run_sync(svc.load_quota, scope.tenant)
    left = svc.storage_left(scope.tenant)
    if left is not None and left <= 0:
        svc.batches.labels("over_quota").inc()
        await drain(request)
        return error_response(
            403,
            f"tenant {scope.tenant!r} has used its stored-bytes quota; "
            "ask the platform operator to raise it (fleetlens tenants quota)",
        )
    wait = svc.limiter.take(scope.tenant, known or 0)
    if wait > 0:
        svc.batches.labels("over_quota").inc()
        await drain(request)
        return error_response(
            429,
            f"tenant {scope.tenant!r} is over its ingest rate; retry later",
            retry_after=max(1, math.ceil(wait)),
        )
    budget: BodyBudget = request.app.state.body_budget
    try:
        body = await read_body(request, limit, budget, svc.config.collector.body_grace_s)
    except BodyRefused as refused:
        svc.batches.labels(refused.outcome).inc()
        if refused.status != 408:  # a slow sender is not waited for twice
            await drain(request)
        refusal = error_response(refused.status, refused.message, retry_after=refused.retry_after)
        if refused.status == 408:
            refusal.headers["Connection"] = "close"
        return refusal
    nbytes = len(body)
    if known is None:
        svc.limiter.take(scope.tenant, nbytes)
    if not await svc.queue.admit(nbytes, svc.config.collector.queue_wait_s):
        budget.give(nbytes)
        svc.batches.labels("throttled").inc()
        return error_response(429, "ingest queue is full; retry later", None, retry_after=1)
    return body


async def _release(request: Request, nbytes: int) -> None:
    """Give back the queue slot and the memory :func:`_receive` took."""
    await request.app.state.services.queue.release(nbytes)
    request.app.state.body_budget.give(nbytes)


def _stored(svc: Any, tenant: str, nbytes: int, result: Any) -> dict[str, Any]:
    """Count a stored batch and say so: ``batchId``, ``rows`` per kind, and the rows refused
    alone and the clock skew when there were any."""
    svc.batches.labels("stored").inc()
    svc.ingested_bytes[tenant] = svc.ingested_bytes.get(tenant, 0) + nbytes
    for kind, n in result.rows.items():
        svc.rows.labels(kind).inc(n)
    answer: dict[str, Any] = {"batchId": result.batch_id, "rows": result.rows, "status": "stored"}
    if result.rejected:  # the rows that broke a rule were refused alone, the rest stored
        answer.update(rejected=result.rejected, errors=result.errors)
    if result.skew_s:
        answer.update(clockSkewS=round(result.skew_s, 3), timeShiftS=round(result.shift_s, 3))
    return answer


def _paced(request: Request) -> float:
    """Count this request's sender and answer the flush interval it should use."""
    svc: Any = request.app.state.services
    svc.pacer.observe(float_header(request.headers.get("x-fleetlens-flush-s")))
    return float(svc.pacer.advise(svc.queue.requests / svc.queue.max_requests))


async def ingest_batch(request: Request, scope: Scope) -> Response:
    """Store one batch for the caller's tenant (and project), or say why not."""
    svc: Any = request.app.state.services
    received_at = time.time()
    body = await _receive(request, scope)
    if isinstance(body, Response):
        return body
    try:
        try:
            # Decoded and validated on the ingest pool, then durable once the group insert
            # holding it returned (fleetlens/collector/commit.py), then registered.
            ingestor: Ingestor = svc.ingestor
            prepare = functools.partial(
                ingestor.prepare,
                body,
                request.headers.get("content-type", "application/msgpack"),
                request.headers.get("content-encoding", ""),
                scope.tenant,
                scope.project or None,
                received_at=received_at,
                transmitted_at=float_header(request.headers.get("x-fleetlens-sent-at")),
            )
            (result,) = await asyncio.wrap_future(ingestor.accept(lambda: [prepare()]))
        except WireError as exc:
            too_large = isinstance(exc, BatchTooLarge)
            svc.batches.labels("too_large" if too_large else "rejected").inc()
            return error_response(http_status(exc), str(exc), exc.field)
    finally:
        await _release(request, len(body))
    answer = _stored(svc, scope.tenant, len(body), result)
    answer["flushS"] = _paced(request)
    return JsonAnswer(answer)


async def ingest_batches(request: Request, scope: Scope) -> Response:
    """Store many senders' batches sent as one request (a node relay's), each on its own.

    The envelope is refused whole (400) only when it is not an array of batch frames; then every
    frame is decoded and validated alone and answered in ``results``, in order: ``status`` 200
    with what :func:`ingest_batch` answers, a 4xx naming the field of a bad batch (the others
    are stored), or 429 for frames past the request's budget of rows or decoded bytes (send them
    again). The good ones are stored by one group-commit request and the answer comes once they
    are durable. A retry of the whole request (the relay crashed before it read the answer)
    stores nothing twice: every batch is keyed like a batch sent alone
    (:func:`fleetlens.collector.ledger.batch_key`). The request counts as one sender for
    pacing: ``flushS`` is the relay's.
    """
    svc: Any = request.app.state.services
    received_at = time.time()
    body = await _receive(request, scope)
    if isinstance(body, Response):
        return body
    ingestor: Ingestor = svc.ingestor
    frames: list[BatchFrame] = []

    def prepare() -> list[Prepared | WireError | None]:
        # (the envelope is copied out frame by frame on the ingest pool, off the event loop)
        frames.extend(decode_frames(body, request.headers.get("content-encoding", "")))
        return ingestor.prepare_frames(
            frames,
            scope.tenant,
            scope.project or None,
            received_at=received_at,
            transmitted_at=float_header(request.headers.get("x-fleetlens-sent-at")),
        )

    try:
        try:
            done = await asyncio.wrap_future(ingestor.accept(prepare))
        except WireError as exc:
            svc.batches.labels("rejected").inc()
            return error_response(400, str(exc), exc.field)
    finally:
        await _release(request, len(body))
    results: list[dict[str, Any]] = []
    for frame, p in zip(frames, done, strict=True):
        if isinstance(p, IngestResult):
            stored = _stored(svc, scope.tenant, len(frame.body), p)
            results.append({**stored, "status": 200})
        elif p is None:
            svc.batches.labels("throttled").inc()
            results.append(
                {
                    "status": 429,
                    "error": "over the request's budget of rows or decoded bytes; send again",
                }
            )
        else:
            svc.batches.labels("too_large" if isinstance(p, BatchTooLarge) else "rejected").inc()
            results.append({"status": http_status(p), "error": str(p), "field": p.field})
    return JsonAnswer({"results": results, "flushS": _paced(request)})


_FAST_PATHS = {"/v1/ingest": ingest_batch, "/v1/ingest/batches": ingest_batches}


async def _serve(
    handler: Any, app: FastAPI, scope: AsgiScope, receive: Receive, send: Send
) -> None:
    """Answer an ingest request with ``handler``: authentication and its 401/403 as the route's
    dependency, the store's refusals, and an unexpected error as a logged JSON 500."""
    scope["app"] = app  # what Starlette sets for Request.app
    request = Request(scope, receive)
    response: Response
    try:
        who = await caller(request)
        if not who.can("ingest"):
            raise HTTPException(403, f"role {who.role!r} may not ingest")
        response = await handler(request, who)
    except HTTPException as exc:
        response = JsonAnswer({"detail": exc.detail}, exc.status_code, exc.headers)
    except FleetlensError as exc:  # the store's refusal (a full disk: 503, Retry-After)
        status = http_status(exc)
        retry = int(getattr(exc, "retry_after", 1)) if status == 503 else None
        response = error_response(status, str(exc), getattr(exc, "field", None), retry)
    except Exception:
        log.exception("ingest request failed")
        response = error_response(500, "internal error; the batch was not stored")
    # (every answer of the server says it; the app's middleware, which says it for the rest,
    # is not on this path)
    response.raw_headers.append((b"x-content-type-options", b"nosniff"))
    await response(scope, receive, send)


class IngestApp(FastAPI):
    """FastAPI with the ingest routes answered ahead of it.

    ``POST /v1/ingest`` goes straight to :func:`ingest_batch` (``/v1/ingest/batches`` to
    :func:`ingest_batches`), every other request to the app. Every rank of every job calls it
    once per flush; the framework's entry, middleware stack, routing and dependency solving do
    nothing for it (the routes read their own bodies and answer JSON with ``nosniff``) and cost
    more than the rest of the request together. The FastAPI routes of the same paths stay, for
    the OpenAPI document."""

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = _FAST_PATHS.get(scope["path"])
            if handler is not None:
                await _serve(handler, self, scope, receive, send)
                return
        await super().__call__(scope, receive, send)
