"""Authentication and authorization: every route states the permission it needs.

``Authorization: Bearer <token>`` maps to a :class:`~fleetlens.store.scope.Scope` (tenant,
project, role). A loopback server started without ``--auth required`` also serves requests
without a token, as the single local user (tenant ``default``, role admin); a token, when given,
is always checked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from fastapi import HTTPException, Request

from ..store.scope import Scope

__all__ = ["ERROR_RESPONSES", "UNKNOWN_NAME_RESPONSE", "caller", "require", "require_any"]

_ERROR = {
    "application/json": {
        "schema": {
            "type": "object",
            "properties": {"error": {"type": "string"}, "detail": {}},
        }
    }
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "Bad request; the message names what is wrong", "content": _ERROR},
    401: {"description": "No token, or an unknown or revoked one", "content": _ERROR},
    403: {"description": "The token's role does not allow this", "content": _ERROR},
    404: {"description": "No such object visible to the caller", "content": _ERROR},
    503: {"description": "A store is unavailable; retry after Retry-After", "content": _ERROR},
}
# A route that takes a name from a fixed table (an accelerator): its 422 is either the
# framework's validation answer or an UnknownName, whose `detail` is the message.
UNKNOWN_NAME_RESPONSE: dict[int | str, dict[str, Any]] = {
    422: {
        "description": "A field fails validation, or a name (an accelerator, a dtype) is not "
        "in the table; the message lists the known ones",
        "content": _ERROR,
    }
}


async def caller(request: Request) -> Scope:
    svc: Any = request.app.state.services
    remote = request.client.host if request.client else ""
    header = request.headers.get("authorization", "")
    if not header:
        if svc.auth_required:
            raise HTTPException(
                401,
                "this server requires a token: send Authorization: Bearer <token>",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return Scope.local(remote)
    kind, _, token = header.partition(" ")
    if kind.lower() != "bearer" or not token.strip():
        raise HTTPException(
            401, "use Authorization: Bearer <token>", headers={"WWW-Authenticate": "Bearer"}
        )
    scope: Scope | None
    known, scope = svc.access.cached_scope(token.strip(), remote)  # no thread hop when cached
    if not known:
        scope = await anyio.to_thread.run_sync(svc.access.authenticate, token.strip(), remote)
    if scope is None:
        raise HTTPException(
            401,
            "token is unknown or revoked",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    return scope


def require_any(*permissions: str) -> Callable[[Request], Awaitable[Scope]]:
    """A dependency that yields the caller's scope if its role grants one of ``permissions``."""

    async def dependency(request: Request) -> Scope:
        scope = await caller(request)
        if not any(scope.can(p) for p in permissions):
            raise HTTPException(403, f"role {scope.role!r} may not {' or '.join(permissions)}")
        return scope

    dependency.__name__ = "require_" + "_or_".join(p.replace(":", "_") for p in permissions)
    return dependency


def require(permission: str) -> Callable[[Request], Awaitable[Scope]]:
    """A dependency that yields the caller's scope if its role grants ``permission``."""

    async def dependency(request: Request) -> Scope:
        scope = await caller(request)
        if not scope.can(permission):
            raise HTTPException(403, f"role {scope.role!r} may not {permission}")
        return scope

    dependency.__name__ = f"require_{permission.replace(':', '_')}"
    return dependency
