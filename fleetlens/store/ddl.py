"""The telemetry store's DDL, derived from :mod:`fleetlens.schema`: the one source of it.

Embedded (chDB) and single-server ClickHouse get MergeTree tables. A cluster gets a
ReplicatedMergeTree table per shard (``<table>_local``) and a Distributed table in front of it,
sharded by run so that a run's per-step aggregation stays on one shard.

Every table keeps the hashes of its recent inserts (``*_deduplication_window``) and every insert
carries an ``insert_deduplication_token`` derived from the rows' context (tenant, project, run,
job), the caller's key and the kind (:func:`dedup_token`): a retried batch is stored once even
when the server died between storing it and acknowledging it, and the same key used by another
tenant or run never drops that one's rows. The collector's key holds the batch id and a hash of
the table's content, so only a true retry of the same batch is dropped.

``steps_by_step`` is a rollup fed by a materialized view: per run, job attempt and step, the
ranks seen, tokens, first start, last end, the slowest rank's duration and compute time, the
sums of durations and compute times, and the longest data wait. Run summaries and goodput read
it instead of the per-rank table. The time rollups (10 s, 1 min) are in
:mod:`fleetlens.store.rollups`; which table keeps its rows how long (``TTL``, counted from the
later of a row's time and ``_stored``) in :mod:`fleetlens.store.retention`.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from ..schema import DTYPES, KINDS, Column, RecordKind

__all__ = [
    "BATCH_COLUMN",
    "COMPUTE_SQL",
    "DEDUP_WINDOW",
    "PRESERVED",
    "STORED",
    "Layout",
    "View",
    "create_statements",
    "dedup_token",
    "insert_settings",
    "steps_view",
    "time_column",
    "ttl_sql",
    "views",
]

COMPUTE_SQL = (
    "if(isFinite(forward + backward + optimizer), forward + backward + optimizer, "
    "duration - if(isFinite(comm), comm, 0) - if(isFinite(data_wait), data_wait, 0))"
)
"""A rank's compute time in a step: its phases when measured, else the step less its waiting.

In a synchronous job every rank's step lasts as long as the slowest's, so the slow rank shows
in compute (and in the shortest wait), not in duration.
"""

BATCH_COLUMN = "`_batch` UInt64 MATERIALIZED 0"
"""The key of the batch a row came in (:func:`fleetlens.collector.ledger.batch_key`), written by
group commit with ``insert_allow_materialized_columns``; hidden from ``SELECT *`` so copies and
reads of the rows do not see it. 0 for rows inserted one batch per insert (tokens dedup those)."""

DEDUP_WINDOW = 100_000
"""Inserts remembered per table for deduplication (each batch is one insert per kind)."""


@dataclass(frozen=True)
class Layout:
    """Where the tables live: a database, and optionally a cluster to replicate across."""

    database: str = "fleetlens"
    cluster: str | None = None
    # table -> days its rows are kept (fleetlens.store.retention builds it); absent or 0: forever
    retention: tuple[tuple[str, int], ...] = ()

    @property
    def on_cluster(self) -> str:
        return f" ON CLUSTER {self.cluster}" if self.cluster else ""

    def ttl_days(self, table: str) -> int:
        return dict(self.retention).get(table, 0)


STORED = "_stored"
"""When a row was stored: a column of every telemetry table, filled by the engine. Retention
counts from it or from the row's own time, whichever is later, so a run imported from last
year is kept as long as one recorded today."""


def time_column(kind: RecordKind) -> str:
    """The column that says when a row happened: ``time``, a collective's ``enter``, an
    allocation's ``submit``."""
    return next(c for c in ("time", "enter", "submit") if c in kind.by_name)


def ttl_sql(time_expr: str, days: int) -> str:
    """A TTL clause: rows expire ``days`` after the later of their time and their storing."""
    return f"TTL greatest(toDateTime({time_expr}), `{STORED}`) + INTERVAL {int(days)} DAY"


