"""The node relay: the ranks of a node send to it, it forwards their batches together.

A node of 8 GPUs runs 8 ranks, each sending one request per flush; through the relay the server
gets one request per node and flush, so its request rate falls by the node's rank count. The
relay lives in ``fleetlens agent`` and speaks the collector's own ``POST /v1/ingest`` to the
ranks, on loopback (``127.0.0.1:7787`` by default) and/or a unix socket:

1. **Accept**: the body is checked to be a batch (its head only: version, id, row counts; the
   server validates the rest), wrapped with the rank's ``Authorization`` and content headers,
   and written to the relay's bounded spool (:class:`fleetlens.sdk.spool.Spool`, file and
   directory fsync'd). Only then is the rank answered 200 (``status: spooled``): a relay killed
   at any point loses nothing it acknowledged. A spool full of batches as important as the new
   one (the SDK's ``X-Fleetlens-Priority``) answers 503 with Retry-After, so the rank keeps the
   batch in its own spool instead of the relay dropping it; lower classes are evicted first and
   every eviction is counted.
2. **Forward**: every interval (at once for a P0 batch or a full envelope) the oldest spooled
   batches, up to 256 or 8 MiB, grouped by the credentials they came with (a request carries
   one token), go to ``POST /v1/ingest/batches`` as one request; each is answered on its own and
   deleted from the spool once stored (or refused as bad by the server, counted). Server down,
   busy or failing: the batches stay, the relay backs off (Retry-After, else exponential with
   jitter) and replays them oldest first when it is back. Delivery is at-least-once; a batch the
   server stored but whose answer was lost is sent again and stored once (the collector keys
   every batch: :func:`fleetlens.collector.ledger.batch_key`). A server from before
   multi-batch requests answers that route 404: the relay then forwards each batch alone to
   ``POST /v1/ingest``, as its rank would have, and tries the multi-batch route again every
   :data:`_SINGLE_RETRY_S` (the server may have been upgraded).
3. **Pacing**: the relay states how often it sends to the server (``X-Fleetlens-Flush-S``), follows
   the ``flushS`` it is answered (never below its own floor), and answers the ranks that same
   interval: a rank need not flush more often than its batches leave the node.

The spool holds the ranks' tokens beside their batches (to forward after a restart): it is made
private to the agent's user (0700, files 0600) like every fleetlens spool.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socketserver
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, cast

import msgspec

from ..errors import TransportError
from ..sdk.spool import Spool, SpoolEntry
from ..sdk.transport import Cadence, HttpTransport, IngestAck, backoff_s, read_ack
from ..wire import BATCHES_CONTENT_TYPE, BatchFrame, encode_frames
from .relay_listen import tcp_server, unix_server

__all__ = ["DEFAULT_LISTEN", "Relay", "RelayConfig"]

log = logging.getLogger("fleetlens.agent.relay")

DEFAULT_LISTEN = "127.0.0.1:7787"
_MAX_DECODED = 256 << 20
_MSGPACK = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
_JSON = ("application/json", "text/json")
_LATER = frozenset({408, 429, 503})
_MAX_FLUSH_S = 60.0
_SINGLE_RETRY_S = 600.0  # how long a relay sends batch by batch after a 404 before retrying
_FORWARD_BUDGET_S = 5.0  # one forwarding round, so a stop or a wake is never kept waiting long
_SAFE = re.compile(r"[^A-Za-z0-9_.]")


class _Taken(msgspec.Struct, rename="camel"):
    """A rank's batch spooled: sent on within ``flush_s`` seconds."""

    batch_id: str
    status: str
    flush_s: float


class _Busy(msgspec.Struct, rename="camel"):
    """A rank's batch not taken (the spool full or unusable): the sender retries."""

    error: str
    retry_after: int = 1


def _answer(doc: msgspec.Struct) -> dict[str, Any]:
    """An answer to a rank, as its JSON object."""
    return cast(dict[str, Any], msgspec.to_builtins(doc))


@dataclass(frozen=True)
class RelayConfig:
    """``server``: where to forward; ``listen``: ``HOST:PORT`` (empty: no TCP listener);
    ``socket_path``: a unix socket to listen on too (empty: none); ``interval``: the shortest
    forward interval (the server may ask for a longer one)."""

    server: str
    spool_dir: str
    listen: str = DEFAULT_LISTEN
    socket_path: str = ""
    spool_max_bytes: int = 1 << 30
    interval: float = 0.5
    max_frames: int = 256
    max_request_bytes: int = 8 << 20
    backoff_base: float = 0.25
    backoff_max: float = 5.0
    timeout: float = 30.0


