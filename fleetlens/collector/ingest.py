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

The run registry is written at once for a run's or job's first batch and for lifecycle events,
else at most every 2 s; what a SIGKILL lost of it is rebuilt at startup from the per-step rollup
(:meth:`Ingestor.recover_registry`), so the last step a restarted server shows is the last one
it acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
from sqlalchemy import select

from ..errors import FleetlensError, WireError
from ..lifecycle import END_STATE_OF_EVENT, RankEnd
from ..schema import KINDS
from ..store.metadata import MetadataStore
from ..store.models import Job
from ..store.scoped import all_tenants
from ..store.telemetry import Part, TelemetryStore, batch_tables, slice_columns
from ..wire import BatchFrame
from .commit import GroupCommitter
from .decode import DecodedBatch, DecodeLimits, StringColumn, decode_batch
from .ledger import Ledger, batch_key

log = logging.getLogger("fleetlens.collector")

__all__ = ["IngestQueue", "IngestResult", "Ingestor", "Prepared"]

_OBSERVE_EVERY_S = 2.0
_GRAPH_EVENTS = frozenset({"checkpoint_end", "job_start", "config_change"})
_STATUS_BY_EVENT = {"finish": "FINISHED", "failure": "FAILED", "job_start": "RUNNING"}


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


@dataclass
class _Seen:
    project: str
    experiment_id: str
    first: float
    last: float
    step: int
    world_size: int
    written_at: float = 0.0
    dirty: bool = True
    declared: int = 0  # the world size the job's placement declared


