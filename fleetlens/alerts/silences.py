"""Silences, as Alertmanager users know them: label matchers and a window of time during which
the alerts they match keep firing (and show as silenced) but notify no one. When a silence ends
or is expired early, a still-firing alert it held back is notified at the next pass.

A tenant's writer silences that tenant's alerts; infrastructure on-call (role ``oncall``)
silences any tenant's infrastructure alerts (audience ``infra_oncall``), as it sees them on its
On-call page. Creating and expiring are audited.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import select

from ..errors import ConfigError, NotFound
from ..store.access import AccessStore
from ..store.metadata import MetadataStore
from ..store.scope import Scope
from ..store.scoped import all_tenants, scoped
from .models import Silence

__all__ = ["MAX_SILENCE_S", "ActiveSilences", "SilenceStore", "SilenceView"]

MAX_SILENCE_S = 30 * 86400.0
"""The longest a silence may last: longer, and it is a policy change (override the rule)."""


class SilenceAudit(msgspec.Struct, frozen=True, rename="camel"):
    """What the audit log records of a new silence (its ``detail``)."""

    matchers: dict[str, str]
    ends_at: float


@dataclass(frozen=True)
class SilenceView:
    """A silence: alerts matching all its matchers notify no one while it lasts."""

    id: int
    matchers: dict[str, str]
    """label -> value."""
    starts_at: float
    ends_at: float
    comment: str
    created_by: str
    created_at: float
    infra: bool
    """Made by infrastructure on-call, for every tenant."""
    tenant: str


def silence_view(s: Silence) -> SilenceView:
    return SilenceView(
        id=s.id,
        matchers=dict(s.matchers),
        starts_at=s.starts_at,
        ends_at=s.ends_at,
        comment=s.comment,
        created_by=s.created_by,
        created_at=s.created_at,
        infra=s.infra,
        tenant=s.tenant,
    )


@dataclass(frozen=True)
class ActiveSilences:
    """The silences in force at one moment for one tenant's alerts."""

    own: tuple[tuple[int, dict[str, str]], ...]
    infra: tuple[tuple[int, dict[str, str]], ...]

    def matching(self, labels: Mapping[str, str], audience: str) -> list[int]:
        """Ids of the silences that hold back an alert with these labels."""
        ids = [i for i, m in self.own if all(labels.get(k) == v for k, v in m.items())]
        if audience == "infra_oncall":
            ids += [i for i, m in self.infra if all(labels.get(k) == v for k, v in m.items())]
        return ids


class SilenceStore:
    def __init__(self, metadata: MetadataStore, access: AccessStore) -> None:
        self._session = metadata.session
        self.access = access

    def create(
        self,
        scope: Scope,
        matchers: dict[str, str],
        ends_at: float,
        comment: str,
        starts_at: float | None = None,
    ) -> SilenceView:
        now = time.time()
        start = now if starts_at is None else starts_at
        if not matchers or any(not k or not v for k, v in matchers.items()):
            raise ConfigError("a silence needs at least one matcher, each a label and a value")
        if not comment.strip():
            raise ConfigError("say why in the comment: whoever is paged next reads it")
        if not start < ends_at <= start + MAX_SILENCE_S:
            raise ConfigError(
                f"a silence ends after it starts and lasts at most {MAX_SILENCE_S / 86400:g} days"
            )
        if ends_at <= now:
            raise ConfigError("this silence would already be over")
        with self._session() as s:
            row = Silence(
                tenant=scope.tenant,
                infra=scope.cross_tenant_infra,
                matchers=dict(matchers),
                starts_at=start,
                ends_at=ends_at,
                comment=comment.strip(),
                created_by=scope.actor,
                created_at=now,
            )
            s.add(row)
            s.flush()
            out = silence_view(row)
        self.access.audit(
            scope.tenant,
            scope.actor,
            "silence.create",
            f"silence:{out.id}",
            msgspec.to_builtins(SilenceAudit(matchers, ends_at)),
            scope.remote,
        )
        return out

    def _visible(self, scope: Scope) -> Any:
        if scope.cross_tenant_infra:
            return all_tenants(select(Silence)).where(Silence.infra.is_(True))
        return scoped(select(Silence), scope)

    def list(self, scope: Scope, include_expired_s: float = 86400.0) -> list[SilenceView]:
        """Silences in force or to come, and those that ended in the last ``include_expired_s``."""
        since = time.time() - include_expired_s
        with self._session() as s:
            rows = s.scalars(
                self._visible(scope).where(Silence.ends_at >= since).order_by(Silence.id.desc())
            ).all()
            return [silence_view(r) for r in rows]

    def expire(self, scope: Scope, silence_id: int) -> SilenceView:
        now = time.time()
        with self._session() as s:
            row = s.scalars(self._visible(scope).where(Silence.id == silence_id)).first()
            if row is None:
                raise NotFound(f"silence {silence_id} does not exist")
            row.ends_at = min(row.ends_at, now)
            out = silence_view(row)
        self.access.audit(
            scope.tenant, scope.actor, "silence.expire", f"silence:{silence_id}", {}, scope.remote
        )
        return out


def active(session: Any, tenant: str, now: float) -> ActiveSilences:
    """The silences in force at ``now`` for ``tenant``'s alerts: its own, and on-call's (for its
    infrastructure alerts), read in the caller's session."""

    def now_on(q: Any) -> list[tuple[int, dict[str, str]]]:
        q = q.where(Silence.starts_at <= now, Silence.ends_at > now)
        return [(r.id, dict(r.matchers)) for r in session.scalars(q).all()]

    own = now_on(scoped(select(Silence), tenant).where(Silence.infra.is_(False)))
    infra = now_on(all_tenants(select(Silence)).where(Silence.infra.is_(True)))
    return ActiveSilences(tuple(own), tuple(infra))
