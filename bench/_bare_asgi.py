"""The floor of an HTTP ingest route in Python: an ASGI app that reads a request's whole body
and answers 200 with a small JSON object, nothing else (bench/ingest_cost.py runs it under the
same uvicorn, event loop and HTTP parser as ``fleetlens serve``)."""

from __future__ import annotations

from typing import Any

__all__ = ["app"]

_ANSWER = b'{"status":"ok"}'
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"15")]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _ANSWER})