class Ingestor:
    def __init__(
        self,
        telemetry: TelemetryStore,
        metadata: MetadataStore,
        limits: DecodeLimits = DecodeLimits(),  # noqa: B008 - frozen
        decode_slots: int = 2,
        recover: bool = True,
        group_commit: bool = True,
    ) -> None:
        self.telemetry = telemetry
        self.metadata = metadata
        self.limits = limits
        self._seen: dict[tuple[str, str, str], _Seen] = {}
        self._seen_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max(1, decode_slots))
        # The server decodes on these threads only: an allocator keeps freed memory per thread,
        # so a body decoded on any of dozens of threads would leave its size behind on each.
        self.pool = ThreadPoolExecutor(max(1, decode_slots), thread_name_prefix="fl-ingest")
        self.sdk_dropped: dict[str, int] = {}
        self.rows_rejected: dict[str, int] = {}
        self.skewed_batches = 0
        # Called with (tenant, run_id, checkpoint) for a checkpoint recorded with its checksum
        # (verified); the server starts the evaluations its triggers ask for.
        self.on_verified_checkpoint: Callable[[str, str, dict[str, Any]], object] | None = None
        self.corrected_batches = 0
        self.committer: GroupCommitter | None = None
        if group_commit and isinstance(telemetry, GroupStore):
            # Settling an insert a crash interrupted reads the tables: a store that cannot
            # answer fails the start rather than guess (a retry could be stored twice).
            ledger = Ledger(os.path.join(telemetry.path, "ingest.ledger"), telemetry.settle)
            if ledger.recovered:
                log.warning(
                    "ingest ledger: %d batch table(s) of an interrupted insert were "
                    "stored whole; their retries will be acknowledged",
                    ledger.recovered,
                )
            self.committer = GroupCommitter(telemetry, ledger, telemetry.atomic_rows)
        if recover:
            try:
                self.recover_registry()
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
            body, content_type, content_encoding, tenant, project,
            received_at=received_at, transmitted_at=transmitted_at,
        )  # fmt: skip
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
    ) -> Prepared:
        """Decode and validate a batch for ``tenant``; a project-scoped caller writes into its
        project only. Raises :class:`~fleetlens.errors.WireError` naming the field; nothing is
        stored until :meth:`store`.

        ``received_at`` is when the request arrived (the skew is measured against it);
        ``transmitted_at`` the sender's clock when it sent this attempt, if it said.
        """
        t0 = time.perf_counter()
        with self._slots:
            batch = decode_batch(
                body,
                content_type,
                content_encoding,
                self.limits,
                now=received_at,
                transmitted_at=transmitted_at,
                declared_world=lambda c: self._declared(tenant, c),
            )
        ctx = dict(batch.ctx)
        ctx["tenant"] = tenant  # the caller's tenant, never what the batch claims
        if project is not None:
            ctx["project"] = project
        return Prepared(batch, ctx, t0)

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
        :class:`WireError` in the answer and the others are unaffected. The rows held at once
        are bounded like one request's (``max_rows``): the frames past it are None, "send again",
        and are not decoded."""
        out: list[Prepared | WireError | None] = []
        rows = 0
        for frame in frames:
            if rows >= self.limits.max_rows:
                out.append(None)
                continue
            try:
                prepared = self.prepare(
                    frame.body, frame.type, frame.encoding, tenant, project,
                    received_at=received_at, transmitted_at=transmitted_at,
                )  # fmt: skip
            except WireError as exc:
                out.append(exc)
                continue
            rows += prepared.batch.rows
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
        self._register(batch, ctx)
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
                batch.batch_id, ctx["tenant"], ctx.get("run_id", ""), abs(batch.skew_s),
                "behind" if batch.skew_s > 0 else "ahead of",
                "times corrected" if batch.shift_s else "flagged, not corrected",
            )  # fmt: skip
        return IngestResult(
            batch.batch_id,
            {kind: n for kind, (n, _) in batch.tables.items()},
            time.perf_counter() - prepared.t0,
            dict(batch.rejected),
            list(batch.errors),
            batch.skew_s if skewed else 0.0,
            batch.shift_s,
        )

    def _declared(self, tenant: str, ctx: dict[str, str]) -> int:
        with self._seen_lock:
            seen = self._seen.get((tenant, ctx.get("run_id", ""), ctx.get("job_id", "")))
            return seen.declared if seen is not None else 0

    def recover_registry(self) -> int:
        """Bring the registry's last step and last-seen time up to what telemetry holds.

        The registry is written at most every 2 s per job, so a SIGKILL can lose the last
        seconds of it while the batches were durable and acknowledged. The per-step rollup has
        the truth: one GROUP BY per job, and a registry write only where it is behind. Returns
        the number of jobs brought up to date.
        """
        db = self.telemetry.database
        tab = self.telemetry.query(
            "SELECT tenant AS r_tenant, run_id AS r_run, job_id AS r_job, max(step) AS r_step,"
            " min(start) AS r_first, max(end) AS r_last"
            f" FROM {db}.steps_by_step GROUP BY tenant, run_id, job_id"
        )
        if not tab.num_rows:
            return 0
        with self.metadata.session() as s:
            have = {
                (r.tenant, r.run_id, r.job_id): (r.last_step, r.last_seen)
                for r in s.execute(  # the registry of every tenant, rebuilt at startup
                    all_tenants(
                        select(Job.tenant, Job.run_id, Job.job_id, Job.last_step, Job.last_seen)
                    )
                )
            }
        fixed = 0
        for r in tab.to_pylist():
            key = (r["r_tenant"], r["r_run"], r["r_job"])
            step, last = int(r["r_step"]), float(r["r_last"])
            known = have.get(key)
            if known is not None and known[0] >= step and known[1] >= last:
                continue
            first = float(r["r_first"])
            if not (np.isfinite(first) and np.isfinite(last)):
                continue
            self.metadata.observe(key[0], key[1], job_id=key[2], first=first, last=last, step=step)
            fixed += 1
        if fixed:
            log.warning("run registry: %d job(s) brought up to date from telemetry", fixed)
        return fixed

    def _register(self, batch: DecodedBatch, ctx: dict[str, str]) -> None:
        """Keep the run registry current without a metadata write per batch."""
        run_id = ctx.get("run_id", "")
        if not run_id:
            return
        tenant, job_id = ctx["tenant"], ctx.get("job_id", "")
        times: list[float] = []
        step, world, declared = -1, 0, 0
        for kind, (n, cols) in batch.tables.items():
            # Only the run's own records say it is alive: device samples of its nodes go on
            # after it finished, and would otherwise make a finished run look like a hang.
            if n == 0 or "run_id" not in KINDS[kind].ctx:
                continue
            t = cols.get("time")
            if isinstance(t, np.ndarray):
                times += [float(t.min()), float(t.max())]
            s = cols.get("step")
            if kind == "step" and isinstance(s, np.ndarray):
                step = max(step, int(s.max()))
            r = cols.get("rank")
            if kind == "step" and isinstance(r, np.ndarray):
                world = max(world, int(r.max()) + 1)
            w = cols.get("world_size")
            if kind == "placement" and isinstance(w, np.ndarray):
                declared = max(declared, int(w.max()))
            if kind == "event":
                declared = max(declared, _started_world(cols, self.limits.max_world_size))
        if not times:
            return  # nothing of the run itself in this batch (e.g. only device samples)
        key = (tenant, run_id, job_id)
        now = time.monotonic()
        world = declared or world  # a declared world size wins over the ranks seen
        with self._seen_lock:
            seen = self._seen.get(key)
            if seen is None:
                seen = self._seen[key] = _Seen(
                    ctx.get("project", ""),
                    ctx.get("experiment_id", ""),
                    min(times),
                    max(times),
                    step,
                    world,
                    declared=declared,
                )
            else:
                seen.first, seen.last = min(seen.first, *times), max(seen.last, *times)
                seen.step = max(seen.step, step)
                seen.declared = max(seen.declared, declared)
                seen.world_size = seen.declared or max(seen.world_size, world)
                seen.dirty = True
            write = seen.written_at == 0.0 or now - seen.written_at >= _OBSERVE_EVERY_S
            if write:
                seen.written_at, seen.dirty = now, False
                record = _Seen(**seen.__dict__)
            else:  # only this batch's span: lifecycle events below need the run to exist
                record = _Seen("", "", min(times), max(times), step, seen.world_size)
        events = batch.tables.get("event")
        if write or events:
            self._observe(key, record)
        if events:
            self._lifecycle(tenant, run_id, job_id, events[1])

    def _lifecycle(self, tenant: str, run_id: str, job_id: str, cols: dict[str, Any]) -> None:
        kinds, times, attrs = cols["kind"], cols["time"], cols.get("attrs")
        if not isinstance(kinds, StringColumn):
            return
        values = kinds.values()
        attr_values = attrs.values() if isinstance(attrs, StringColumn) else None
        steps, ranks, messages = cols.get("step"), cols.get("rank"), cols.get("message")
        texts = messages.values() if isinstance(messages, StringColumn) else None
        for i, kind in enumerate(values):
            if kind in _GRAPH_EVENTS and attr_values is not None:
                step = int(steps[i]) if isinstance(steps, np.ndarray) else -1
                self._graph_event(tenant, run_id, job_id, kind, float(times[i]), step,
                                  attr_values[i])  # fmt: skip
            state = END_STATE_OF_EVENT.get(kind)
            if state is not None and job_id:
                rank = int(ranks[i]) if isinstance(ranks, np.ndarray) else -1
                step = int(steps[i]) if isinstance(steps, np.ndarray) else -1
                end = RankEnd(
                    max(rank, -1),
                    state,
                    float(times[i]),
                    step,
                    texts[i] if texts is not None else "",
                )
                self.metadata.record_end(tenant, run_id, job_id, end)
            status = _STATUS_BY_EVENT.get(kind)
            if status is None:
                continue
            config = None
            if kind == "job_start" and attr_values is not None:
                parsed = json.loads(attr_values[i])
                if isinstance(parsed.get("config"), dict):
                    config = parsed["config"]
            self.metadata.set_status(
                tenant, run_id, status, float(times[i]), job_id=job_id, config=config
            )

    def _graph_event(
        self, tenant: str, run_id: str, job_id: str, kind: str, at: float, step: int, raw: str
    ) -> None:
        """What the SDK told about the run graph: its checkpoints, dataset, code, config."""
        from ..errors import ConfigError
        from ..store.graph import GraphStore
        from ..store.scope import Scope

        parsed = json.loads(raw)
        a = parsed if isinstance(parsed, dict) else {}
        graph = GraphStore(self.metadata)
        scope = Scope(tenant=tenant, role="editor", actor="collector")
        try:
            if kind == "checkpoint_end":
                size, dur = a.get("size_bytes"), a.get("duration_s")
                ck = graph.record_checkpoint(
                    scope, run_id, int(a.get("step", step)), uri=str(a.get("path") or ""),
                    job_id=job_id, size_bytes=int(size) if isinstance(size, (int, float)) else None,
                    checksum=_checksum(a),
                    duration_s=float(dur) if isinstance(dur, (int, float)) else None,
                    sync=bool(a.get("sync", True)), ok=bool(a.get("ok", True)), at=at,
                    checkpoint_id=str(a.get("checkpoint_id") or ""),
                )  # fmt: skip
                hook = self.on_verified_checkpoint
                if hook is not None and ck["checksum"] and ck["ok"]:
                    try:
                        hook(tenant, run_id, ck)
                    except Exception:  # an evaluation that cannot start never fails ingest
                        log.exception("evaluation trigger on checkpoint %s failed", ck)
            elif kind == "job_start":
                env = {k: a[k] for k in ("python", "sdk", "hostname") if k in a}
                env.update(a.get("environment") or {})
                launch = a.get("launch_command")
                graph.describe_run(
                    scope, run_id, code=a.get("code") or None, dataset=a.get("dataset") or None,
                    launch_command=str(launch) if launch else None, environment=env or None,
                )  # fmt: skip
            elif kind == "config_change" and "key" in a:
                info = self.metadata.get_run(scope, run_id)
                graph.describe_run(
                    scope, run_id, config={**info.config, str(a["key"]): a.get("new")}
                )
        except ConfigError:
            pass  # a malformed hint from a training job never fails its batch

    def close(self) -> None:
        if self.committer is not None:
            self.committer.close()
            self.committer.ledger.close()
        self.pool.shutdown(wait=True)
        self.flush_registry()

    def flush_registry(self) -> None:
        """Write every pending run observation (called at shutdown)."""
        with self._seen_lock:
            pending = [(k, _Seen(**v.__dict__)) for k, v in self._seen.items() if v.dirty]
            for _, v in self._seen.items():
                v.dirty = False
        for key, seen in pending:
            self._observe(key, seen)

    def _observe(self, key: tuple[str, str, str], s: _Seen) -> None:
        tenant, run_id, job_id = key
        self.metadata.observe(
            tenant,
            run_id,
            job_id=job_id,
            project=s.project,
            experiment_id=s.experiment_id,
            first=s.first,
            last=s.last,
            step=s.step,
            world_size=s.world_size,
        )


def _started_world(cols: dict[str, Any], limit: int) -> int:
    """The world size a ``job_start`` event states (the SDK's and the log importers' attrs),
    for a job whose steps one rank reports for all (an imported log)."""
    kinds, attrs = cols.get("kind"), cols.get("attrs")
    if not isinstance(kinds, StringColumn) or not isinstance(attrs, StringColumn):
        return 0
    world = 0
    values = None
    for i, kind in enumerate(kinds.values()):
        if kind != "job_start":
            continue
        values = values if values is not None else attrs.values()
        try:
            w = json.loads(values[i]).get("world_size")
        except (ValueError, AttributeError):
            continue
        if isinstance(w, int) and not isinstance(w, bool) and 0 < w <= limit:
            world = max(world, w)
    return world


def _checksum(attrs: dict[str, Any]) -> str:
    """A checkpoint event's digest as ``sha256:HEX``: ``fleetlens.torch`` sends ``sha256``, an
    explicit ``checksum`` (any algorithm, prefixed) wins."""
    if attrs.get("checksum"):
        return str(attrs["checksum"])
    digest = attrs.get("sha256")
    return f"sha256:{digest}" if isinstance(digest, str) and digest else ""
