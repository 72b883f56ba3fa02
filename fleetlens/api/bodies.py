"""Reading an ingest body without letting slow or huge senders hold the server.

Three rules, each against a probe that once blocked every other client:

- **A deadline.** The body must arrive within ``BODY_GRACE_S`` (``collector.body_grace_s``) plus
  one second per ``BODY_MIN_BYTES_PER_S`` received: a 64 MiB batch on a 1 MiB/s link has 94 s,
  a sender trickling a byte a second is cut off after 30 s with 408 (the SDK retries it later).
- **No slot while reading.** The ingest queue's slot is taken after the body is in, so senders
  that are still sending hold nothing but the bytes they have sent.
- **Bytes charged as they arrive.** Bodies being read and queued share one memory budget
  (``collector.max_queue_bytes``), charged chunk by chunk, never a guess: a chunked body is not
  assumed to be 64 MiB. A body that finds the budget spent gets 429 with Retry-After.

The budget lives on the event loop (one per app), like the ingest queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request

from ..errors import BatchTooLarge

__all__ = [
    "BODY_GRACE_S",
    "BODY_MIN_BYTES_PER_S",
    "BodyBudget",
    "BodyRefused",
    "drain",
    "read_body",
    "read_upload",
    "timed_chunks",
]

BODY_GRACE_S = 30.0
BODY_MIN_BYTES_PER_S = 1 << 20
# How long a refused request's body is read and discarded, so the client sees the answer.
_DRAIN_S = 5.0


class BodyBudget:
    """Bytes of ingest bodies held in memory, read or being read, at most ``max_bytes``.

    The first body is always admitted (one large batch is never starved), like the queue.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0

    def take(self, nbytes: int, held: int) -> bool:
        """Charge ``nbytes`` more to a request that holds ``held`` already."""
        if self.bytes - held > 0 and self.bytes + nbytes > self.max_bytes:
            return False
        self.bytes += nbytes
        return True

    def give(self, nbytes: int) -> None:
        self.bytes -= nbytes


@dataclass
class BodyRefused(Exception):
    """The body was not read: ``status`` (408, 413, 429, 400), why, and the outcome counted."""

    status: int
    message: str
    outcome: str
    retry_after: int | None = None


def _too_slow(size: int, took_s: float, grace_s: float, min_rate: float) -> BodyRefused:
    return BodyRefused(
        408,
        f"the body did not arrive in time ({size} bytes in {took_s:.0f} s; "
        f"allowed: {grace_s:.0f} s plus 1 s per {min_rate / (1 << 20):.0f} MiB); retry later",
        "too_slow",
        retry_after=1,
    )


async def timed_chunks(
    request: Request, grace_s: float = BODY_GRACE_S, min_rate: float = BODY_MIN_BYTES_PER_S
) -> AsyncIterator[bytes]:
    """The body's chunks under the deadline: ``grace_s`` plus a second per ``min_rate`` bytes
    received. Raises :class:`BodyRefused` (408, or 400 when the client went away).

    For a consumer that awaits other things between chunks (a streamed upload): each chunk is
    waited for under its own timeout, so the deadline never fires inside the consumer."""
    start = time.monotonic()
    size = 0
    stream = request.stream().__aiter__()
    while True:
        left = start + grace_s + size / min_rate - time.monotonic()
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(left, 0.001))
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise _too_slow(size, time.monotonic() - start, grace_s, min_rate) from None
        except ClientDisconnect:
            raise BodyRefused(400, "the client went away mid-body", "rejected") from None
        if chunk:
            size += len(chunk)
            yield chunk


async def read_body(
    request: Request,
    limit: int,
    budget: BodyBudget,
    grace_s: float = BODY_GRACE_S,
    min_rate: float = BODY_MIN_BYTES_PER_S,
) -> bytes:
    """The whole body, under the deadline of :func:`timed_chunks` and charged to ``budget`` as
    it arrives; the caller gives back ``len(body)`` when done with it. Raises
    :class:`BodyRefused` (having given its bytes back).

    One deadline for the whole body, moved on as bytes arrive (nothing else is awaited while
    reading): a timeout per chunk cost an ingest request a task of its own (8% of the server's
    Python time at 1,024 ranks)."""
    chunks: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    moved = 0.0  # seconds the deadline was moved on for the bytes received
    try:
        async with asyncio.timeout_at(start + grace_s) as deadline:
            try:
                async for chunk in request.stream():
                    if not chunk:
                        continue
                    if size + len(chunk) > limit:
                        raise BodyRefused(
                            413, f"body is over the limit of {limit} bytes", "too_large"
                        )
                    if not budget.take(len(chunk), size):
                        raise BodyRefused(
                            429, "ingest queue is full; retry later", "throttled", retry_after=1
                        )
                    size += len(chunk)
                    chunks.append(chunk)
                    if size / min_rate - moved >= 1.0:  # (a timer is not moved for a ms)
                        moved = size / min_rate
                        deadline.reschedule(start + grace_s + moved)
            except ClientDisconnect:
                raise BodyRefused(400, "the client went away mid-body", "rejected") from None
    except TimeoutError:
        budget.give(size)
        raise _too_slow(size, loop.time() - start, grace_s, min_rate) from None
    except BaseException:
        budget.give(size)
        raise
    return b"".join(chunks)


async def drain(request: Request, seconds: float = _DRAIN_S) -> None:
    """Read and discard what is left of the body for a few seconds, so the client sees our
    answer instead of a reset; a sender slower than that is cut off (the connection closes)."""
    deadline = time.monotonic() + seconds
    stream = request.stream().__aiter__()
    try:
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.wait_for(stream.__anext__(), left)
    except (StopAsyncIteration, TimeoutError, ClientDisconnect, RuntimeError):
        pass


async def read_upload(request: Request, limit: int, instead: str) -> bytes:
    """An upload route's body (a file import), read the one way every body is: refused at once
    when its declared length is over ``limit`` (413 saying what to send ``instead``), else read
    under the deadline and the shared budget (:func:`read_body`); a refusal is an HTTP error
    with its status and Retry-After. The caller gives ``len(body)`` back to the budget."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        await drain(request)
        raise BatchTooLarge(f"body is {declared} bytes; the limit is {limit}; {instead}")
    try:
        grace = request.app.state.services.config.collector.body_grace_s
        return await read_body(request, limit, request.app.state.body_budget, grace)
    except BodyRefused as refused:
        if refused.status != 408:
            await drain(request)
        headers = {"Retry-After": str(refused.retry_after)} if refused.retry_after else None
        raise HTTPException(refused.status, refused.message, headers) from None
