"""Tenants, API tokens, quotas and the audit log, in the metadata database.

Tokens are random, shown once, and stored only as their SHA-256. What a token maps to (or that it
maps to nothing) is cached for :data:`TOKEN_TTL_S` (one second): every request of a thousand-rank
job would otherwise be a database read, and a revoked token still stops working within a second,
on every server sharing the database (at once on the server that revoked it). The audit log is
append-only: this module has no update or delete for it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import threading
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
TOKEN_TTL_S = 1.0
_CACHE_MAX = 10_000  # tokens remembered at once (a flood of made-up ones cannot grow it)
QUOTA_FIELDS = ("ingest_bytes_per_s", "stored_bytes", "eval_shards_in_flight")


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    """An API token as the store knows it: never its secret; ``project`` "" for all."""

    id: int
    prefix: str
    name: str
    tenant: str
    project: str
    role: str
    created_at: float
    created_by: str
    revoked_at: float | None


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
        self._tokens: dict[str, tuple[float, Scope | None]] = {}
        self._tokens_lock = threading.Lock()

    def cached_scope(self, plaintext: str, remote: str = "") -> tuple[bool, Scope | None]:
        """(known, scope) from the last second's lookups, without touching the database."""
        hit = self._tokens.get(_hash(plaintext))
        if hit is None or hit[0] < time.monotonic():
            return False, None
        scope = hit[1]
        return True, dataclasses.replace(scope, remote=remote) if scope is not None else None

    def _remember(self, digest: str, scope: Scope | None) -> None:
        with self._tokens_lock:
            if len(self._tokens) >= _CACHE_MAX:
                now = time.monotonic()
                self._tokens = {k: v for k, v in self._tokens.items() if v[0] >= now}
                if len(self._tokens) >= _CACHE_MAX:
                    self._tokens.clear()
            self._tokens[digest] = (time.monotonic() + TOKEN_TTL_S, scope)

    def forget_tokens(self) -> None:
        """Drop the cache (a token was revoked here: it stops working at once)."""
        with self._tokens_lock:
            self._tokens.clear()

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
        known, cached = self.cached_scope(plaintext, remote)
        if known:
            return cached
        digest = _hash(plaintext)
        with self._session() as s:
            # A token is looked up before anyone knows its tenant: that is what it tells.
            q = all_tenants(select(ApiToken)).where(ApiToken.token_hash == digest)
            row = s.scalars(q).first()
            scope = None
            if row is not None and row.revoked_at is None:
                scope = Scope(
                    tenant=row.tenant,
                    role=row.role,
                    project=row.project,
                    actor=row.name or row.prefix,
                    token_id=row.id,
                )
        self._remember(digest, scope)
        return dataclasses.replace(scope, remote=remote) if scope is not None else None

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
        self.forget_tokens()
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
