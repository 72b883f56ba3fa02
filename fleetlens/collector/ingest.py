"""Ingest: decode and validate everything, store durably, register the run, then acknowledge.

The order is the guarantee. Every rule is checked by the decoder before the first insert, so a
client error is a 4xx with nothing written. A batch is acknowledged only after every one of its
tables has been inserted (an insert that returned is durable). On the embedded engine the inserts
are shared by the requests that arrive together (:mod:`.commit`) and a retried batch is dropped
by the ingest ledger (:mod:`.ledger`); on ClickHouse server each batch is one insert per table
and a retry is dropped by the engine's deduplication (:func:`fleetlens.store.ddl.dedup_token`).
Both key on the tenant, the run, the batch id and a hash of the table's content, so a collector
killed between storing and acknowledging never stores anything twice, and another tenant's or
run's batch with the same id is never mistaken for a retry. The queue is bounded in requests and
in bytes: a request that finds it full waits briefly for room, then gets a 429 with Retry-After,
so overload never becomes a growing queue; at most ``decode_slots`` batches are decoded and
inserted at once (the embedded engine writes one at a time anyway), which bounds the memory of
bodies in flight.

After a batch is durable, the run registry (:mod:`.registry`) records what it says of its run.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from ..errors import BatchTooLarge, FleetlensError, WireError
from ..store.metadata import MetadataStore
from ..store.telemetry import Part, TelemetryStore, batch_tables, slice_columns
from ..wire import BatchFrame
from .commit import GroupCommitter
from .decode import DecodedBatch, DecodeLimits, decode_batch
from .ledger import Ledger, batch_key
from .registry import RunRegistry
from .space import DiskSpace

log = logging.getLogger("fleetlens.collector")

__all__ = ["IngestQueue", "IngestResult", "Ingestor", "Prepared"]


@runtime_checkable
class GroupStore(Protocol):
    """A store group commit can write to: the embedded engine in a local directory. A ClickHouse
    server keeps one insert per batch with its dedup token: a retry may reach another server,
    whose ledger would not know the batch."""

    path: str
    atomic_rows: int

    def insert_rows(self, kind: str, data: Any) -> None: ...

    def settle(self, pieces: list[tuple[str, int, int]]) -> set[int]: ...


class IngestQueue:
    """The bounded ingest queue, in requests and in bytes; lives on the server's event loop.

    A request that finds it full waits up to ``wait`` seconds for room and is then refused (the
    server answers 429). An empty queue always admits one request, so one large batch is never
    starved.
    """

    def __init__(self, max_requests: int, max_bytes: int) -> None:
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.requests = 0
        self.bytes = 0
        self._changed: asyncio.Condition | None = None

    def _full(self, nbytes: int) -> bool:
        return self.requests >= self.max_requests or (
            self.requests > 0 and self.bytes + nbytes > self.max_bytes
        )

    async def admit(self, nbytes: int, wait: float) -> bool:
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with self._changed:
            if self._full(nbytes):
                try:
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: not self._full(nbytes)), wait
                    )
                except TimeoutError:
                    return False
            self.requests += 1
            self.bytes += nbytes
            return True

    async def release(self, nbytes: int) -> None:
        if self._changed is None:
            return
        async with self._changed:
            self.requests -= 1
            self.bytes -= nbytes
            self._changed.notify_all()


@dataclass(frozen=True)
class IngestResult:
    """``rows``: rows stored per kind; ``rejected``: rows refused alone, by field, and
    ``errors`` why; ``skew_s``: the sender's clock behind the server's (negative: ahead) when
    over the tolerance, ``shift_s`` what was added to its times."""

    batch_id: str
    rows: dict[str, int]
    seconds: float
    rejected: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    skew_s: float = 0.0
    shift_s: float = 0.0


@dataclass(frozen=True)
class Prepared:
    """A decoded, validated batch and the context it is stored under."""

    batch: DecodedBatch
    ctx: dict[str, str]
    t0: float


class Ingestor:
    def __init__(
        self,
        telemetry: TelemetryStore,
        metadata: MetadataStore,
        limits: DecodeLimits = DecodeLimits(),  # noqa: B008 - frozen
        decode_slots: int = 2,
        recover: bool = True,
        group_commit: bool = True,
        min_free_bytes: int = 0,
        linger_s: float = 0.5,
    ) -> None:
        self.telemetry = telemetry
        self.metadata = metadata
        self.limits = limits
        self.registry = RunRegistry(telemetry, metadata, limits.max_world_size)
        self._slots = threading.BoundedSemaphore(max(1, decode_slots))
        # The server decodes on these threads only: an allocator keeps freed memory per thread,
        # so a body decoded on any of dozens of threads would leave its size behind on each.
        self.pool = ThreadPoolExecutor(max(1, decode_slots), thread_name_prefix="fl-ingest")
        self.sdk_dropped: dict[str, int] = {}
        self.rows_rejected: dict[str, int] = {}
        self.skewed_batches = 0
        self.corrected_batches = 0
        self.committer: GroupCommitter | None = None
        # The free space of the data directory (an embedded engine's): below the floor no
        # insert is tried and ingest is refused with 503 (fleetlens/collector/space.py).
        self.space: DiskSpace | None = None
        if group_commit and isinstance(telemetry, GroupStore):
            self.space = DiskSpace(telemetry.path, min_free_bytes)
            # Settling an insert a crash interrupted reads the tables: a store that cannot
            # answer fails the start rather than guess (a retry could be stored twice).
            ledger = Ledger(os.path.join(telemetry.path, "ingest.ledger"), telemetry.settle)
            if ledger.recovered:
                log.warning(
                    "ingest ledger: %d batch table(s) of an interrupted insert were "
                    "stored whole; their retries will be acknowledged",
                    ledger.recovered,
                )
            self.committer = GroupCommitter(
                telemetry, ledger, telemetry.atomic_rows, space=self.space, linger_s=linger_s
            )
        if recover:
            try:
                self.registry.recover()
            except FleetlensError as exc:  # serve anyway; the next batches refresh it
                log.warning("could not rebuild the run registry from telemetry: %s", exc)

    def ingest(
        self,
        body: bytes,
        content_type: str,
        content_encoding: str,
        tenant: str,
        project: str | None = None,
        *,
        received_at: float | None = None,
        transmitted_at: float | None = None,
    ) -> IngestResult:
        """Store a batch for ``tenant`` and wait until it is durable (:meth:`prepare`,
        :meth:`store`, :meth:`finish` in one call, for callers off the event loop)."""
        prepared = self.prepare(
            body,
            content_type,
            content_encoding,
            tenant,
            project,
            received_at=received_at,
            transmitted_at=transmitted_at,
        )
        self.store(prepared).result()
        return self.finish(prepared)

    def prepare(
        self,
        body: bytes,
        content_type: str,
        content_encoding: str,
        tenant: str,
        project: str | None = None,
        *,
        received_at: float | None = None,
        transmitted_at: float | None = None,
        limits: DecodeLimits | None = None,
    ) -> Prepared:
        """Decode and validate a batch for ``tenant``; a project-scoped caller writes into its
        project only. Raises :class:`~fleetlens.errors.WireError` naming the field; nothing is
        stored until :meth:`store`.

        ``received_at`` is when the request arrived (the skew is measured against it);
        ``transmitted_at`` the sender's clock when it sent this attempt, if it said; ``limits``
        replaces the ingestor's own for this batch.
        """
        t0 = time.perf_counter()
        with self._slots:
            batch = decode_batch(
                body,
                content_type,
                content_encoding,
                limits or self.limits,
                now=received_at,
                transmitted_at=transmitted_at,
                declared_world=lambda c: self.registry.declared(tenant, c),
            )
        ctx = dict(batch.ctx)
        ctx["tenant"] = tenant  # the caller's tenant, never what the batch claims
        if project is not None:
            ctx["project"] = project
        return Prepared(batch, ctx, t0)

    def accept(
        self, make: Callable[[], Sequence[Prepared | WireError | None]]
    ) -> Future[list[IngestResult | WireError | None]]:
        """``make`` (a :meth:`prepare`, or :meth:`prepare_frames`) and :meth:`store_many` of
        what it prepared on the ingest pool, then :meth:`finish` of each there once durable:
        the answer's future, one item per item of ``make`` (a refused frame stays its
        :class:`~fleetlens.errors.WireError` or None), failed with what ``make`` or the store
        raised. For the event loop, one hand-off there and one back, where the three calls
        cost three of each."""
        out: Future[list[IngestResult | WireError | None]] = Future()

        def fail(exc: BaseException) -> None:
            if not out.done():
                out.set_exception(exc)

        def finish(made: Sequence[Prepared | WireError | None], stored: Future[None]) -> None:
            # the committer's error, one for its whole group: handed on as it is
            refused = stored.exception() if not stored.cancelled() else CancelledError()
            if refused is not None:
                fail(refused)
                return
            try:
                out.set_result([self.finish(p) if isinstance(p, Prepared) else p for p in made])
            except BaseException as exc:  # handed to the waiting request
                fail(_frameless(exc))

        def on_stored(made: Sequence[Prepared | WireError | None], stored: Future[None]) -> None:
            try:
                self.pool.submit(finish, made, stored)
            except RuntimeError as exc:  # the pool was shut down: the server is stopping
                fail(_frameless(exc))

        def first() -> None:
            try:
                made = make()
                stored = self.store_many([p for p in made if isinstance(p, Prepared)])
            except BaseException as exc:  # handed to the waiting request
                fail(_frameless(exc))
                return
            stored.add_done_callback(functools.partial(on_stored, made))

        self.pool.submit(first)
        return out

    def prepare_frames(
        self,
        frames: list[BatchFrame],
        tenant: str,
        project: str | None = None,
        *,
        received_at: float | None = None,
        transmitted_at: float | None = None,
    ) -> list[Prepared | WireError | None]:
        """:meth:`prepare` each batch of a multi-batch request on its own: a bad one is its
        :class:`WireError` in the answer and the others are unaffected. What the frames hold at
        once is bounded like one request: ``max_rows`` rows and ``max_decoded_bytes`` of
        decompressed bodies in all, each frame decoded under what the ones before it left. The
        frames past either are None, "send again", and are not kept (a frame too large alone is
        refused when it comes first)."""
        out: list[Prepared | WireError | None] = []
        rows = held = 0
        full = self.limits
        for frame in frames:
            left = full.max_decoded_bytes - held
            if rows >= full.max_rows or left <= 0:
                out.append(None)
                continue
            limits = full if held == 0 else replace(full, max_decoded_bytes=left)
            try:
                prepared = self.prepare(
                    frame.body,
                    frame.type,
                    frame.encoding,
                    tenant,
                    project,
                    received_at=received_at,
                    transmitted_at=transmitted_at,
                    limits=limits,
                )
            except BatchTooLarge as exc:
                out.append(None if held else _bare(exc))
                continue
            except WireError as exc:
                out.append(_bare(exc))
                continue
            rows += prepared.batch.rows
            held += prepared.batch.nbytes
            out.append(prepared)
        return out

    def store(self, prepared: Prepared) -> Future[None]:
        """Store a prepared batch; the future resolves once every row of it is durable."""
        return self.store_many([prepared])

    def store_many(self, prepared: list[Prepared]) -> Future[None]:
        """Store prepared batches together (one group-commit request); the future resolves once
        every row of every one is durable."""
        if self.committer is not None:
            pieces: list[tuple[str, Part]] = []
            size = self.committer.max_rows
            for p in prepared:
                batch, ctx = p.batch, p.ctx
                for kind, (n, cols) in batch.tables.items():
                    # A table larger than one atomic insert goes in fixed slices, each its own
                    # key: the slicing is the same on a retry, so each slice is stored once.
                    for i, start in enumerate(range(0, n, size)):
                        digest = batch.digests[kind] + (f"#{i}" if i else "")
                        key = batch_key(ctx, batch.batch_id, kind, digest)
                        part = cols if n <= size else slice_columns(cols, start, start + size)
                        pieces.append((kind, (ctx, part, min(size, n - start), key)))
            return self.committer.submit(pieces)
        done: Future[None] = Future()
        try:
            with self._slots:
                for p in prepared:
                    tables = {k: t for k, t in batch_tables(p.batch).items() if t.num_rows}
                    for kind, table in tables.items():
                        token = f"{p.batch.batch_id}#{p.batch.digests[kind]}"
                        self.telemetry.insert(kind, table, p.ctx, token)
        except Exception as exc:
            done.set_exception(exc)
        else:
            done.set_result(None)
        return done

    def finish(self, prepared: Prepared) -> IngestResult:
        """After the batch is durable: the run registry, the counters, the answer."""
        batch, ctx = prepared.batch, prepared.ctx
        self.registry.register(batch, ctx)
        for prio, count in batch.dropped.items():
            self.sdk_dropped[prio] = self.sdk_dropped.get(prio, 0) + int(count)
        for where, count in batch.rejected.items():
            self.rows_rejected[where] = self.rows_rejected.get(where, 0) + count
        skewed = abs(batch.skew_s) > self.limits.skew_tolerance_s
        if skewed:
            self.skewed_batches += 1
            self.corrected_batches += 1 if batch.shift_s else 0
            log.warning(
                "clock skew: batch %s of %s/%s is %.1fs %s the server's clock (%s)",
                batch.batch_id,
                ctx["tenant"],
                ctx.get("run_id", ""),
                abs(batch.skew_s),
                "behind" if batch.skew_s > 0 else "ahead of",
                "times corrected" if batch.shift_s else "flagged, not corrected",
            )
        return IngestResult(
            batch.batch_id,
            {kind: n for kind, (n, _) in batch.tables.items()},
            time.perf_counter() - prepared.t0,
            dict(batch.rejected),
            list(batch.errors),
            batch.skew_s if skewed else 0.0,
            batch.shift_s,
        )

    def close(self) -> None:
        if self.committer is not None:
            self.committer.close()
            self.committer.ledger.close()
        self.pool.shutdown(wait=True)
        self.registry.flush()


def _frameless(exc: BaseException) -> BaseException:
    """An error raised on the ingest pool, for the request waiting on :meth:`Ingestor.accept`,
    without its frames: they hold the request's future, which would hold them back (a cycle
    only the garbage collector frees, with the body and its decoded batches in it). A refusal
    keeps its message and field (:func:`_bare`); any other error keeps where it was raised, as
    a note its log shows."""
    if isinstance(exc, WireError):
        return _bare(exc)
    if exc.__traceback__ is not None:
        where = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
        exc.add_note(f"raised on the ingest pool:\n{where}")
        exc.__traceback__ = None
    return exc


def _bare(exc: WireError) -> WireError:
    """A refusal kept for the answer without its traceback, whose frames hold the refused
    body's decompressed bytes (a few bombs in one envelope held gigabytes)."""
    exc.__traceback__ = exc.__cause__ = exc.__context__ = None
    return exc
