"""Tenants, API tokens, quotas and the audit log, in the metadata database.

Tokens are random, shown once, and stored only as their SHA-256; a revoked token stops working
on the next request (nothing caches a token's validity). The audit log is append-only: this
module has no update or delete for it.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from ..errors import ConfigError, NotFound
from .metadata import MetadataStore
from .models import ApiToken, AuditEntry, Tenant
from .scope import ROLES, Scope
from .scoped import all_tenants, scoped

__all__ = ["QUOTA_FIELDS", "AccessStore", "TokenInfo"]

TOKEN_PREFIX = "fl_"
QUOTA_FIELDS = ("ingest_bytes_per_s", "stored_bytes", "eval_shards_in_flight")


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    id: int
    prefix: str
    name: str
    tenant: str
    project: str
    role: str
    created_at: float
    created_by: str
    revoked_at: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "prefix": self.prefix,
            "name": self.name,
            "tenant": self.tenant,
            "project": self.project or None,
            "role": self.role,
            "createdAt": self.created_at,
            "createdBy": self.created_by,
            "revokedAt": self.revoked_at,
        }


def _info(t: ApiToken) -> TokenInfo:
    return TokenInfo(
        t.id,
        t.prefix,
        t.name,
        t.tenant,
        t.project,
        t.role,
        t.created_at,
        t.created_by,
        t.revoked_at,
    )


class AccessStore:
    def __init__(self, metadata: MetadataStore) -> None:
        self._session = metadata.session  # one database, one session factory

    def ensure_tenant(self, name: str) -> None:
        with self._session() as s:
            if s.scalars(select(Tenant).where(Tenant.name == name)).first() is None:
                s.add(
                    Tenant(
                        name=name,
                        created_at=time.time(),
                        ingest_bytes_per_s=0,
                        stored_bytes=0,
                        eval_shards_in_flight=0,
                        ingested_bytes=0,
                    )
                )

    def create_token(
        self,
        tenant: str,
        role: str,
        *,
        project: str = "",
        name: str = "",
        actor: Scope | None = None,
    ) -> tuple[str, TokenInfo]:
        """A new token; the plaintext is returned once and never stored."""
        if role not in ROLES:
            raise ConfigError(f"role {role!r} is not known; roles: {', '.join(ROLES)}")
        if not tenant or len(tenant) > 256:
            raise ConfigError("a token needs a tenant name of 1-256 characters")
        self.ensure_tenant(tenant)
        plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
        by = actor.actor if actor else "cli"
        with self._session() as s:
            row = ApiToken(
                token_hash=_hash(plaintext),
                prefix=plaintext[:10],
                name=name,
                tenant=tenant,
                project=project,
                role=role,
                created_at=time.time(),
                created_by=by,
                revoked_at=None,
            )
            s.add(row)
            s.flush()
            info = _info(row)
        self.audit(
            tenant,
            by,
            "token.create",
            f"token:{info.id}",
            {"role": role, "project": project, "name": name},
            actor.remote if actor else "",
        )
        return plaintext, info

    def authenticate(self, plaintext: str, remote: str = "") -> Scope | None:
        with self._session() as s:
            # A token is looked up before anyone knows its tenant: that is what it tells.
            q = all_tenants(select(ApiToken)).where(ApiToken.token_hash == _hash(plaintext))
            row = s.scalars(q).first()
            if row is None or row.revoked_at is not None:
                return None
            return Scope(
                tenant=row.tenant,
                role=row.role,
                project=row.project,
                actor=row.name or row.prefix,
                token_id=row.id,
                remote=remote,
            )

    def list_tokens(self, scope: Scope) -> list[TokenInfo]:
        with self._session() as s:
            rows = s.scalars(scoped(select(ApiToken), scope).order_by(ApiToken.id)).all()
            return [_info(r) for r in rows]

    def revoke_token(self, scope: Scope, token_id: int) -> TokenInfo:
        with self._session() as s:
            row = s.scalars(scoped(select(ApiToken), scope).where(ApiToken.id == token_id)).first()
            if row is None:
                raise NotFound(f"token {token_id} does not exist")
            if row.revoked_at is None:
                row.revoked_at = time.time()
            info = _info(row)
        self.audit(
            scope.tenant,
            scope.actor,
            "token.revoke",
            f"token:{token_id}",
            {"role": info.role},
            scope.remote,
        )
        return info

    def has_admin_token(self) -> bool:
        with self._session() as s:
            n = s.scalar(
                all_tenants(select(func.count()).select_from(ApiToken)).where(
                    ApiToken.role == "admin", ApiToken.revoked_at.is_(None)
                )
            )
            return bool(n)

    def audit(
        self,
        tenant: str,
        actor: str,
        action: str,
        target: str = "",
        detail: dict[str, Any] | None = None,
        remote: str = "",
    ) -> None:
        with self._session() as s:
            s.add(
                AuditEntry(
                    at=time.time(),
                    tenant=tenant,
                    actor=actor,
                    action=action,
                    target=target,
                    detail=detail or {},
                    remote=remote,
                )
            )

    def audit_log(self, scope: Scope, limit: int = 100, since: float = 0.0) -> list[dict[str, Any]]:
        with self._session() as s:
            rows = s.scalars(
                scoped(select(AuditEntry), scope)
                .where(AuditEntry.at >= since)
                .order_by(AuditEntry.id.desc())
                .limit(limit)
            ).all()
            return [
                {
                    "id": r.id,
                    "at": r.at,
                    "actor": r.actor,
                    "action": r.action,
                    "target": r.target,
                    "detail": r.detail,
                    "remote": r.remote,
                }
                for r in rows
            ]

    def quotas(self, tenant: str) -> dict[str, int]:
        """The tenant's quotas (0 = unlimited) and its ingested bytes so far."""
        with self._session() as s:
            row = s.scalars(select(Tenant).where(Tenant.name == tenant)).first()
            if row is None:
                return {**dict.fromkeys(QUOTA_FIELDS, 0), "ingested_bytes": 0}
            return {
                **{f: int(getattr(row, f)) for f in QUOTA_FIELDS},
                "ingested_bytes": int(row.ingested_bytes),
            }

    def set_quotas(self, scope: Scope, tenant: str, values: dict[str, int]) -> dict[str, int]:
        unknown = set(values) - set(QUOTA_FIELDS)
        if unknown:
            raise ConfigError(f"unknown quota {sorted(unknown)}; quotas: {list(QUOTA_FIELDS)}")
        if any(v < 0 for v in values.values()):
            raise ConfigError("quotas are >= 0 (0 means unlimited)")
        self.ensure_tenant(tenant)
        with self._session() as s:
            row = s.scalars(select(Tenant).where(Tenant.name == tenant)).one()
            before = {f: int(getattr(row, f)) for f in values}
            for f, v in values.items():
                setattr(row, f, int(v))
        self.audit(
            tenant,
            scope.actor,
            "quota.change",
            f"tenant:{tenant}",
            {"before": before, "after": values},
            scope.remote,
        )
        return self.quotas(tenant)

    def add_ingested(self, counts: dict[str, int]) -> None:
        """Add bytes ingested per tenant (the collector batches these)."""
        for tenant, n in counts.items():
            self.ensure_tenant(tenant)
            with self._session() as s:
                row = s.scalars(select(Tenant).where(Tenant.name == tenant)).one()
                row.ingested_bytes = int(row.ingested_bytes) + int(n)