def _ch_type(col: Column) -> str:
    t = DTYPES[col.dtype][2]
    if col.dtype == "string" and not col.low_cardinality:
        t = "String"
    default = ""
    if not col.required:
        fill = col.fill
        if isinstance(fill, str):
            default = " DEFAULT '" + fill.replace("\\", "\\\\").replace("'", "\\'") + "'"
        elif isinstance(fill, float) and math.isnan(fill):
            default = " DEFAULT nan"
        else:
            default = f" DEFAULT {fill}"
    codec = f" CODEC({col.codec})" if col.codec else ""
    return f"{t}{default}{codec}"


def _columns_sql(kind: RecordKind) -> str:
    parts = [f"`{name}` LowCardinality(String)" for name in kind.ctx]
    parts += [f"`{c.name}` {_ch_type(c)}" for c in kind.columns]
    parts.append(f"`{STORED}` DateTime DEFAULT now()")
    return ",\n  ".join(parts)


def _engine(kind: RecordKind, layout: Layout, local: str) -> str:
    engine = kind.engine
    if layout.cluster:
        name, _, args = engine.partition("(")
        zk = f"'/clickhouse/tables/{{shard}}/{layout.database}/{local}', '{{replica}}'"
        args = args.rstrip(")")
        engine = f"Replicated{name}({zk}{', ' + args if args else ''})"
        window = "replicated_deduplication_window"
    else:
        window = "non_replicated_deduplication_window"
    ttl = ""
    if days := layout.ttl_days(kind.table):
        ttl = "\n" + ttl_sql(f"`{time_column(kind)}`", days)
    order = ", ".join(f"`{c}`" for c in kind.order_by)
    return f"ENGINE = {engine}\nORDER BY ({order}){ttl}\nSETTINGS {window} = {DEDUP_WINDOW}"


def _table(kind: RecordKind, layout: Layout) -> list[str]:
    db = layout.database
    local = f"{kind.table}_local" if layout.cluster else kind.table
    added = ", ".join(f"ADD COLUMN IF NOT EXISTS `{c.name}` {_ch_type(c)}" for c in kind.columns)
    stmts = [
        f"CREATE TABLE IF NOT EXISTS {db}.{local}{layout.on_cluster} (\n  {_columns_sql(kind)},"
        f"\n  {BATCH_COLUMN}\n)\n" + _engine(kind, layout, local),
        # Tables made before a column existed get it (idempotent): the batch key, and any
        # column a later version added (new DCGM fields, InfiniBand counters).
        f"ALTER TABLE {db}.{local}{layout.on_cluster} ADD COLUMN IF NOT EXISTS {BATCH_COLUMN}",
        f"ALTER TABLE {db}.{local}{layout.on_cluster} {added}",
    ]
    if layout.cluster:
        shard_key = "cityHash64(`run_id`)" if "run_id" in kind.ctx else "rand()"
        stmts.append(
            f"CREATE TABLE IF NOT EXISTS {db}.{kind.table}{layout.on_cluster} AS {db}.{local} "
            f"ENGINE = Distributed({layout.cluster}, {db}, {local}, {shard_key})"
        )
        stmts.append(f"ALTER TABLE {db}.{kind.table}{layout.on_cluster} {added}")
    return stmts


