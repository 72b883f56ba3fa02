"""Group commit: many requests' rows, one insert per table.

The embedded engine spends ~6-15 ms on an insert whatever its size, so one insert per request and
table caps a server at a few dozen SDK-sized requests a second. Here each request is decoded and
validated on its own (a bad batch is still refused alone, naming its field) and handed to one
committer thread as pieces (one Arrow table per kind, with its context columns). The committer
takes everything waiting when it comes round, so the window adapts by itself: a lone request is
inserted once ``gap_s`` (10 ms) passed with nothing after it, and under load each insert carries
the requests that arrived while the previous one ran. While requests keep arriving (each within
the gap of the last) it also lingers, up to ``linger_s`` from the first waiting request, so
that a busy second becomes a few large inserts rather than dozens of small ones: the engine's
cost is per insert far more than per row (~46 ms of CPU for one rank-step's rows, ~60 ms for 64,
issue 35), and every part it writes is merged again later. The gap stretches while most requests
arrive before those ahead of them were answered (many senders, not one client waiting for each
answer): to three of their usual spacings, up to ``linger_s``. So 64 ranks sending once a second
(a request every ~16 ms: alone in its insert at a 10 ms gap, ~13 ms of the server's CPU a
rank-step) share inserts, while a lone client, which waits for its answer before sending again,
still waits only ``gap_s``; under a fleet's load every request waits up to ``linger_s`` for its
answer. Pieces already stored (a retry, or the same batch twice
in one group) are dropped by the :class:`~.ledger.Ledger`; the rest is concatenated per kind
and column set, tagged with its batch keys, announced in the ledger, inserted, and committed. A
request's future resolves when every insert holding its rows returned: the acknowledgement still
means durable.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..store.telemetry import Part, merged_table, part_shape
from .ledger import Ledger
from .ledger import Piece as LedgerPiece
from .space import DiskSpace, is_out_of_space

__all__ = ["Cadence", "CommitMetrics", "GroupCommitter", "RowWriter"]


class Cadence:
    """How requests arrive, for the quiet spell that ends a group: running means (the newest
    request weighing 0.1) of whether a request came while others were unanswered, and of the
    time between such requests."""

    def __init__(self) -> None:
        self.overlap = 0.0
        self.spacing = 0.0
        self._prev_at: float | None = None

    def arrived(self, now: float, unanswered: int) -> None:
        """A request came at ``now`` with ``unanswered`` others submitted and not answered."""
        overlapped = unanswered > 0
        self.overlap += 0.1 * (float(overlapped) - self.overlap)
        if overlapped and self._prev_at is not None:
            self.spacing += 0.1 * (now - self._prev_at - self.spacing)
        self._prev_at = now

    def gap(self, gap_s: float, linger_s: float) -> float:
        """``gap_s``; while most requests come before those ahead of them were answered (many
        senders), three of their usual spacings, within [``gap_s``, ``linger_s``]."""
        if self.overlap < 0.5:
            return gap_s
        return min(linger_s, max(gap_s, 3.0 * self.spacing))


class RowWriter(Protocol):
    def insert_rows(self, kind: str, data: pa.Table) -> None:
        """Insert rows whose context columns and ``_batch`` keys are columns of ``data``."""


Piece = tuple[str, Part]
"""(kind, part): one table of one batch, its key inside the part."""


@dataclass
class _Request:
    pieces: list[Piece]
    future: Future[None] = field(default_factory=Future)

    @property
    def rows(self) -> int:
        return sum(part[2] for _, part in self.pieces)


@dataclass
class CommitStats:
    requests: int = 0
    inserts: int = 0
    groups: int = 0
    rows: int = 0
    retried_pieces: int = 0  # pieces already stored, acknowledged without a second copy
    largest_group: int = 0
    busy_s: float = 0.0


class GroupCommitter:
    """One thread that merges and inserts what the request threads hand it."""

    def __init__(
        self,
        writer: RowWriter,
        ledger: Ledger,
        max_rows: int = 500_000,
        space: DiskSpace | None = None,
        linger_s: float = 0.5,
        gap_s: float = 0.01,
    ) -> None:
        self.writer = writer
        self.ledger = ledger
        self.max_rows = max_rows
        self.space = space
        self.linger_s = linger_s
        self.gap_s = gap_s
        self._first_at = 0.0  # when the oldest waiting request came
        self._last_at = 0.0  # and the newest
        self._rows_waiting = 0
        self._unanswered = 0  # submitted, not yet resolved
        self._cadence = Cadence()
        self.stats = CommitStats()
        self._waiting: deque[_Request] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="fl-commit", daemon=True)
        self._thread.start()

    def submit(self, pieces: list[Piece]) -> Future[None]:
        """Queue one request's pieces; the future resolves once they are durable."""
        req = _Request(pieces)
        if not pieces:
            req.future.set_result(None)
            return req.future
        with self._cv:
            if self._closed:
                req.future.set_exception(RuntimeError("the collector is shutting down"))
                return req.future
            now = time.monotonic()
            self._cadence.arrived(now, self._unanswered)
            self._unanswered += 1
            if not self._waiting:
                self._first_at = now
            self._last_at = now
            self._rows_waiting += req.rows
            self._waiting.append(req)
            self._cv.notify()
        return req.future

    def pending(self) -> int:
        return len(self._waiting)

    def close(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._closed:
                    self._cv.wait()
                if not self._waiting:
                    return  # closed and drained
                self._linger()
                group = [self._waiting.popleft()]  # a request may hold several inserts' rows
                rows = group[0].rows
                while self._waiting and rows + self._waiting[0].rows <= self.max_rows:
                    req = self._waiting.popleft()
                    rows += req.rows
                    group.append(req)
                self._rows_waiting -= rows
                self._first_at = time.monotonic()  # of what is left: it has waited its turn
            t0 = time.perf_counter()
            try:
                self._commit(group)
            except BaseException as exc:  # never leave a request waiting forever
                for req in group:
                    if not req.future.done():
                        req.future.set_exception(exc)
            finally:
                with self._cv:
                    self._unanswered -= len(group)
            self.stats.busy_s += time.perf_counter() - t0

    def _linger(self) -> None:
        """Wait (holding the condition's lock only while checking) while requests keep coming,
        up to ``linger_s`` from the oldest waiting one and under ``max_rows`` rows."""
        while not self._closed:
            now = time.monotonic()
            gap = self._cadence.gap(self.gap_s, self.linger_s)
            quiet = now - self._last_at >= gap
            if quiet or now - self._first_at >= self.linger_s:
                return
            if self._rows_waiting >= self.max_rows:
                return
            self._cv.wait(min(gap, self._first_at + self.linger_s - now))

    def _commit(self, group: list[_Request]) -> None:
        by_table: dict[tuple[str, tuple[tuple[str, str], ...]], list[list[Part]]] = {}
        rows: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        holders: dict[int, list[_Request]] = {}
        for req in group:
            for kind, part in req.pieces:
                key = part[3]
                if key in holders:  # the same batch twice in one group: one copy
                    holders[key].append(req)
                    self.stats.retried_pieces += 1
                    continue
                holders[key] = [req]
                if self.ledger.stored(key):
                    self.stats.retried_pieces += 1
                    continue
                target = (kind, part_shape(part[1]))
                inserts = by_table.setdefault(target, [[]])
                if rows.get(target, 0) + part[2] > self.max_rows and inserts[-1]:
                    inserts.append([])  # each insert stays under the atomic size
                    rows[target] = 0
                inserts[-1].append(part)
                rows[target] = rows.get(target, 0) + part[2]
        failed: dict[int, BaseException] = {}
        for (kind, _), parts in (
            (target, parts) for target, chunks in by_table.items() for parts in chunks if parts
        ):
            pieces: list[LedgerPiece] = [(kind, part[3], part[2]) for part in parts]
            if self.space is not None and self.space.full():
                failed.update(dict.fromkeys((key for _, key, _ in pieces), self.space.refusal()))
                continue  # nothing tried: the engine must not fail (or hang) on a full disk
            try:
                self.ledger.intend(pieces)
                merged = merged_table(kind, parts)
                self.writer.insert_rows(kind, merged)
            except Exception as exc:
                error: BaseException = exc
                if self.space is not None and is_out_of_space(exc):
                    self.space.failed()
                    error = self.space.refusal()  # settled by the next intent, with space
                else:
                    self.ledger.settle_failed()
                for _, key, _ in pieces:
                    if not self.ledger.stored(key):
                        failed[key] = error
                continue
            self.ledger.commit()
            self.stats.inserts += 1
            self.stats.rows += merged.num_rows
        for key, error in failed.items():
            for req in holders[key]:
                if not req.future.done():
                    req.future.set_exception(error)
        for req in group:
            if not req.future.done():
                req.future.set_result(None)
        self.stats.groups += 1
        self.stats.requests += len(group)
        self.stats.largest_group = max(self.stats.largest_group, len(group))


class CommitMetrics:
    """Group commit on ``/metrics``: how many requests each insert carries, and retries met."""

    def __init__(self, committer: GroupCommitter) -> None:
        self.committer = committer

    def collect(self) -> Iterator[Metric]:
        s = self.committer.stats
        yield CounterMetricFamily(
            "fleetlens_ingest_commits", "Group inserts into the telemetry store", value=s.inserts
        )
        yield CounterMetricFamily(
            "fleetlens_ingest_committed_requests",
            "Ingest requests made durable by group inserts",
            value=s.requests,
        )
        yield CounterMetricFamily(
            "fleetlens_ingest_deduplicated_tables",
            "Tables of batches already stored (retries), acknowledged without a second copy",
            value=s.retried_pieces,
        )
        yield GaugeMetricFamily(
            "fleetlens_ingest_commit_waiting",
            "Requests waiting for the next group insert",
            value=self.committer.pending(),
        )