class _Rows(msgspec.Struct):
    n: int


class _Head(msgspec.Struct):
    """What the relay reads of a batch: enough to know it is one, and its size in records."""

    v: int
    batch_id: str
    tables: dict[str, _Rows]


class _Spooled(msgspec.Struct, array_like=True):
    """One spooled batch: the frame the server gets, and the credentials it came with."""

    auth: str
    frame: BatchFrame


_HEAD_MSGPACK = msgspec.msgpack.Decoder(_Head)
_HEAD_JSON = msgspec.json.Decoder(_Head)
_SPOOLED = msgspec.msgpack.Decoder(_Spooled)
_ENCODER = msgspec.msgpack.Encoder()


class BadBatch(Exception):
    """A rank's request is not a batch: ``status`` and why (the rank counts it rejected)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _inflate(body: bytes, encoding: str) -> bytes:
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in ("gzip", "deflate"):
        raise BadBatch(400, f"Content-Encoding {encoding!r} is not supported; use gzip or none")
    d = zlib.decompressobj(31 if enc == "gzip" else 15)
    try:
        raw = d.decompress(body, _MAX_DECODED + 1)
    except zlib.error as exc:
        raise BadBatch(400, f"body is not valid {enc}: {exc}") from exc
    if len(raw) > _MAX_DECODED:
        raise BadBatch(413, f"decompressed body is over {_MAX_DECODED} bytes")
    if not d.eof:
        raise BadBatch(400, f"{enc} body is truncated")
    return raw


def read_head(body: bytes, content_type: str, encoding: str) -> tuple[str, int]:
    """The batch id and record count of a rank's body; raises :class:`BadBatch`."""
    ctype = content_type.split(";")[0].strip().lower() or "application/msgpack"
    if ctype not in _MSGPACK and ctype not in _JSON:
        raise BadBatch(400, f"Content-Type {content_type!r} is not a batch's")
    raw = _inflate(body, encoding)
    try:
        head = (_HEAD_JSON if ctype in _JSON else _HEAD_MSGPACK).decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadBatch(400, f"not a batch: {exc}") from exc
    return head.batch_id, sum(max(0, t.n) for t in head.tables.values())


