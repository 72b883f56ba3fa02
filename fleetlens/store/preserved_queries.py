"""Failure windows' telemetry: the copy of a run's raw rows around a failure to the
``preserved_<table>`` tables (which retention never trims), and the reads of what a window kept.

A window of run ``{run:String}`` over [``{t0:Float64}``, ``{t1:Float64}``) keeps the run's own
rows, or for a per-node kind the implicated ``{nodes:Array(String)}`` (every node the run was
placed on when none is). Windows that overlap copy the same rows twice; the reads are
``DISTINCT`` so each row shows once per window.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ..schema import KINDS, RecordKind
from .ddl import PRESERVED, time_column
from .reader import TenantReader
from .telemetry import TelemetryStore

__all__ = ["PreservedQueries", "copy_window", "preserved_kinds"]

_COPIED = "tenant = {t:String} AND "
"""The copy's own tenant predicate: an INSERT runs as a command, where the reader adds none."""


def preserved_kinds() -> list[RecordKind]:
    """The record kinds a failure window keeps, in schema order."""
    return [kind for kind in KINDS.values() if kind.table in PRESERVED]


def _window(kind: RecordKind, nodes: list[str], own: str = "") -> str:
    """The predicate of the rows of ``kind`` in a window, ``{db}`` for the database; ``own``
    leads the predicate of each table read (the copy's tenant)."""
    if "run_id" in kind.ctx:
        where = "run_id = {run:String}"
    elif nodes:
        where = "node_id IN {nodes:Array(String)}"
    else:
        where = (
            "node_id IN (SELECT DISTINCT node_id FROM {db}.placement WHERE "
            f"{own}run_id = {{run:String}})"
        )
    t = time_column(kind)
    return f"{own}{where} AND `{t}` >= {{t0:Float64}} AND `{t}` < {{t1:Float64}}"


def _params(run_id: str, nodes: list[str], t0: float, t1: float) -> dict[str, Any]:
    return {"run": run_id, "nodes": list(nodes), "t0": t0, "t1": t1}


def copy_window(
    telemetry: TelemetryStore,
    kind: RecordKind,
    tenant: str,
    run_id: str,
    nodes: list[str],
    t0: float,
    t1: float,
    token: str,
) -> None:
    """Copy the tenant's rows of ``kind`` in the window to ``preserved_<table>``; a copy
    retried with the same ``token`` is stored once."""
    db = telemetry.database
    where = _window(kind, nodes, _COPIED).replace("{db}", db)
    telemetry.command_params(
        f"INSERT INTO {db}.preserved_{kind.table} SELECT * FROM {db}.{kind.table} "
        f"WHERE {where} SETTINGS insert_deduplication_token = '{token}:{kind.table}'",
        {"t": tenant, **_params(run_id, nodes, t0, t1)},
    )


class PreservedQueries:
    def __init__(self, reader: TenantReader) -> None:
        self.r = reader

    def kept_count(
        self, kind: RecordKind, run_id: str, nodes: list[str], t0: float, t1: float
    ) -> int:
        """How many distinct rows of ``kind`` the window kept."""
        rows = self.r.rows(
            f"SELECT count() AS n FROM (SELECT DISTINCT * FROM {{db}}.preserved_{kind.table} "
            f"WHERE {_window(kind, nodes)})",
            **_params(run_id, nodes, t0, t1),
        )
        return int(rows[0]["n"]) if rows else 0

    def kept_rows(
        self,
        kind: RecordKind,
        run_id: str,
        nodes: list[str],
        t0: float,
        t1: float,
        limit: int,
        offset: int,
    ) -> pa.Table:
        """The window's distinct rows of ``kind`` in time order, ``limit`` from ``offset``."""
        t = time_column(kind)
        order = ", ".join(f"`{c}`" for c in (t, *kind.order_by) if c != "tenant")
        return self.r.table(
            f"SELECT DISTINCT * FROM {{db}}.preserved_{kind.table} WHERE {_window(kind, nodes)} "
            f"ORDER BY {order} LIMIT {{limit:UInt64}} OFFSET {{offset:UInt64}}",
            limit=limit,
            offset=offset,
            **_params(run_id, nodes, t0, t1),
        )
