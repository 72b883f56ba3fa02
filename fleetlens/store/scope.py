"""Who is asking: the caller's tenant, project and role, applied by the stores to every query.

An endpoint never builds a tenant filter itself: it hands the caller's :class:`Scope` to a store,
and the store scopes every statement with it. A request for another tenant's object therefore
finds nothing, and the API answers 404, not 403, so existence does not leak.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PERMISSIONS", "ROLES", "Scope"]

PERMISSIONS: dict[str, frozenset[str]] = {
    # What a training job or a node agent holds: write telemetry, read nothing else.
    "ingest": frozenset({"ingest"}),
    "viewer": frozenset({"read"}),
    "editor": frozenset({"read", "write", "ingest", "remediate"}),
    "admin": frozenset({"read", "write", "ingest", "admin", "remediate"}),
    # Infrastructure on-call: nodes and GPUs of every tenant, none of their runs' contents; it
    # approves taking a bad node out of any tenant's run (fleetlens/remediation).
    "oncall": frozenset({"read:infra", "remediate"}),
}
ROLES = tuple(PERMISSIONS)


@dataclass(frozen=True)
class Scope:
    tenant: str
    role: str
    project: str = ""  # empty: every project of the tenant
    actor: str = "local"
    token_id: int | None = None
    remote: str = ""

    def can(self, permission: str) -> bool:
        return permission in PERMISSIONS.get(self.role, frozenset())

    @property
    def cross_tenant_infra(self) -> bool:
        return self.can("read:infra")

    @classmethod
    def local(cls, remote: str = "") -> Scope:
        """The single local user of a loopback server without tokens."""
        return cls(tenant="default", role="admin", actor="local", remote=remote)
