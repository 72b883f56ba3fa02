"""Failure-window preservation: copy an alert's raw telemetry, T-10 min to T+10 min, to tables
that retention never trims (``preserved_<table>``), for the run and the implicated nodes."""

from __future__ import annotations

from ..schema import KINDS, RecordKind
from ..store.ddl import PRESERVED
from ..store.telemetry import TelemetryStore

__all__ = ["preserve_window", "preserved_kinds", "time_column", "window_where"]


def preserved_kinds() -> list[RecordKind]:
    """The record kinds a failure window keeps, in schema order."""
    return [kind for kind in KINDS.values() if kind.table in PRESERVED]


def time_column(kind: RecordKind) -> str:
    """The column a window's bounds apply to: a collective's ``enter``, else ``time``."""
    return "enter" if "enter" in kind.by_name else "time"


def window_where(kind: RecordKind, nodes: list[str]) -> str:
    """The rows of ``kind`` a window of run ``{run:String}`` keeps, as a ClickHouse predicate
    (with the tenant's, ``{db}`` for the database): the run's own rows, or for a per-node kind
    the implicated ``{nodes:Array(String)}`` (every node the run was placed on when none is)."""
    if "run_id" in kind.ctx:
        where = "run_id = {run:String}"
    elif nodes:
        where = "node_id IN {nodes:Array(String)}"
    else:
        where = (
            "node_id IN (SELECT DISTINCT node_id FROM {db}.placement WHERE "
            "tenant = {tenant:String} AND run_id = {run:String})"
        )
    return "tenant = {tenant:String} AND " + where


def preserve_window(
    telemetry: TelemetryStore,
    tenant: str,
    run_id: str,
    nodes: list[str],
    t0: float,
    t1: float,
    token: str,
) -> None:
    """Copy rows in [t0, t1); idempotent per ``token`` (a retried copy is stored once)."""
    db = telemetry.database
    for kind in preserved_kinds():
        where = window_where(kind, nodes).replace("{db}", db)
        t = time_column(kind)
        telemetry.command_params(
            f"INSERT INTO {db}.preserved_{kind.table} SELECT * FROM {db}.{kind.table} "
            f"WHERE {where} AND `{t}` >= {{t0:Float64}} AND `{t}` < {{t1:Float64}} "
            f"SETTINGS insert_deduplication_token = '{token}:{kind.table}'",
            {"tenant": tenant, "run": run_id, "nodes": nodes, "t0": t0, "t1": t1},
        )
