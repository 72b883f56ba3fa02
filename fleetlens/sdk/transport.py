"""How an encoded batch reaches the collector: one narrow Protocol and its HTTP implementation.

The exporter only needs "send these bytes, tell me whether to retry", so the boundary is a single
method (httpx's ``BaseTransport`` is one method too). ``HttpTransport`` uses ``http.client`` from
the standard library: the SDK is installed into every training image and must stay tiny.

Server contract: 200/201/202 means the batch is durable. 429 or 503 means "later", with
``Retry-After`` in seconds, and so does 408 (the body took too long to arrive: a slow link, not a
bad batch). Any other 4xx means the batch itself is bad and retrying cannot help
(``permanent=True``). 5xx, connection errors and timeouts are retryable.

The collector may be the node's relay (``fleetlens agent``, :mod:`fleetlens.agent.relay`), at a
loopback URL or a unix socket (``unix:/run/fleetlens/relay.sock``): it answers the same way once
the batch is durable in its spool.
"""

from __future__ import annotations

import http.client
import math
import random
import socket
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from ..errors import ConfigError, TransportError

__all__ = [
    "Ack",
    "Cadence",
    "HttpTransport",
    "Transport",
    "UnixHTTPConnection",
    "backoff_s",
    "batch_headers",
]

_GZIP_MAGIC = b"\x1f\x8b"

_ACK = frozenset({200, 201, 202})
_LATER = frozenset({408, 429, 503})


@dataclass(frozen=True)
class Ack:
    """What an acknowledgement said: the rows refused alone (a rule broken by one value; the
    rest was stored) and the flush interval the server asks for (``flushS``), when given."""

    refused_rows: int = 0
    flush_s: float | None = None


class Transport(Protocol):
    def send(self, body: bytes, headers: dict[str, str]) -> Ack | None:
        """Deliver one batch or raise :class:`~fleetlens.errors.TransportError`; what the
        collector's acknowledgement said, if known."""


class IngestAck(msgspec.Struct, rename="camel"):
    """The server's answer to a batch as its senders read it, unchecked: the rows it refused by
    field (``rejected``: {field: n}) and the flush interval it asks of them (``flush_s``); other
    keys are ignored."""

    rejected: Any = None
    flush_s: Any = None


def read_ack(answer: bytes) -> IngestAck:
    """The answer's acknowledgement; ValueError when it is not a JSON object."""
    return msgspec.json.decode(answer, type=IngestAck)


def _ack(answer: bytes) -> Ack:
    """Read an acknowledgement (``{"rejected": {field: n}, "flushS": s}``); never raises."""
    try:
        doc = read_ack(answer)
    except ValueError:  # not JSON, or not an object (msgspec's ValidationError is one)
        return Ack()
    try:
        refused = sum(int(n) for n in dict(doc.rejected or {}).values())
    except (ValueError, TypeError):
        refused = 0
    flush = doc.flush_s
    if isinstance(flush, bool) or not isinstance(flush, int | float):
        return Ack(refused)
    return Ack(refused, float(flush) if math.isfinite(flush) and flush > 0 else None)


class Cadence:
    """How often a sender really sends: the value of its ``X-Fleetlens-Flush-S``.

    The collector counts its senders as the sum of their stated seconds over its window
    (:mod:`fleetlens.collector.pacing`), true only if a sender sends once per stated second. A
    sender waits its interval, then works (encodes, sends, waits for the answer): against a slow
    server its period is the interval plus that work, and stating the interval alone would count
    it as a fraction of a sender, so the server would ask for less pacing exactly when it is slow.
    A sender states the seconds since its previous request instead (its requests' stated
    seconds add up to the time it has been sending), at most its interval plus its last cycle's
    work: a sender that had nothing to send for a while is not a slower one.
    """

    def __init__(self) -> None:
        self._last: float | None = None  # monotonic time of the previous request
        self._work = 0.0  # seconds the last cycle worked after its wait

    def worked(self, seconds: float) -> None:
        """The sender's last cycle (after its wait) took ``seconds``."""
        self._work = max(0.0, seconds)

    def stated(self, interval: float, now: float | None = None) -> str:
        """The header value for a request leaving now, the sender waiting ``interval``."""
        now = time.monotonic() if now is None else now
        last, self._last = self._last, now
        period = interval if last is None else min(now - last, interval + self._work)
        return f"{max(period, 0.001):.3f}"


