"""The HTTP/1.1 protocol the server runs: uvicorn's, with a deadline on a request's headers.

uvicorn times out an idle keep-alive connection but not a request whose headers arrive a byte
at a time: 50 such connections stayed open for as long as their senders liked. Here a request's
headers must be complete within ``header_timeout_s`` of its first byte (of the connection, for
the first request); a connection that is late is answered 408 and closed. Bodies have their own
deadline (:mod:`fleetlens.api.bodies`, :mod:`fleetlens.api.body_limit`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["timed_protocol"]

_LATE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class _TimedHeaders(HttpToolsProtocol):
    header_timeout_s = 10.0
    _headers_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._headers_timer is None:
            self._headers_timer = self.loop.call_later(self.header_timeout_s, self._late)

    def _disarm(self) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
            self._headers_timer = None

    def _late(self) -> None:
        self._headers_timer = None
        if not self.transport.is_closing():
            self.transport.write(_LATE)
            self.transport.close()

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def timed_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's ``http`` protocol class with the headers' deadline ``header_timeout_s``."""
    return type("TimedHeaders", (_TimedHeaders,), {"header_timeout_s": header_timeout_s})
