"""Tenant scoping of metadata queries, in one place.

Every statement over a tenant's table (runs, tokens, audit, findings, alerts, the run graph,
evaluations, remediations) is built through :func:`scoped`: it adds ``Model.tenant == tenant``
for each model it names (or, when none is named, each model the statement selects, updates or
deletes from) and, when the caller asks, the scope's project. A statement that reads every
tenant's rows on purpose (the monitoring loop's scans, authentication by token hash, metrics)
says so with :func:`all_tenants`; on-call's infrastructure view, every tenant for a
``read:infra`` scope and the caller's own tenant for any other, with :func:`infra_scoped`.
``tests/test_scoping.py`` fails on a tenant comparison written anywhere else and on a statement
over a tenant's table built outside these functions, so a forgotten filter shows up in the
tests instead of as another tenant's rows.

Telemetry reads follow the same rule through :class:`~.reader.TenantReader`.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, TypeVar

from sqlalchemy import ColumnElement

from ..errors import StoreError
from .scope import Scope

__all__ = ["Within", "all_tenants", "infra_scoped", "same_tenant", "scoped", "tenant_of"]

Within = Literal["tenant", "project", "project_or_unassigned"]
"""How far a scope reaches: its whole tenant; only its project when it has one (a
project-scoped token); or its project and the tenant's rows that belong to no project."""

_S = TypeVar("_S", bound="_Statement")


class _Statement(Protocol):
    """What SQLAlchemy's ``select``, ``update`` and ``delete`` share here."""

    def where(self: _S, *whereclause: Any) -> _S: ...


def tenant_of(who: Scope | str) -> str:
    return who if isinstance(who, str) else who.tenant


def _targets(stmt: Any) -> list[Any]:
    """The ORM classes a statement reads or writes, in order, without repeats."""
    if hasattr(stmt, "column_descriptions"):  # a SELECT
        found = [d.get("entity") for d in stmt.column_descriptions]
    else:  # an UPDATE or DELETE
        found = [getattr(stmt, "entity_description", {}).get("entity")]
    out: list[Any] = []
    for m in found:
        if m is not None and m not in out:
            out.append(m)
    return out


def scoped(stmt: _S, who: Scope | str, *models: Any, within: Within = "tenant") -> _S:
    """``stmt`` restricted to ``who``'s tenant, on each of ``models`` (default: the statement's
    own). With ``within`` other than ``"tenant"`` and a Scope that names a project, also to
    that project (the models must then have a ``project`` column)."""
    targets = list(models) or _targets(stmt)
    if not targets:
        raise StoreError(f"cannot tell which table to scope in {stmt}; name the model")
    tenant = tenant_of(who)
    project = who.project if isinstance(who, Scope) and within != "tenant" else ""
    conditions: list[ColumnElement[bool]] = []
    for model in targets:
        column = getattr(model, "tenant", None)
        if column is None:
            raise StoreError(f"{model!r} has no tenant column; it cannot be tenant-scoped")
        conditions.append(column == tenant)
        if project:
            pcol = getattr(model, "project", None)
            if pcol is None:
                raise StoreError(f"{model!r} has no project column; scope it with the tenant")
            conditions.append(pcol == project if within == "project" else pcol.in_(("", project)))
    return stmt.where(*conditions)


def all_tenants(stmt: _S) -> _S:
    """``stmt`` unchanged: it reads or writes every tenant's rows, on purpose (the server's own
    loops, authentication, metrics, or by an id the caller already checked)."""
    return stmt


def infra_scoped(stmt: _S, scope: Scope, *models: Any) -> _S:
    """Every tenant's rows for a scope that holds ``read:infra`` (on-call); the caller's own
    tenant's for any other scope."""
    return all_tenants(stmt) if scope.cross_tenant_infra else scoped(stmt, scope, *models)


def same_tenant(a: Any, b: Any) -> ColumnElement[bool]:
    """A join (or correlation) condition: ``a`` and ``b`` belong to the same tenant."""
    condition: ColumnElement[bool] = a.tenant == b.tenant
    return condition
