"""The JSON of the administration routes (:mod:`fleetlens.api.admin`): tokens, the audit log and
quotas, beside :mod:`fleetlens.api.models`, whose conventions these follow: camelCase on the
wire, unknown keys refused. The quotas keep their snake_case names, as the operator's CLI
(``fleetlens tenants quota``) and the tenants table name them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..store.access import TokenInfo
from .models import ApiModel

__all__ = [
    "AuditEntryOut",
    "AuditLogOut",
    "QuotasOut",
    "Role",
    "TokenCreatedOut",
    "TokenListOut",
    "TokenOut",
]

Role = Literal["ingest", "viewer", "editor", "admin", "oncall"]
"""Every role a token may have (:data:`fleetlens.store.scope.ROLES`)."""


class TokenOut(ApiModel):
    """An API token as listed: never its secret."""

    id: int
    prefix: str = Field(description="the token's first characters, to tell tokens apart")
    name: str = Field(description="who or what holds it")
    tenant: str
    project: str | None = Field(description="the one project it is limited to; null: all")
    role: Role
    created_at: float
    created_by: str
    revoked_at: float | None = Field(description="null while it works")

    @classmethod
    def of(cls, t: TokenInfo) -> TokenOut:
        return cls.model_validate(_token_fields(t))


def _token_fields(t: TokenInfo) -> dict[str, Any]:
    return {
        "id": t.id,
        "prefix": t.prefix,
        "name": t.name,
        "tenant": t.tenant,
        "project": t.project or None,
        "role": t.role,
        "created_at": t.created_at,
        "created_by": t.created_by,
        "revoked_at": t.revoked_at,
    }


class TokenCreatedOut(TokenOut):
    """A new token, with its secret: shown this once and never stored."""

    token: str = Field(description="the secret, to send as `Authorization: Bearer ...`")

    @classmethod
    def created(cls, plaintext: str, t: TokenInfo) -> TokenCreatedOut:
        return cls.model_validate({"token": plaintext, **_token_fields(t)})


class TokenListOut(ApiModel):
    """The tenant's tokens, oldest first."""

    tokens: list[TokenOut]


class AuditEntryOut(ApiModel):
    """Who did what, when, to what, from where."""

    id: int
    at: float
    actor: str
    action: str = Field(description="e.g. token.revoke, alert.ack, silence.create")
    target: str = Field(description="e.g. token:3, alert:17")
    detail: dict[str, Any] = Field(description="what the action recorded; its keys vary by action")
    remote: str = Field(description="the caller's address")


class AuditLogOut(ApiModel):
    """The tenant's audit log, newest first."""

    entries: list[AuditEntryOut]


class QuotasOut(ApiModel):
    """The tenant's quotas (0 = unlimited) and its usage."""

    ingest_bytes_per_s: int = Field(alias="ingest_bytes_per_s")
    stored_bytes: int = Field(alias="stored_bytes")
    eval_shards_in_flight: int = Field(alias="eval_shards_in_flight")
    ingested_bytes: int = Field(alias="ingested_bytes", description="ingested so far")