class Relay:
    """The listeners, the spool and the forwarding thread of one node's relay."""

    def __init__(self, cfg: RelayConfig) -> None:
        self.cfg = cfg
        self.spool = Spool(cfg.spool_dir, cfg.spool_max_bytes, fsync=True)
        self.transport = HttpTransport(cfg.server, None, cfg.timeout, path="/v1/ingest/batches")
        self.single = HttpTransport(cfg.server, None, cfg.timeout)  # servers without batches
        self._single_until = 0.0  # batch by batch until then (the server answered 404)
        self.interval = cfg.interval
        self._cadence = Cadence()
        self.counts: dict[str, int] = dict.fromkeys(
            (
                "received",  # batches from ranks, acknowledged once spooled
                "records_received",
                "bad_batches",  # not batches: answered 4xx, never spooled
                "refused_full",  # spool full of batches as important: 503, the rank keeps it
                "spool_errors",  # the disk failed: 503, the rank keeps it
                "forward_requests",
                "forwarded_singly",  # batches sent alone to /v1/ingest (an older server)
                "forwarded",  # batches the server stored
                "refused",  # batches the server refused as bad (4xx): dropped, counted
                "send_failures",
                "unreadable",  # spool files that are not a relay's batch: quarantined
            ),
            0,
        )
        self._lock = threading.Lock()
        self._turned_away = 0  # records of the batches answered 503 for a full spool
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._retry_at = 0.0
        self._failures = 0
        self._servers: list[socketserver.BaseServer] = []
        self._threads: list[threading.Thread] = []
        self.address: tuple[str, int] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Relay:
        """Bind the listeners (raises OSError when one is taken, having closed the others) and
        start forwarding."""
        try:
            if self.cfg.listen:
                tcp = tcp_server(self.cfg.listen, self)
                self.address = cast(tuple[str, int], tcp.server_address[:2])
                self._servers.append(tcp)
            if self.cfg.socket_path:
                self._servers.append(unix_server(self.cfg.socket_path, self))
        except (OSError, ValueError):
            for srv in self._servers:
                srv.server_close()
            self._servers.clear()
            raise
        for srv in self._servers:
            self._spawn(srv.serve_forever, "fl-relay-listen")
        self._spawn(self._loop, "fl-relay-forward")
        return self

    def _spawn(self, target: Any, name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop taking batches, forward what the spool holds for up to ``timeout`` seconds; the
        rest stays spooled for the next start."""
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        if self.cfg.socket_path:
            with contextlib.suppress(OSError):
                os.unlink(self.cfg.socket_path)
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.transport.close()
        self.single.close()

    def where(self) -> str:
        """Where the ranks reach this relay: its URL and/or ``unix:PATH``."""
        parts = [f"http://{self.address[0]}:{self.address[1]}"] if self.address else []
        parts += [f"unix:{self.cfg.socket_path}"] if self.cfg.socket_path else []
        return " and ".join(parts)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self.counts)
        out.update(
            spooled_batches=len(self.spool),
            spool_bytes=self.spool.total_bytes,
            spool_max_bytes=self.spool.max_bytes,
            # The spool counts the batches it turned away among its drops; those the rank kept.
            evicted_batches=self.spool.dropped_batches - out["refused_full"],
            evicted_records=sum(self.spool.dropped) - self._turned_away,
            quarantined=self.spool.quarantined,
            interval_s=self.interval,
            server_down=self._failures > 0,
        )
        return out

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    # -- accepting a rank's batch ----------------------------------------------------------------

    def accept(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """Spool one rank's batch durably; (status, answer). Never raises."""
        ctype = headers.get("content-type", "application/msgpack")
        encoding = headers.get("content-encoding", "")
        try:
            batch_id, records = read_head(body, ctype, encoding)
        except BadBatch as exc:
            self._count("bad_batches")
            return exc.status, {"error": str(exc), "detail": str(exc), "field": None}
        try:
            prio = min(3, max(0, int(headers.get("x-fleetlens-priority", "2"))))
        except ValueError:
            prio = 2
        frame = BatchFrame(body=body, type=ctype, encoding=encoding)
        data = _ENCODER.encode(_Spooled(headers.get("authorization", ""), frame))
        name = _SAFE.sub("_", batch_id)[:64] or "batch"
        try:
            taken = self.spool.put(prio, name, data, records)
        except OSError as exc:
            self._count("spool_errors")
            log.warning("relay spool %s: %s", self.cfg.spool_dir, exc)
            return 503, _answer(_Busy(f"relay spool unavailable: {exc}"))
        if not taken:
            with self._lock:
                self.counts["refused_full"] += 1
                self._turned_away += records
            return 503, _answer(_Busy("relay spool is full; retry later"))
        with self._lock:
            self.counts["received"] += 1
            self.counts["records_received"] += records
        if prio == 0 or len(self.spool) >= self.cfg.max_frames:
            self._wake.set()
        return 200, _answer(_Taken(batch_id, "spooled", self.interval))

    # -- forwarding ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            began = time.monotonic()
            try:
                self.forward()
            except Exception:  # one bad round must not end the relay
                log.exception("relay: forwarding round failed")
                self._back_off(None)
            self._cadence.worked(time.monotonic() - began)
        with contextlib.suppress(Exception):  # stopping: one last round, bounded by stop()
            self.forward()

    def forward(self) -> None:
        """Send spooled batches, oldest first, until the spool is empty, the server fails, or
        the round's budget is spent."""
        deadline = time.monotonic() + _FORWARD_BUDGET_S
        while time.monotonic() < deadline and time.monotonic() >= self._retry_at:
            taken = self._take()
            if not taken:
                return
            groups: dict[str, list[tuple[SpoolEntry, BatchFrame]]] = {}
            for entry, spooled in taken:
                groups.setdefault(spooled.auth, []).append((entry, spooled.frame))
            for auth, items in groups.items():
                if not self._send(auth, items):
                    return

    def _take(self) -> list[tuple[SpoolEntry, _Spooled]]:
        """The oldest spooled batches, up to one request's worth."""
        out: list[tuple[SpoolEntry, _Spooled]] = []
        names: set[str] = set()
        size = 0
        while len(out) < self.cfg.max_frames:
            got = self.spool.oldest(frozenset(names))
            if got is None:
                break
            entry, data = got
            if out and size + len(data) > self.cfg.max_request_bytes:
                break
            names.add(entry.name)
            try:
                spooled = _SPOOLED.decode(data)
            except (msgspec.ValidationError, msgspec.DecodeError):
                self._count("unreadable")
                self.spool.quarantine(entry)
                continue
            size += len(data)
            out.append((entry, spooled))
        return out

    def _send(self, auth: str, items: list[tuple[SpoolEntry, BatchFrame]]) -> bool:
        """One request to the server; True when it answered for every batch."""
        if time.monotonic() < self._single_until:
            return all(self._send_alone(auth, entry, frame) for entry, frame in items)
        headers = {
            "Content-Type": BATCHES_CONTENT_TYPE,
            "X-Fleetlens-Sent-At": f"{time.time():.3f}",  # the ranks' clock: the same node's
            "X-Fleetlens-Flush-S": self._cadence.stated(self.interval),
        }
        if auth:
            headers["Authorization"] = auth
        self._count("forward_requests")
        try:
            status, reason, retry_after, answer = self.transport.post(
                encode_frames([frame for _, frame in items]), headers
            )
        except TransportError as exc:
            self._failed(f"cannot reach {self.cfg.server}: {exc}", None)
            return False
        if status in (404, 405):  # a server from before multi-batch requests
            log.warning(
                "relay: %s has no multi-batch route (%d); forwarding batch by batch",
                self.cfg.server,
                status,
            )
            self._single_until = time.monotonic() + _SINGLE_RETRY_S
            return all(self._send_alone(auth, entry, frame) for entry, frame in items)
        if status in _LATER or status >= 500:
            self._failed(f"server answered {status} {reason}", retry_after)
            return False
        if status != 200:  # the request as a whole was refused (a bad token, too large)
            if len(items) > 1 and status not in (401, 403):
                return all(self._send(auth, [item]) for item in items)  # find the bad one
            self._refused([entry for entry, _ in items], f"{status} {reason}: {answer[:200]!r}")
            return True
        try:
            doc = json.loads(answer)
            results = list(doc["results"])
        except (ValueError, KeyError, TypeError):
            self._failed("server's answer is not a multi-batch answer", None)
            return False
        self._recovered(msgspec.convert(doc, IngestAck).flush_s)
        complete = True
        for (entry, _), result in zip(items, results, strict=False):
            code = result.get("status") if isinstance(result, dict) else None
            if code == 200:  # counted before the spool lets go: an empty spool reads as done
                self._count("forwarded")
                self.spool.delete(entry)
            elif isinstance(code, int) and 400 <= code < 500 and code not in _LATER:
                self._refused([entry], f"{code}: {result.get('error')}")
            else:  # later: it stays spooled, first in line
                complete = False
        return complete and len(results) >= len(items)

    def _send_alone(self, auth: str, entry: SpoolEntry, frame: BatchFrame) -> bool:
        """One batch to ``POST /v1/ingest``, as its rank would have sent it; True when the
        server answered for it (stored, or refused as bad)."""
        headers = {
            "Content-Type": frame.type,
            "X-Fleetlens-Sent-At": f"{time.time():.3f}",
            "X-Fleetlens-Flush-S": self._cadence.stated(self.interval),
        }
        if frame.encoding:
            headers["Content-Encoding"] = frame.encoding
        if auth:
            headers["Authorization"] = auth
        self._count("forward_requests")
        try:
            status, reason, retry_after, answer = self.single.post(frame.body, headers)
        except TransportError as exc:
            self._failed(f"cannot reach {self.cfg.server}: {exc}", None)
            return False
        if status == 200:
            self._count("forwarded")
            self._count("forwarded_singly")
            self.spool.delete(entry)
            with contextlib.suppress(ValueError):  # not a JSON object: the batch is stored
                self._recovered(read_ack(answer).flush_s)
            return True
        if status in _LATER or status >= 500 or status in (404, 405):
            self._failed(f"server answered {status} {reason}", retry_after)
            return False
        self._refused([entry], f"{status} {reason}: {answer[:200]!r}")
        return True

    def _refused(self, entries: list[SpoolEntry], why: str) -> None:
        self._count("refused", len(entries))  # first, as for a forwarded batch
        for entry in entries:
            self.spool.delete(entry)
        log.warning("relay: the server refused %d batch(es): %s", len(entries), why)

    def _failed(self, why: str, retry_after: float | None) -> None:
        self._count("send_failures")
        if self._failures == 0:
            log.warning("relay: %s; spooling and retrying", why)
        self._back_off(retry_after)

    def _back_off(self, retry_after: float | None) -> None:
        self._failures += 1
        delay = backoff_s(self._failures, self.cfg.backoff_base, self.cfg.backoff_max, retry_after)
        self._retry_at = time.monotonic() + delay

    def _recovered(self, flush_s: Any) -> None:
        if self._failures:
            log.warning("relay: %s is back; replaying the spool", self.cfg.server)
        self._failures = 0
        self._retry_at = 0.0
        if isinstance(flush_s, int | float) and not isinstance(flush_s, bool) and flush_s > 0:
            self.interval = min(_MAX_FLUSH_S, max(self.cfg.interval, float(flush_s)))


# -- HTTP ----------------------------------------------------------------------------------------