@dataclass(frozen=True)
class View:
    """A materialized view: ``target`` is fed, per group of ``keys`` ((name, expression)
    pairs), the aggregates ``select`` of the rows inserted into ``source``.

    Its DDL and its repair come from here: after a crash between the insert into ``source`` and
    the one into ``target`` (the engine writes them one after the other), :meth:`rebuild_sql`
    recomputes the groups an interrupted insert touched from ``source``
    (:meth:`fleetlens.store.chdb_store.ChdbStore.settle`)."""

    target: str
    source: str
    keys: tuple[tuple[str, str], ...]
    select: str

    @property
    def key_names(self) -> str:
        return ", ".join(n for n, _ in self.keys)

    @property
    def key_exprs(self) -> str:
        return ", ".join(e for _, e in self.keys)

    @property
    def key_select(self) -> str:
        """The keys as a SELECT list: each expression named by its key."""
        return ", ".join(n if e == n else f"{e} AS {n}" for n, e in self.keys)

    def _select(self, db: str, where: str = "") -> str:
        return (
            f"SELECT {self.key_select}, {self.select} FROM {db}.{self.source}{where} "
            f"GROUP BY {self.key_names}"
        )

    def create_sql(self, layout: Layout) -> str:
        db = layout.database
        return (
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.{self.target}_mv{layout.on_cluster} "
            f"TO {db}.{self.target} AS {self._select(db)}"
        )

    def groups_sql(self, db: str, batches: str) -> str:
        """The groups the rows of the batches ``batches`` (a list of keys) fall in."""
        return (
            f"SELECT DISTINCT {self.key_select} FROM {db}.{self.source} WHERE _batch IN ({batches})"
        )

    @property
    def count_column(self) -> str:
        """The column that counts the source rows of a group (``count() AS ...``): it tells
        whether the view saw an insert (:meth:`seen_sql`)."""
        found = re.search(r"\bcount\(\) AS `?(\w+)`?", self.select)
        if found is None:
            raise ValueError(f"view {self.target} has no count() column")
        return found.group(1)

    def seen_sql(self, db: str, batches: str) -> str:
        """One row (``source``, ``target``): the rows of every group the batches ``batches`` fall
        in, counted in the source table and in this view. They differ by the batches' rows when
        the view missed them (the engine was stopped between the table's insert and the view's),
        and are equal when it saw them."""
        groups = f"SELECT {self.key_exprs} FROM {db}.{self.source} WHERE _batch IN ({batches})"
        return (
            f"SELECT (SELECT count() FROM {db}.{self.source} WHERE ({self.key_exprs}) IN "
            f"({groups})) AS source, (SELECT sum({self.count_column}) FROM {db}.{self.target} "
            f"WHERE ({self.key_names}) IN ({groups})) AS target"
        )

    def catch_up_sql(self, db: str, batches: str) -> str:
        """Feed the view the rows of the batches ``batches`` it missed: its aggregates combine
        (sums, minima, maxima, states), so adding the missed rows' aggregates is exact and no
        group is rewritten."""
        return f"INSERT INTO {db}.{self.target} " + self._select(
            db, f" WHERE _batch IN ({batches})"
        )

    def rebuild_sql(self, db: str, groups: str) -> tuple[str, str]:
        """Statements that drop the ``groups`` (a list of tuple literals) from the target and
        compute them again from every source row in them."""
        return (
            f"ALTER TABLE {db}.{self.target} DELETE WHERE ({self.key_names}) IN ({groups}) "
            "SETTINGS mutations_sync = 1",
            f"INSERT INTO {db}.{self.target} "
            + self._select(db, f" WHERE ({self.key_exprs}) IN ({groups})"),
        )


def steps_view(layout: Layout) -> View:
    """``steps_by_step``'s view (see the module's doc)."""
    return View(
        target="steps_by_step_local" if layout.cluster else "steps_by_step",
        source="steps_local" if layout.cluster else "steps",
        keys=tuple((k, k) for k in ("tenant", "run_id", "job_id", "step")),
        select=(
            "count() AS ranks, sum(tokens) AS tokens, min(time) AS start, "
            "max(time + duration) AS end, max(duration) AS max_duration, "
            f"sum(duration) AS sum_duration, max({COMPUTE_SQL}) AS max_compute, "
            f"sum({COMPUTE_SQL}) AS sum_compute, "
            "max(if(isFinite(data_wait), data_wait, 0)) AS max_data_wait"
        ),
    )


def views(layout: Layout) -> tuple[View, ...]:
    """Every materialized view of the schema."""
    from .rollups import rollup_views  # it builds on this module's Layout

    return (steps_view(layout), *rollup_views(layout))