def batch_headers(batch_id: str, body: bytes, priority: int, flush_s: str = "") -> dict[str, str]:
    """The headers a batch goes with, from whoever sends it (the exporter, ``fleetlens spool
    --send``): its id (a replay is stored once), when it is sent (with the body's ``sent_at``
    the collector measures the host's clock skew; stamped on every attempt), its class (a relay
    spools and evicts by it), its encoding and, from a sender that keeps sending, how often it
    does (:class:`Cadence`)."""
    headers = {
        "Content-Type": "application/msgpack",
        "X-Fleetlens-Batch-Id": batch_id,
        "X-Fleetlens-Sent-At": f"{time.time():.3f}",
        "X-Fleetlens-Priority": str(priority),
    }
    if flush_s:
        headers["X-Fleetlens-Flush-S"] = flush_s
    if body[:2] == _GZIP_MAGIC:
        headers["Content-Encoding"] = "gzip"
    return headers


def backoff_s(failures: int, base: float, cap: float, retry_after: float | None = None) -> float:
    """How long to wait after ``failures`` failures in a row: what the server said
    (``Retry-After``), else exponential from ``base`` up to ``cap``, with jitter, so that the
    senders of a job do not all retry in lockstep."""
    if retry_after is not None:
        return retry_after
    return float(min(cap, base * 2 ** (failures - 1)) * (0.5 + random.random() / 2))


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: rare from our collector; fall back to our own backoff
    return max(0.0, seconds)


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix stream socket (a node relay's)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class HttpTransport:
    """POST ``{server}/v1/ingest`` over one keep-alive connection, reopened after any error.

    ``server`` is an http(s) URL or ``unix:PATH`` (a relay's socket); ``path`` the route."""

    def __init__(
        self,
        server: str,
        token: str | None = None,
        timeout: float = 5.0,
        path: str = "/v1/ingest",
    ) -> None:
        self._unix = server[5:] if server.startswith("unix:") else None
        url = urllib.parse.urlsplit("http://localhost" if self._unix else server)
        if self._unix == "" or url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(f"server {server!r} is not an http(s) URL nor unix:PATH")
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port
        self._path = url.path.rstrip("/") + path
        self._timeout = timeout
        self._auth = f"Bearer {token}" if token else None
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._unix is not None:
            return UnixHTTPConnection(self._unix, self._timeout)
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def send(self, body: bytes, headers: dict[str, str]) -> Ack | None:
        status, reason, retry_after, answer = self.post(body, headers)
        if status in _ACK:
            return _ack(answer)
        if status in _LATER:
            raise TransportError(f"collector busy: {status} {reason}", retry_after=retry_after)
        if 400 <= status < 500:
            raise TransportError(
                f"collector refused the batch: {status} {reason}", permanent=True, status=status
            )
        raise TransportError(f"collector error: {status} {reason}")

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, float | None, bytes]:
        """POST ``body``: (status, reason, Retry-After seconds, answer); raises
        :class:`TransportError` only when the collector cannot be reached."""
        hdrs = dict(headers)
        if self._auth:
            hdrs["Authorization"] = self._auth
        # A kept-alive connection the server has since closed fails on first use; one retry on
        # a fresh connection tells that apart from a collector that is really down. The batch
        # id makes the retry harmless if the first attempt did arrive.
        reused = self._conn is not None
        try:
            return self._post(body, hdrs)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            if not reused or isinstance(exc, TimeoutError):
                raise TransportError(f"cannot reach collector: {exc!r}") from exc
            try:
                return self._post(body, hdrs)
            except (OSError, http.client.HTTPException) as exc2:
                self.close()
                raise TransportError(f"cannot reach collector: {exc2!r}") from exc2

    def _post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, float | None, bytes]:
        if self._conn is None:
            self._conn = self._connect()
        conn = self._conn
        conn.request("POST", self._path, body=body, headers=headers)
        resp = conn.getresponse()
        answer = resp.read()  # the connection can only be reused once the body is consumed
        if resp.will_close:
            self.close()
        return resp.status, resp.reason, _retry_after(resp.getheader("Retry-After")), answer
