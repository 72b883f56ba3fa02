"""Failure-window preservation: copy an alert's raw telemetry, T-10 min to T+10 min, to tables
that retention never trims (``preserved_<table>``), for the run and the implicated nodes."""

from __future__ import annotations

from ..store.preserved_queries import copy_window, preserved_kinds
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
    for kind in preserved_kinds():
        copy_window(telemetry, kind, tenant, run_id, nodes, t0, t1, token)