def _rollup(layout: Layout) -> list[str]:
    db = layout.database
    target = "steps_by_step_local" if layout.cluster else "steps_by_step"
    engine = "AggregatingMergeTree"
    if layout.cluster:
        engine = (
            f"ReplicatedAggregatingMergeTree('/clickhouse/tables/{{shard}}/{db}/{target}', "
            "'{replica}')"
        )
    window = (
        "replicated_deduplication_window"
        if layout.cluster
        else "non_replicated_deduplication_window"
    )
    stmts = [
        f"CREATE TABLE IF NOT EXISTS {db}.{target}{layout.on_cluster} (\n"
        "  `tenant` LowCardinality(String),\n  `run_id` LowCardinality(String),\n"
        "  `job_id` LowCardinality(String),\n  `step` Int64,\n"
        "  `ranks` SimpleAggregateFunction(sum, UInt64),\n"
        "  `tokens` SimpleAggregateFunction(sum, Int64),\n"
        "  `start` SimpleAggregateFunction(min, Float64),\n"
        "  `end` SimpleAggregateFunction(max, Float64),\n"
        "  `max_duration` SimpleAggregateFunction(max, Float64),\n"
        "  `sum_duration` SimpleAggregateFunction(sum, Float64),\n"
        "  `max_compute` SimpleAggregateFunction(max, Float64),\n"
        "  `sum_compute` SimpleAggregateFunction(sum, Float64),\n"
        "  `max_data_wait` SimpleAggregateFunction(max, Float64)\n"
        f") ENGINE = {engine}\nORDER BY (`tenant`, `run_id`, `step`, `job_id`)\n"
        f"SETTINGS {window} = {DEDUP_WINDOW}",
        steps_view(layout).create_sql(layout),
    ]
    if layout.cluster:
        stmts.append(
            f"CREATE TABLE IF NOT EXISTS {db}.steps_by_step{layout.on_cluster} AS {db}.{target} "
            f"ENGINE = Distributed({layout.cluster}, {db}, {target}, cityHash64(`run_id`))"
        )
    return stmts


PRESERVED = ("steps", "scalars", "collectives", "events", "gpu_samples", "node_samples")
"""Tables whose rows in an alert's failure window are copied to ``preserved_<table>``."""


def _preserved(layout: Layout) -> list[str]:
    """Copies of failure windows: the same columns, no TTL, so retention never drops them."""
    db = layout.database
    stmts = []
    for kind in KINDS.values():
        if kind.table not in PRESERVED:
            continue
        order = ", ".join(f"`{c}`" for c in kind.order_by)
        window = (
            "replicated_deduplication_window"
            if layout.cluster
            else "non_replicated_deduplication_window"
        )
        engine = "MergeTree"
        if layout.cluster:
            engine = (
                f"ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{db}/preserved_{kind.table}', "
                "'{replica}')"
            )
        stmts.append(
            f"CREATE TABLE IF NOT EXISTS {db}.preserved_{kind.table}{layout.on_cluster} "
            f"(\n  {_columns_sql(kind)}\n) ENGINE = {engine} ORDER BY ({order}) "
            f"SETTINGS {window} = {DEDUP_WINDOW}"
        )
    return stmts


def create_statements(layout: Layout = Layout()) -> list[str]:
    """Every statement needed to create the telemetry schema, in order; all idempotent."""
    stmts = [f"CREATE DATABASE IF NOT EXISTS {layout.database}{layout.on_cluster}"]
    for kind in KINDS.values():
        stmts += _table(kind, layout)
    stmts += _rollup(layout)
    stmts += _preserved(layout)
    from .rollups import rollup_statements  # it builds on this module's Layout

    stmts += rollup_statements(layout)
    return stmts


def dedup_token(key: str, kind: str, context: dict[str, str]) -> str:
    """The deduplication token of one insert: a hash of the rows' context identifiers (the
    kind's ``ctx`` columns: tenant, project, run, job) and ``key``, then the kind."""
    h = hashlib.sha256()
    for name in KINDS[kind].ctx:
        h.update(name.encode() + b"=" + context.get(name, "").encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    h.update(key.encode("utf-8", "surrogatepass"))
    return f"{h.hexdigest()[:40]}:{kind}"


def insert_settings(key: str, kind: str, context: dict[str, str]) -> dict[str, str | int]:
    """Settings for one insert of one batch: the engine drops a retried copy of it."""
    return {
        "insert_deduplicate": 1,
        "insert_deduplication_token": dedup_token(key, kind, context),
        "deduplicate_blocks_in_dependent_materialized_views": 1,
    }
