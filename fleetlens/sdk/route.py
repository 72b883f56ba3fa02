"""Where a process's batches go: the node's relay when there is one, else the server.

A node relay (``fleetlens agent``, :mod:`fleetlens.agent.relay`) takes the batches of every rank
of its node, acknowledges them once they are durable on the node's disk, and forwards them
together, so the server sees one request per node and flush instead of one per rank.

- ``FLEETLENS_RELAY`` (or ``relay=``) set to a URL (``http://127.0.0.1:7787``) or a socket
  (``unix:/run/fleetlens/relay.sock``): the process sends there, whatever happens to it later
  (its own spool holds what the relay does not take).
- ``off`` (``0``, ``no``, ``none``): straight to the server.
- unset: at ``init`` the default socket (:data:`DEFAULT_SOCKET`), then the default port
  (:data:`DEFAULT_URL`) are asked ``GET /v1/relay`` with a short timeout; a relay that answers
  and forwards to the server this process is configured for is used. No relay (the usual case
  off a managed node) costs a refused loopback connection; nothing is logged or raised.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.parse

from .config import SDKConfig
from .transport import HttpTransport, UnixHTTPConnection

__all__ = [
    "DEFAULT_SOCKET",
    "DEFAULT_URL",
    "OFF",
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


def open_transport(cfg: SDKConfig) -> tuple[HttpTransport, str | None]:
    """The transport for ``cfg`` and the relay it goes through (None: the server directly)."""
    relay = relay_for(cfg)
    return HttpTransport(relay or cfg.server, cfg.token, cfg.send_timeout), relay
