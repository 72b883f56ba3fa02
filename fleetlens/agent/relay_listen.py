"""The relay's listeners: ``POST /v1/ingest`` from the node's ranks and ``GET /v1/relay``, on a
loopback port and/or a unix socket, each request answered from :meth:`Relay.accept`."""

from __future__ import annotations

import contextlib
import errno
import http.server
import json
import logging
import os
import socket
import socketserver
import stat
import sys
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from .relay import Relay

__all__ = ["MAX_BODY", "tcp_server", "unix_server"]

log = logging.getLogger("fleetlens.agent.relay")

MAX_BODY = 64 << 20


class _Handler(http.server.BaseHTTPRequestHandler):
    """``POST /v1/ingest`` (a rank's batch) and ``GET /v1/relay`` (what the relay is, its
    counters: the SDK's probe and the operator's view)."""

    protocol_version = "HTTP/1.1"
    timeout = 120  # an idle keep-alive connection of a rank that went away
    # An answer leaves in one write (flushed after each request): headers and body written
    # apart stall ~40 ms on TCP (Nagle's algorithm against the client's delayed ACK).
    wbufsize = -1

    @property
    def relay(self) -> Relay:
        return cast("Relay", getattr(self.server, "relay"))  # noqa: B009 - set on our servers

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/v1/relay":
            self._answer(404, {"error": f"no route {self.path}; the relay serves /v1/relay"})
            return
        relay = self.relay
        self._answer(200, {"relay": True, "server": relay.cfg.server, "stats": relay.stats()})

    def do_POST(self) -> None:
        if self.path.split("?")[0] != "/v1/ingest":
            self.close_connection = True
            self._answer(404, {"error": f"no route {self.path}; send batches to /v1/ingest"})
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            self._answer(411, {"error": "Content-Length is required"})
            return
        if int(length) > MAX_BODY:
            self.close_connection = True
            self._answer(413, {"error": f"body is {length} bytes; the relay takes {MAX_BODY}"})
            return
        body = self.rfile.read(int(length))
        if len(body) < int(length):
            self.close_connection = True
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, answer = self.relay.accept(body, headers)
        extra = {"Retry-After": "1"} if status == 503 else {}
        self._answer(status, answer, extra)

    def _answer(
        self, status: int, doc: dict[str, Any], extra: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return None  # one line per rank request would drown the agent's log


class _Quiet:
    """A rank that hangs up mid-request is ordinary (a job ending); anything else is logged."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            log.exception("relay: request failed")


class _TcpServer(_Quiet, http.server.ThreadingHTTPServer):
    relay: Relay

    def server_bind(self) -> None:
        # HTTPServer's asks the resolver for the host's name (getfqdn), which can hang on a
        # node without DNS; the relay has no use for it.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class _UnixServer(_Quiet, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    relay: Relay


def unix_server(path: str, relay: Relay) -> _UnixServer:
    """Listen on ``path``, replacing a socket a killed agent left (never another file); ranks
    of any user may connect (the server authenticates their tokens)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            with socket.socket(socket.AF_UNIX) as probe:
                if probe.connect_ex(path) == 0:
                    raise OSError(errno.EADDRINUSE, f"a relay already listens on {path}")
            os.unlink(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    srv = _UnixServer(path, _Handler)
    srv.relay = relay
    os.chmod(path, 0o666)
    return srv


def tcp_server(listen: str, relay: Relay) -> _TcpServer:
    """Listen on ``HOST:PORT`` (``:PORT`` is loopback; port 0 picks a free one)."""
    host, _, port = listen.rpartition(":")
    srv = _TcpServer((host or "127.0.0.1", int(port)), _Handler)
    srv.relay = relay
    return srv
