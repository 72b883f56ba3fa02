"""Security headers on every answer: no content sniffing anywhere; on HTML pages no framing
(clickjacking) and a Content-Security-Policy that lets a page run only the server's own scripts
(and the run page's one inline script, by its hash) and talk only to the server."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .templates import EARLY_OVERVIEW

__all__ = ["CSP", "SecurityHeaders"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]  # fmt: skip


def _sha256(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


_INLINE = re.findall(r"<script>(.*?)</script>", EARLY_OVERVIEW, re.S)
CSP = (
    "default-src 'self'; script-src 'self' " + " ".join(map(_sha256, _INLINE)) + "; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# The OpenAPI explorer (/docs) is FastAPI's page with its own inline script: framing only.
_DOCS_CSP = "frame-ancestors 'none'"


class SecurityHeaders:
    """Pure ASGI middleware (nothing per request but a header list on the response start)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        docs = str(scope.get("path", "")).startswith(("/docs", "/redoc"))

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-content-type-options", b"nosniff"))
                ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                if ctype.startswith(b"text/html"):
                    headers.append((b"x-frame-options", b"DENY"))
                    headers.append((b"referrer-policy", b"same-origin"))
                    policy = _DOCS_CSP if docs else CSP
                    headers.append((b"content-security-policy", policy.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)
