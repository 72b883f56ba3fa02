"""Administration: API tokens, the audit log and the tenant's quotas (role admin).

Quotas are read here but set by the platform's operator (``fleetlens tenants quota``), not by
the tenant's own admins. For the same reason a tenant's admin grants only its tenant's roles:
``oncall`` spans every tenant's hardware and remediations, so only the operator mints it, with
``fleetlens tokens create --role oncall`` on the server's data directory.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

import anyio
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from ..errors import FleetlensError
from ..store.access import QUOTA_FIELDS
from ..store.scope import ROLES, Scope
from .admin_models import (
    AuditLogOut,
    QuotasOut,
    Role,
    TokenCreatedOut,
    TokenListOut,
    TokenOut,
)
from .auth import ERROR_RESPONSES, require

__all__ = ["router"]

# Request bodies take JSON as it is: no 0 for false, no false for 0, no "1" for 1.
STRICT = ConfigDict(strict=True)

router = APIRouter(prefix="/v1", tags=["admin"], responses=ERROR_RESPONSES)

Admin = Annotated[Scope, Depends(require("admin"))]


if set(ROLES) != set(get_args(Role)):  # keep the schema's enum and the roles table one list
    raise FleetlensError("Role literal out of date with fleetlens.store.scope.ROLES")
if {f.alias for f in QuotasOut.model_fields.values()} != {*QUOTA_FIELDS, "ingested_bytes"}:
    raise FleetlensError("QuotasOut out of date with fleetlens.store.access.QUOTA_FIELDS")
# What a tenant's admin may grant: roles confined to its own tenant (not ``oncall``).
TenantRole = Literal["ingest", "viewer", "editor", "admin"]
OPERATOR_ROLES = frozenset(get_args(Role)) - frozenset(get_args(TenantRole))


class TokenRequest(BaseModel):
    model_config = STRICT

    role: str = Field(
        description="what the token may do: ingest, viewer, editor or admin (`oncall` spans "
        "tenants and is created by the platform operator's CLI only)",
        json_schema_extra={"enum": list(get_args(TenantRole))},
    )
    project: str = Field(
        "", max_length=256, description="limit the token to one project; empty: all"
    )
    name: str = Field("", max_length=256, description="who or what holds it")


def _access(request: Request) -> Any:
    return request.app.state.services.access


@router.post(
    "/tokens",
    status_code=201,
    summary="Create an API token in the caller's tenant",
    response_model=TokenCreatedOut,
)
async def create_token(request: Request, body: TokenRequest, scope: Admin) -> TokenCreatedOut:
    if body.role in OPERATOR_ROLES:
        raise HTTPException(
            403,
            f"role {body.role!r} spans every tenant; the platform operator creates it with "
            f"`fleetlens tokens create --data DIR --tenant {scope.tenant} --role {body.role}`",
        )
    if body.role not in get_args(TenantRole):
        raise HTTPException(
            400, f"role {body.role!r} is unknown; use one of {', '.join(get_args(TenantRole))}"
        )
    if scope.project and body.project != scope.project:
        raise HTTPException(403, "a project-scoped admin creates tokens for its project only")
    plaintext, info = await anyio.to_thread.run_sync(
        lambda: _access(request).create_token(
            scope.tenant, body.role, project=body.project, name=body.name, actor=scope
        )
    )
    return TokenCreatedOut.created(plaintext, info)


@router.get(
    "/tokens", summary="List the tenant's tokens (never their secrets)", response_model=TokenListOut
)
async def list_tokens(request: Request, scope: Admin) -> TokenListOut:
    tokens = await anyio.to_thread.run_sync(_access(request).list_tokens, scope)
    return TokenListOut(tokens=[TokenOut.of(t) for t in tokens])


@router.delete(
    "/tokens/{token_id}",
    summary="Revoke a token; it stops working at once",
    response_model=TokenOut,
)
async def revoke_token(
    request: Request, token_id: Annotated[int, Path(ge=1, le=2**62)], scope: Admin
) -> TokenOut:
    info = await anyio.to_thread.run_sync(_access(request).revoke_token, scope, token_id)
    return TokenOut.of(info)


@router.get("/audit", summary="The tenant's audit log, newest first", response_model=AuditLogOut)
async def audit(
    request: Request,
    scope: Admin,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    since: Annotated[float, Query(ge=0, le=1e12, allow_inf_nan=False)] = 0.0,
) -> AuditLogOut:
    entries = await anyio.to_thread.run_sync(_access(request).audit_log, scope, limit, since)
    return AuditLogOut.model_validate({"entries": entries})


@router.get(
    "/quotas",
    summary="The tenant's quotas (0 = unlimited) and usage",
    response_model=QuotasOut,
)
async def get_quotas(request: Request, scope: Admin) -> QuotasOut:
    quotas = await anyio.to_thread.run_sync(_access(request).quotas, scope.tenant)
    return QuotasOut.model_validate(quotas)
