"""Retention: which table keeps its rows how long, and bringing existing tables in line.

Rows expire ``days`` after the later of their own time and when they were stored (the
``_stored`` column), by a ``TTL`` on the table (:func:`fleetlens.store.ddl.ttl_sql`): the engine
drops them as it merges parts. The per-rank tables keep 30 days by default, the 10 s / 1 min
rollups a year; events, placement and scheduler tables, the per-step summary
``steps_by_step`` and the preserved failure windows (``preserved_<table>``) are kept forever
(a window is a copy of the raw rows taken as it happens, so it outlives them).

A table created before its retention was set, or under another one, is changed at startup
(``ALTER TABLE ... MODIFY TTL``, ``REMOVE TTL`` for 0), on chDB and on a server or cluster
alike; a table made before ``_stored`` existed gains it first, valued at the upgrade.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..config import RetentionConfig
from ..errors import ConfigError
from ..schema import KINDS
from .ddl import PRESERVED, STORED, Layout, create_statements, time_column, ttl_sql
from .rollups import ROLLUP_TABLES

__all__ = [
    "EXPIRING",
    "apply_retention",
    "ensure_schema",
    "retention_days",
    "stored_bytes",
]

EXPIRING = (
    "steps",
    "scalars",
    "collectives",
    "gpu_samples",
    "node_samples",
    "trace_steps",
    "trace_kernels",
)
"""The per-rank tables that ``retention.raw_days`` applies to."""

_OURS = re.compile(r" TTL greatest\(toDateTime\(\w+\), _stored\) \+ toIntervalDay\((\d+)\)")


def retention_days(cfg: RetentionConfig) -> tuple[tuple[str, int], ...]:
    """Days per table (0 or absent: forever) from the ``[retention]`` section."""
    names = {k.name: k.table for k in KINDS.values()}
    over = cfg.overrides()
    raw = over.pop("raw", cfg.raw_days)
    rollup = over.pop("rollups", cfg.rollup_days)
    days = {t: raw for t in EXPIRING}
    days.update({t: rollup for t in ROLLUP_TABLES})
    for name, n in over.items():
        table = names.get(name, name)
        if table not in names.values():
            raise ConfigError(f"retention names {name!r}, which is not a telemetry table")
        days[table] = n
    return tuple(sorted((t, n) for t, n in days.items() if n > 0))


def _ttl_targets(layout: Layout) -> dict[str, tuple[str, int]]:
    """Every table a TTL may apply to, as stored (``_local`` on a cluster) -> (time, days)."""
    sfx = "_local" if layout.cluster else ""
    out = {
        f"{k.table}{sfx}": (f"`{time_column(k)}`", layout.ttl_days(k.table)) for k in KINDS.values()
    }
    out.update({f"{t}{sfx}": ("`bucket`", layout.ttl_days(t)) for t in ROLLUP_TABLES})
    return out


def _col(table: Any, name: str) -> list[Any]:
    return list(table.column(name).to_pylist()) if table.num_rows else []


def _add_stored(store: Any, layout: Layout) -> None:
    """Give tables made before ``_stored`` existed the column, before a view selects it."""
    db = layout.database
    got = store.query(
        "SELECT table, countIf(name = {c:String}) AS has FROM system.columns "
        "WHERE database = {db:String} GROUP BY table",
        {"db": db, "c": STORED},
    )
    missing = {t for t, has in zip(_col(got, "table"), _col(got, "has"), strict=True) if not has}
    sfx = "_local" if layout.cluster else ""
    for kind in KINDS.values():
        tables = [kind.table + sfx, kind.table] if sfx else [kind.table]
        if kind.table in PRESERVED:
            tables += [f"preserved_{kind.table}"]
        for t in tables:
            if t not in missing:
                continue
            store.command(
                f"ALTER TABLE {db}.{t}{layout.on_cluster} "
                f"ADD COLUMN IF NOT EXISTS `{STORED}` DateTime DEFAULT now()"
            )
            if t == kind.table + sfx:  # rows stored before the upgrade count as stored now
                store.command(
                    f"ALTER TABLE {db}.{t}{layout.on_cluster} MATERIALIZE COLUMN `{STORED}`"
                )


def apply_retention(store: Any, layout: Layout) -> dict[str, int]:
    """Change every table whose TTL differs from ``layout``'s; returns the tables changed."""
    db = layout.database
    got = store.query(
        "SELECT name, create_table_query AS q FROM system.tables WHERE database = {db:String}",
        {"db": db},
    )
    current: dict[str, int] = {}
    for name, q in zip(_col(got, "name"), _col(got, "q"), strict=True):
        m = _OURS.search(q)
        # a TTL of another form (an older release's, or an operator's) is replaced
        current[name] = int(m.group(1)) if m else (-1 if " TTL " in q else 0)
    changed = {}
    for table, (time_expr, days) in _ttl_targets(layout).items():
        if table not in current or current[table] == days:
            continue
        action = "MODIFY " + ttl_sql(time_expr, days) if days else "REMOVE TTL"
        store.command(f"ALTER TABLE {db}.{table}{layout.on_cluster} {action}")
        changed[table] = days
    return changed


def ensure_schema(
    store: Any, layout: Layout, retention: tuple[tuple[str, int], ...] | None
) -> dict[str, int]:
    """Create what is missing and migrate what is old; with ``retention`` (table -> days, from
    :func:`retention_days`) set every table's TTL to it. Without, new tables get none and
    existing ones keep theirs: a tool that opens the store does not undo the server's."""
    if retention is not None:
        layout = dataclasses.replace(layout, retention=retention)
    _add_stored(store, layout)
    for stmt in create_statements(layout):
        store.command(stmt)
    return apply_retention(store, layout) if retention is not None else {}


def stored_bytes(store: Any) -> dict[str, int]:
    """Bytes on disk per table of the store's database (active parts), for ``/metrics``."""
    got = store.query(
        "SELECT table, sum(bytes_on_disk) AS b FROM system.parts "
        "WHERE database = {db:String} AND active GROUP BY table ORDER BY table",
        {"db": store.database},
    )
    return {t: int(b) for t, b in zip(_col(got, "table"), _col(got, "b"), strict=True)}
