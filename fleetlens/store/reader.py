"""Tenant scoping of telemetry reads, in one place.

Every read of the telemetry tables goes through a :class:`TenantReader` bound to the caller's
tenant: it substitutes the store's database for ``{db}``, binds ``tenant`` itself (a caller
cannot pass another), and refuses a statement that does not filter on ``{tenant:String}``, so a
query that forgot the tenant predicate fails in the tests instead of leaking another tenant's
rows. The one cross-tenant read (node events for infrastructure on-call) must say so.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ..errors import StoreError
from .scope import Scope
from .telemetry import TelemetryStore

__all__ = ["TenantReader"]

TENANT_PREDICATE = "{tenant:String}"


class TenantReader:
    def __init__(self, telemetry: TelemetryStore, tenant: str | Scope) -> None:
        self.telemetry = telemetry
        self.db = telemetry.database
        self.scope = tenant if isinstance(tenant, Scope) else None
        self.tenant = tenant if isinstance(tenant, str) else tenant.tenant

    def table(self, sql: str, **params: Any) -> pa.Table:
        """A read scoped to the tenant; ``{name:Type}`` placeholders bound from ``params``."""
        if TENANT_PREDICATE not in sql:
            raise StoreError(f"telemetry read without the tenant predicate: {sql[:200]}")
        if "tenant" in params:
            raise StoreError("the tenant is bound by the reader, not by the caller")
        params["tenant"] = self.tenant
        return self.telemetry.query(sql.replace("{db}", self.db), params)

    def rows(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        return list(self.table(sql, **params).to_pylist())

    def infra_table(self, sql: str, **params: Any) -> pa.Table:
        """A read across every tenant, for a scope that holds ``read:infra`` (on-call); for any
        other scope the statement must filter on the tenant as :meth:`table` requires."""
        if self.scope is not None and self.scope.cross_tenant_infra:
            return self.telemetry.query(sql.replace("{db}", self.db), params)
        return self.table(sql, **params)
