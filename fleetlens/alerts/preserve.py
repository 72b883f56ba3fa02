"""Failure-window preservation: copy an alert's raw telemetry, T-10 min to T+10 min, to tables
that retention never trims (``preserved_<table>``), for the run and the implicated nodes."""

from __future__ import annotations

from ..schema import KINDS
from ..store.ddl import PRESERVED
from ..store.telemetry import TelemetryStore

__all__ = ["preserve_window"]


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
    for kind in KINDS.values():
        if kind.table not in PRESERVED:
            continue
        if "run_id" in kind.ctx:
            where = "run_id = {run:String}"
        elif nodes:
            where = "node_id IN {nodes:Array(String)}"
        else:  # every node the run was placed on
            where = (
                f"node_id IN (SELECT DISTINCT node_id FROM {db}.placement WHERE "
                "tenant = {tenant:String} AND run_id = {run:String})"
            )
        t = "enter" if "enter" in kind.by_name else "time"
        telemetry.command_params(
            f"INSERT INTO {db}.preserved_{kind.table} SELECT * FROM {db}.{kind.table} "
            f"WHERE tenant = {{tenant:String}} AND {where} AND `{t}` >= {{t0:Float64}} "
            f"AND `{t}` < {{t1:Float64}} SETTINGS insert_deduplication_token = "
            f"'{token}:{kind.table}'",
            {"tenant": tenant, "run": run_id, "nodes": nodes, "t0": t0, "t1": t1},
        )
