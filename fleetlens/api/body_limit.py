"""One body budget for every route: the JSON routes' bodies read under a limit and a deadline.

The ingest and upload routes read their own bodies (:mod:`fleetlens.api.bodies`: a size limit
of their own, a deadline, the shared memory budget); they say so with :data:`OWN_BODY` in their
``openapi_extra``. Every other request's body is read here, before routing, the same way and
under ``collector.max_json_body_bytes``: a body declared larger is refused at once with 413
naming the limit (what it sends meanwhile is read and discarded for a few seconds, so that it
sees the answer), a chunked one as soon as it passes it, a trickle with 408 after the deadline
(``collector.body_grace_s``), and a body that finds the shared budget spent with 429. The route
then gets the body from memory. Without this a 256 MiB ``describe`` was read whole (3 GB of
resident memory for three at once) and a sender a byte a second held its connection forever.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from .bodies import BodyBudget, BodyRefused, drain, read_body
from .ingest import error_response

__all__ = ["OWN_BODY", "BodyLimit"]

OWN_BODY = "x-fleetlens-own-body"
"""The ``openapi_extra`` key of a route that reads its body itself, under its own limit."""


def _has_body(scope: AsgiScope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return value not in (b"0", b"")
        if name == b"transfer-encoding":
            return True
    return False


class BodyLimit:
    """Reads the body of every request whose route does not read its own (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._own: list[re.Pattern[str]] | None = None

    def _reads_own(self, scope: AsgiScope) -> bool:
        if self._own is None:
            self._own = [
                r.path_regex
                for r in scope["app"].routes
                if isinstance(r, APIRoute) and (r.openapi_extra or {}).get(OWN_BODY)
            ]
        return any(p.match(scope["path"]) for p in self._own)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope) or self._reads_own(scope):
            await self.app(scope, receive, send)
            return
        state: Any = scope["app"].state
        collector = state.services.config.collector
        limit = collector.max_json_body_bytes
        request = Request(scope, receive)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await drain(request)  # read and discarded a few seconds: the client sees the 413
            refusal = error_response(
                413, f"body is {declared} bytes; the limit of this route is {limit} bytes"
            )
            refusal.headers["Connection"] = "close"
            await refusal(scope, receive, send)
            return
        budget: BodyBudget = state.body_budget
        try:
            body = await read_body(request, limit, budget, collector.body_grace_s)
        except BodyRefused as refused:
            if refused.status != 408:  # a slow sender is not waited for twice
                await drain(request)
            message = refused.message
            if refused.status == 413:
                message = f"{message} of this route"
            answer = error_response(refused.status, message, retry_after=refused.retry_after)
            if refused.status in (408, 413):
                answer.headers["Connection"] = "close"
            await answer(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # the disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        try:
            await self.app(scope, replay, send)
        finally:
            budget.give(len(body))
