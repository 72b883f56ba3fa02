"""Where a process's batches go: the node's relay when there is one, else the server.

A node relay (``fleetlens agent``, :mod:`fleetlens.agent.relay`) takes the batches of every rank
of its node, acknowledges them once they are durable on the node's disk, and forwards them
together, so the server sees one request per node and flush instead of one per rank.

- ``FLEETLENS_RELAY`` (or ``relay=``) set to a URL (``http://127.0.0.1:7787``) or a socket
  (``unix:/run/fleetlens/relay.sock``): the process sends there.
- ``off`` (``0``, ``no``, ``none``): straight to the server.
- unset: at ``init`` the default socket (:data:`DEFAULT_SOCKET`), then the default port
  (:data:`DEFAULT_URL`) are asked ``GET /v1/relay`` with a short timeout; a relay that answers
  and forwards to the server this process is configured for is used. No relay (the usual case
  off a managed node) costs a refused loopback connection; nothing is logged or raised.

A relay that cannot be reached later (the agent restarting) is gone around, not waited for:
each batch it does not take goes to the server directly (:class:`RelayTransport`); a relay that
answers "later" (its spool is full) or refuses a batch is obeyed like the server.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.parse

from ..errors import TransportError
from .config import SDKConfig
from .transport import Ack, HttpTransport, UnixHTTPConnection

__all__ = [
    "DEFAULT_SOCKET",
    "DEFAULT_URL",
    "OFF",
    "RelayTransport",
    "open_transport",
    "probe",
    "relay_for",
    "same_server",
]

DEFAULT_URL = "http://127.0.0.1:7787"
DEFAULT_SOCKET = "/run/fleetlens/relay.sock"
OFF = frozenset({"off", "0", "no", "none", "false"})
_PROBE_TIMEOUT_S = 0.25


def same_server(a: str, b: str) -> bool:
    """Whether two server URLs name the same collector (scheme, host, port, path)."""

    def norm(url: str) -> tuple[str, str, int, str]:
        u = urllib.parse.urlsplit(url.strip())
        port = u.port or (443 if u.scheme == "https" else 80)
        return u.scheme.lower(), (u.hostname or "").lower(), port, u.path.rstrip("/")

    try:
        return norm(a) == norm(b)
    except ValueError:
        return False


def probe(relay: str, timeout: float = _PROBE_TIMEOUT_S) -> str | None:
    """The server a relay at ``relay`` (a URL or ``unix:PATH``) forwards to, or None when no
    relay answers there; never raises."""
    try:
        if relay.startswith("unix:"):
            if not os.path.exists(relay[5:]):
                return None
            conn: http.client.HTTPConnection = UnixHTTPConnection(relay[5:], timeout)
        else:
            url = urllib.parse.urlsplit(relay)
            conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeout)
        try:
            conn.request("GET", "/v1/relay")
            resp = conn.getresponse()
            doc = json.loads(resp.read()) if resp.status == 200 else None
        finally:
            conn.close()
    except Exception:
        return None
    server = doc.get("server") if isinstance(doc, dict) else None
    return server if isinstance(server, str) else None


def relay_for(cfg: SDKConfig) -> str | None:
    """The relay this process should send through, or None for the server itself."""
    setting = cfg.relay.strip()
    if setting.lower() in OFF:
        return None
    if setting:
        return setting
    for candidate in (f"unix:{DEFAULT_SOCKET}", DEFAULT_URL):
        upstream = probe(candidate)
        if upstream is not None and same_server(upstream, cfg.server):
            return candidate
    return None


class RelayTransport:
    """Send through the node's relay, or to the server directly when the relay is unreachable."""

    def __init__(self, relay: HttpTransport, server: HttpTransport) -> None:
        self.relay = relay
        self.server = server
        self.direct = 0  # batches sent around an unreachable relay

    def send(self, body: bytes, headers: dict[str, str]) -> Ack | None:
        try:
            return self.relay.send(body, headers)
        except TransportError as exc:
            if exc.permanent or exc.retry_after is not None:
                raise  # the relay answered: the batch is bad, or later
        ack = self.server.send(body, headers)
        self.direct += 1
        return ack

    def close(self) -> None:
        self.relay.close()
        self.server.close()


def open_transport(cfg: SDKConfig) -> tuple[HttpTransport | RelayTransport, str | None]:
    """The transport for ``cfg`` and the relay it goes through (None: the server directly)."""
    server = HttpTransport(cfg.server, cfg.token, cfg.send_timeout)
    relay = relay_for(cfg)
    if relay is None:
        return server, None
    return RelayTransport(HttpTransport(relay, cfg.token, cfg.send_timeout), server), relay
