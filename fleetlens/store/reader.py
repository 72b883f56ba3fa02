"""Tenant scoping of telemetry reads, in one place.

Every read of the telemetry tables goes through a :class:`TenantReader` bound to the caller's
tenant. The reader adds the tenant's filter to every tenant table the statement reads, at the
engine (ClickHouse's ``additional_table_filters``): a statement names its tables and its own
predicates, never the tenant, so no query can forget it, and the filter reaches every subquery,
join and ``UNION`` branch; the primary key (which leads with ``tenant``) still prunes by it. A
statement that writes a tenant predicate or binds ``tenant`` itself is refused, so the one way
stays the only way. The one cross-tenant read (node events for infrastructure on-call) must say
so (:meth:`TenantReader.infra_table`).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import StoreError
from .scope import Scope
from .telemetry import TelemetryStore

__all__ = ["TenantReader", "tenant_tables"]

HAND_WRITTEN = re.compile(r"\{tenant\s*:")
"""A statement that binds the tenant itself: the reader's filter is the only tenant predicate."""


@dataclass(frozen=True)
class _Tables:
    every: frozenset[str]  # every table and view of the store's database (names)
    tenant: frozenset[str]  # those with a ``tenant`` column (``db.name``)


_tables: weakref.WeakKeyDictionary[Any, _Tables] = weakref.WeakKeyDictionary()
_tables_lock = threading.Lock()


def tenant_tables(telemetry: TelemetryStore, named: Iterable[str] = ()) -> frozenset[str]:
    """The store's tables and views with a ``tenant`` column (``db.name``), from
    ``system.columns``; read again when a statement names a table made since (the evaluation
    examples' table is made when its service starts), so no table is read unfiltered."""
    with _tables_lock:
        known = _tables.get(telemetry)
    if known is not None and known.every.issuperset(named):
        return known.tenant
    db = telemetry.database
    cols = telemetry.query(
        "SELECT table, max(name = 'tenant') AS t FROM system.columns WHERE database = {db:String}"
        " GROUP BY table",
        {"db": db},
    ).to_pydict()
    pairs = list(zip(cols.get("table", []), cols.get("t", []), strict=True))
    tenant = frozenset(f"{db}.{t}" for t, has in pairs if has)
    known = _Tables(every=frozenset(t for t, _ in pairs), tenant=tenant)
    with _tables_lock:
        _tables[telemetry] = known
    return known.tenant


def _literal(value: str) -> str:
    """``value`` as a ClickHouse expression with no quote in it (it sits inside two levels of
    string literal in the setting)."""
    return f"unhex('{value.encode().hex()}')"


class TenantReader:
    def __init__(self, telemetry: TelemetryStore, tenant: str | Scope) -> None:
        self.telemetry = telemetry
        self.db = telemetry.database
        self.scope = tenant if isinstance(tenant, Scope) else None
        self.tenant = tenant if isinstance(tenant, str) else tenant.tenant

    def _filtered(self, sql: str, named: Iterable[str]) -> str:
        tables = tenant_tables(self.telemetry, named)
        if not tables:
            return sql
        cond = f"tenant = {_literal(self.tenant)}".replace("'", "\\'")
        filters = ", ".join(f"'{t}': '{cond}'" for t in sorted(tables))
        return f"{sql} SETTINGS additional_table_filters = {{{filters}}}"

    def table(self, sql: str, **params: Any) -> pa.Table:
        """A read of the tenant's rows only; ``{name:Type}`` placeholders bound from ``params``,
        ``{db}`` replaced by the store's database."""
        if HAND_WRITTEN.search(sql) or "tenant" in params:
            raise StoreError(
                "the reader adds the tenant's filter itself: a statement neither compares "
                f"nor binds the tenant ({sql[:120]})"
            )
        sql = sql.replace("{db}", self.db)
        named = set(re.findall(rf"\b{re.escape(self.db)}\.`?(\w+)", sql))
        return self.telemetry.query(self._filtered(sql, named), params)

    def rows(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        return list(self.table(sql, **params).to_pylist())

    def infra_table(self, sql: str, **params: Any) -> pa.Table:
        """A read across every tenant, for a scope that holds ``read:infra`` (on-call); for any
        other scope the tenant's rows only, as :meth:`table`."""
        if self.scope is not None and self.scope.cross_tenant_infra:
            return self.telemetry.query(sql.replace("{db}", self.db), params)
        return self.table(sql, **params)
