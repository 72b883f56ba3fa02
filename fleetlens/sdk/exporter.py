"""The background exporter: drains the buffer, encodes batches, sends them, spools what fails.

One daemon thread does all the work the hot path avoided. It wakes every flush interval, when a
P0 record (a failure) is recorded, or when a flush or the stop sentinel arrives on its queue,
drains every priority class into one batch (P0 first; the batch is spooled and evicted as its
most important class), and hands it to the transport: one request per flush whatever the
classes, so a job's request rate is its ranks over the flush interval. The interval starts at
``flush_interval`` and follows what the collector asks in each acknowledgement (``flushS``,
:mod:`fleetlens.collector.pacing`), never below ``flush_interval`` nor above 60 s.

While the collector is failing it does not retry per batch: it backs off (the
server's ``Retry-After``, else exponential with jitter) and writes new batches straight to the
spool, so a dead collector costs one connection attempt per backoff period, not one per batch.
Once a send succeeds, spooled batches are replayed oldest first and deleted only after their
acknowledgement. Every failure of one item is counted and the loop goes on.

One bad batch must not hold the spool hostage. When a spooled batch fails (a server error, not
"busy"), the next one is tried at once: if that one goes through, the server is up and the
first one is the problem. A batch that fails ``_POISON_STRIKES`` times in a row while others are
acknowledged is moved to the spool's ``quarantine/`` folder and counted (``quarantined_batches``);
a batch the server refuses outright (4xx other than 408/429) is dropped and counted as rejected.
Rows the server refused alone (one value broke a rule; the rest of the batch was stored) are
counted as ``refused_rows`` from its acknowledgement.

Every ``heartbeat_s`` (at the first cycle after it is due) the thread adds one ``heartbeat`` row
with where the training thread is (step, phase, since when: :meth:`Run._position`), so a rank
stuck in a collective or a loader still tells the server that it is alive and where it stopped.
It costs one row per interval and rides in the batch of that cycle; it is never retried on its
own and never raises. Every ``memory_s`` the same way it adds the rank's memory
(:mod:`fleetlens.sdk.memory`) as scalars of the step the training thread is at.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import TransportError
from ..wire import encode_batch
from .buffer import SAMPLE, SCALARS, Entry, RecordBuffer
from .config import SDKConfig
from .memory import MemorySampler
from .orphans import SWEEP_EVERY_S, sweep
from .spool import Spool
from .tables import Identity, build_tables
from .transport import Ack, Cadence, Transport, backoff_s, batch_headers

__all__ = ["Exporter"]

_STOP = object()
_WAKE = object()
_MAX_FLUSH_S = 60.0
_SOURCE = "sdk/0.1.0"
# Replaying a large spool must not starve the buffer, whose caps would then drop new records.
_REPLAY_BUDGET_S = 2.0
# Failures in a row, with other batches acknowledged meanwhile, before a batch is quarantined.
_POISON_STRIKES = 3


@dataclass
class _Waiter:
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


class Exporter:
    """Owns the thread, the transport and the spool; the Run only calls flush/stop/spill."""

    def __init__(
        self,
        cfg: SDKConfig,
        buffer: RecordBuffer,
        transport: Transport,
        ident: Identity,
        spool: Spool,
        position: Callable[[], tuple[int, str, float]] | None = None,
    ) -> None:
        self.cfg = cfg
        self._position = position
        self._beat_at = 0.0
        local = cfg.launcher_env.get("LOCAL_WORLD_SIZE", "1")  # torchrun's ranks on this node
        self.memory = MemorySampler(cfg.local_rank, int(local) if local.isdigit() else 1)
        self._mem_at = 0.0
        self.buffer = buffer
        self.transport = transport
        self.ident = ident
        self.spool = spool
        self.ctx = cfg.ctx
        self.counts: dict[str, int] = dict.fromkeys(
            (
                "records",
                "batches_sent",
                "records_sent",
                "send_failures",
                "rejected_batches",
                "rejected_records",
                "refused_rows",
                "spooled_batches",
                "replayed_batches",
                "quarantined_batches",
                "adopted_batches",
                "encode_errors",
                "internal_errors",
            ),
            0,
        )
        self._q: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._retry_at = 0.0
        self._failures = 0
        # Spooled batch name -> (failures in a row, batches acknowledged at its first failure).
        self._strikes: dict[str, tuple[int, int]] = {}
        self._last_failure_busy = False
        self._reported = [0, 0, 0, 0]
        self._encode_lock = threading.Lock()
        self.interval = cfg.flush_interval  # what the collector last asked for, within bounds
        self._cadence = Cadence()
        self._sweep_at = 0.0  # when to look for spools whose process is gone (orphans.py)
        self._thread = threading.Thread(target=self._loop, name="fleetlens-exporter", daemon=True)

    # -- control, from any thread -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def flush(self, timeout: float) -> bool:
        """Drain and deliver, retrying (as the server asks) until done or ``timeout`` passes.

        True if everything, spool included, was acknowledged in time.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        while self._thread.is_alive():
            waiter = _Waiter()
            self._q.put(waiter)
            if not waiter.done.wait(max(0.0, deadline - time.monotonic())):
                return False
            if waiter.ok:
                return True
            now = time.monotonic()
            pause = max(self._retry_at, now + 0.05) - now
            if now + pause >= deadline:
                return False
            time.sleep(pause)
        return False

    def wake(self) -> None:
        """Send what is buffered now (a P0 record must not wait for the paced interval)."""
        self._q.put(_WAKE)

    def stop(self, timeout: float) -> None:
        self._q.put(_STOP)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(max(0.0, timeout))

    def spill(self) -> None:
        """Encode whatever is still buffered straight to the spool (exit paths, any thread),
        then let go of the spool's directory: the run is over, what is left in it is a later
        process's to send (fleetlens.sdk.orphans)."""
        while True:
            prio, entries, records = self._drain_all()
            if not entries:
                break
            encoded = self._encode(entries, records)
            if encoded is not None:
                self._to_spool(prio, *encoded)
        try:
            self.spool.release()
        except OSError:
            self.counts["internal_errors"] += 1

    def _drain_all(self) -> tuple[int, list[Entry], int]:
        """Up to ``max_batch_rows`` records from every class, P0 first: the batch's class (its
        most important record's), its entries and the records they hold."""
        entries: list[Entry] = []
        prio = -1
        left = self.cfg.max_batch_rows
        for p in range(4):
            if left <= 0:
                break
            got, rows = self.buffer.drain(p, left)
            if got:
                prio = p if prio < 0 else prio
                entries += got
                left -= rows
        return max(prio, 0), entries, self.cfg.max_batch_rows - left

    def dropped(self) -> list[int]:
        return [b + s for b, s in zip(self.buffer.dropped, self.spool.dropped, strict=True)]

    # -- the thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            waiters: list[_Waiter] = []
            stop = False
            try:
                item: Any = self._q.get(timeout=self.interval)
                while True:
                    if item is _STOP:
                        stop = True
                    elif isinstance(item, _Waiter):
                        waiters.append(item)
                    item = self._q.get_nowait()
            except queue.Empty:
                pass
            ok = False
            began = time.monotonic()
            try:
                ok = self._cycle()
            except Exception:
                self.counts["internal_errors"] += 1
            self._cadence.worked(time.monotonic() - began)
            for w in waiters:
                w.ok = ok
                w.done.set()
            if stop:
                return

    def _heartbeat(self) -> Entry | None:
        """The heartbeat entry when one is due. It is not the user's record: it takes no room
        in the buffer (a full buffer drops records, never it) and is not counted as one."""
        if self._position is None or self.cfg.heartbeat_s <= 0:
            return None
        now = time.time()
        if now - self._beat_at < self.cfg.heartbeat_s:
            return None
        try:
            step, phase, since = self._position()
        except Exception:
            self.counts["internal_errors"] += 1
            return None
        self._beat_at = now
        row = {"time": now, "rank": self.ident.rank, "step": step, "phase": phase, "since": since}
        return (SAMPLE, "heartbeat", row)

    def _memory(self) -> Entry | None:
        """The memory entry when one is due and the training thread is at a step: like the
        heartbeat, outside the buffer and not counted as the user's record."""
        if self._position is None or self.cfg.memory_s <= 0:
            return None
        now = time.time()
        if now - self._mem_at < self.cfg.memory_s:
            return None
        try:
            step = self._position()[0]
        except Exception:
            self.counts["internal_errors"] += 1
            return None
        if step < 0:
            return None  # before the first step: nothing to put it on yet
        self._mem_at = now
        got = self.memory.sample()
        return (SCALARS, step, now, got) if got else None

    def _cycle(self) -> bool:
        clean = True
        own = [e for e in (self._heartbeat(), self._memory()) if e is not None]
        # Drain what is there now, not what the training thread keeps adding meanwhile.
        rounds = self.buffer.pending() // self.cfg.max_batch_rows + 1
        for _ in range(rounds):
            prio, entries, records = self._drain_all()
            # A heartbeat alone is not worth a spool file while the collector is away: it
            # says "alive now", and is stale by the time the spool is replayed.
            if own and (entries or time.monotonic() >= self._retry_at):
                prio = prio if entries else 1
                entries += own
            own = []
            if not entries:
                break
            try:
                clean &= self._ship(prio, entries, records)
            except Exception:
                self.counts["internal_errors"] += 1
                clean = False
        # Spools gone processes left, once the collector takes batches (never while it does
        # not: they would only move from one spool to another).
        if (
            not self._failures
            and self.counts["batches_sent"]
            and time.monotonic() >= self._sweep_at
        ):
            self._sweep_at = time.monotonic() + SWEEP_EVERY_S
            try:
                self.counts["adopted_batches"] += sweep(self.spool, self.spool.owner)[1]
            except Exception:
                self.counts["internal_errors"] += 1
        if len(self.spool):
            try:
                self._replay()
            except Exception:
                self.counts["internal_errors"] += 1
        return clean and not len(self.spool)

    def _encode(self, entries: list[Entry], records: int) -> tuple[str, bytes, int] | None:
        with self._encode_lock:
            self.counts["records"] += records
            try:
                tables, bad = build_tables(entries, self.ident)
            except Exception:
                self.counts["encode_errors"] += records
                return None
            self.counts["encode_errors"] += bad
            if not tables:
                return None
            total = self.dropped()
            delta = {f"P{i}": total[i] - self._reported[i] for i in range(4)}
            self._reported = total
            bid, body = encode_batch(
                tables,
                self.ctx,
                source=_SOURCE,
                dropped={k: v for k, v in delta.items() if v},
                compress=self.cfg.compress,
            )
        return bid, body, records - bad

    def _ship(self, prio: int, entries: list[Entry], records: int) -> bool:
        encoded = self._encode(entries, records)
        if encoded is None:
            return True
        bid, body, records = encoded
        if time.monotonic() < self._retry_at:
            self._to_spool(prio, bid, body, records)
            return False
        return self._send(prio, bid, body, records, spooled=None)

    def _send(self, prio: int, bid: str, body: bytes, records: int, spooled: Any) -> bool:
        """Send one batch; on a retryable failure spool it (unless it already is) and back off."""
        headers = batch_headers(bid, body, prio, self._cadence.stated(self.interval))
        try:
            ack = self.transport.send(body, headers)
        except TransportError as exc:
            if exc.permanent:
                self.counts["rejected_batches"] += 1
                self.counts["rejected_records"] += records
                if spooled is not None:
                    self.spool.delete(spooled)
                return False
            self.counts["send_failures"] += 1
            self._last_failure_busy = exc.retry_after is not None
            self._back_off(exc.retry_after)
            if spooled is None:
                self._to_spool(prio, bid, body, records)
            return False
        except Exception:
            # A transport that breaks its contract: treat as retryable rather than lose data.
            self.counts["send_failures"] += 1
            self._last_failure_busy = False
            self._back_off(None)
            if spooled is None:
                self._to_spool(prio, bid, body, records)
            return False
        self._failures = 0
        self._retry_at = 0.0
        self.counts["batches_sent"] += 1
        self.counts["records_sent"] += records
        if isinstance(ack, Ack):
            self.counts["refused_rows"] += ack.refused_rows
            if ack.flush_s is not None:
                self.interval = min(_MAX_FLUSH_S, max(self.cfg.flush_interval, ack.flush_s))
        if spooled is not None:
            self.spool.delete(spooled)
            self.counts["replayed_batches"] += 1
        return True

    def _back_off(self, retry_after: float | None) -> None:
        self._failures += 1
        delay = backoff_s(self._failures, self.cfg.backoff_base, self.cfg.backoff_max, retry_after)
        self._retry_at = time.monotonic() + delay

    def _to_spool(self, prio: int, bid: str, body: bytes, records: int) -> None:
        try:
            if self.spool.put(prio, bid, body, records):
                self.counts["spooled_batches"] += 1
        except OSError:
            self.spool.dropped[prio] += records
            self.counts["internal_errors"] += 1

    def _replay(self) -> None:
        deadline = time.monotonic() + _REPLAY_BUDGET_S
        failed: set[str] = set()  # batches that failed this round: try the ones behind them
        probe = False  # one try past a failure's backoff, to tell a bad batch from a bad server
        while (probe or time.monotonic() >= self._retry_at) and time.monotonic() < deadline:
            got = self.spool.oldest(frozenset(failed))
            if got is None:
                return
            entry, body = got
            sent_before = self.counts["batches_sent"]
            ok = self._send(entry.priority, entry.batch_id, body, entry.records, spooled=entry)
            if ok:
                self._strikes.pop(entry.name, None)
                if probe:  # the server is fine: back to the oldest, so order is kept
                    probe = False
                    failed.clear()
                continue
            if self._last_failure_busy or entry not in self.spool:
                return  # the server asked us to wait, or the batch was refused and dropped
            strikes, acked_at = self._strikes.get(entry.name, (0, sent_before))
            strikes += 1
            if strikes >= _POISON_STRIKES and self.counts["batches_sent"] > acked_at:
                self._strikes.pop(entry.name, None)
                self.spool.quarantine(entry)
                self.counts["quarantined_batches"] += 1
            else:
                self._strikes[entry.name] = (strikes, acked_at)
            if probe:
                return  # two batches in a row failed: the server, not the batch; back off
            failed.add(entry.name)
            probe = True
