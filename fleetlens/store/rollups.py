"""Time rollups of the per-rank tables, at 10 s and 1 min, fed by materialized views.

The per-rank rows expire after ``retention.raw_days`` (30 by default); these keep a run's shape
for ``retention.rollup_days`` (a year) at a fraction of the size, and long windows read them
instead of the raw rows (:mod:`fleetlens.services.series`).

* ``rollup_steps_<res>``, per run, job attempt and time bucket (of the step's start): rank-steps,
  first and last step, the sum and maximum of the step time and the compute time, tokens.
* ``rollup_scalars_<res>``, per run, scalar name and bucket: count, sum, min, max, non-finite
  count, first and last step, and the first value (the lowest rank's at the first step).
* ``rollup_gpu_<res>``, per node, GPU and bucket: the sum and count of the finite samples of a
  few device fields (utilisation, SM and tensor activity, power, temperature, clock, memory), so
  a bucket's mean is ``sum / n`` over any number of buckets.

Each aggregate is a ``SimpleAggregateFunction`` (or an ``argMin`` state) whose merge is exact,
so reading ``GROUP BY`` over any multiple of the resolution gives what the same aggregation of
the raw rows gives. A bucket is ``floor(time / res) * res`` in UNIX seconds. Rows are kept by
the later of the bucket and when they were stored (``_stored``), as the raw tables are.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ddl import COMPUTE_SQL, DEDUP_WINDOW, STORED, Layout, View, ttl_sql

__all__ = [
    "GPU_FIELDS",
    "RESOLUTIONS",
    "ROLLUP_TABLES",
    "Rollup",
    "rollup_statements",
    "rollup_views",
]

RESOLUTIONS: dict[str, int] = {"10s": 10, "1m": 60}
"""Rollup name suffix -> bucket width in seconds."""

GPU_FIELDS = (
    "gpu_util",
    "sm_active",
    "tensor_active",
    "power_usage",
    "gpu_temp",
    "sm_clock",
    "fb_used",
)
"""The device fields whose means the GPU rollup keeps."""


@dataclass(frozen=True)
class Rollup:
    """One rollup: its source, its keys, and per column (name, stored type, SELECT expression)."""

    name: str
    source: str
    time: str
    keys: tuple[tuple[str, str], ...]
    columns: tuple[tuple[str, str, str], ...]


def _sum(t: str) -> str:
    return f"SimpleAggregateFunction(sum, {t})"


_F = "Float64"
_STEPS = Rollup(
    name="rollup_steps",
    source="steps",
    time="time",
    keys=(("run_id", "LowCardinality(String)"), ("job_id", "LowCardinality(String)")),
    columns=(
        ("rank_steps", _sum("UInt64"), "count()"),
        ("step_min", "SimpleAggregateFunction(min, Int64)", "min(step)"),
        ("step_max", "SimpleAggregateFunction(max, Int64)", "max(step)"),
        ("sum_duration", _sum(_F), "sum(duration)"),
        ("max_duration", f"SimpleAggregateFunction(max, {_F})", "max(duration)"),
        ("sum_compute", _sum(_F), f"sum({COMPUTE_SQL})"),
        ("tokens", _sum("Int64"), "sum(tokens)"),
    ),
)
_SCALARS = Rollup(
    name="rollup_scalars",
    source="scalars",
    time="time",
    keys=(("run_id", "LowCardinality(String)"), ("name", "LowCardinality(String)")),
    columns=(
        ("n", _sum("UInt64"), "count()"),
        ("v_sum", _sum(_F), "sum(value)"),
        ("v_min", f"SimpleAggregateFunction(min, {_F})", "min(value)"),
        ("v_max", f"SimpleAggregateFunction(max, {_F})", "max(value)"),
        ("non_finite", _sum("UInt64"), "countIf(NOT isFinite(value))"),
        ("step_min", "SimpleAggregateFunction(min, Int64)", "min(step)"),
        ("step_max", "SimpleAggregateFunction(max, Int64)", "max(step)"),
        (
            "first",
            "AggregateFunction(argMin, Float64, Tuple(Int64, Int32))",
            "argMinState(value, (step, rank))",
        ),
    ),
)
_GPU = Rollup(
    name="rollup_gpu",
    source="gpu_samples",
    time="time",
    keys=(("node_id", "LowCardinality(String)"), ("gpu", "Int32")),
    columns=(
        ("samples", _sum("UInt64"), "count()"),
        *(
            col
            for f in GPU_FIELDS
            for col in (
                (f"{f}_sum", _sum(_F), f"sum(if(isFinite({f}), {f}, 0))"),
                (f"{f}_n", _sum("UInt64"), f"countIf(isFinite({f}))"),
            )
        ),
    ),
)
ROLLUPS = (_STEPS, _SCALARS, _GPU)

ROLLUP_TABLES = tuple(f"{r.name}_{res}" for r in ROLLUPS for res in RESOLUTIONS)
"""Every rollup table, as reads name it (``rollup_scalars_1m``, ...)."""


def _replicated(layout: Layout, engine: str, target: str) -> str:
    if not layout.cluster:
        return engine
    zk = f"'/clickhouse/tables/{{shard}}/{layout.database}/{target}', '{{replica}}'"
    return f"Replicated{engine}({zk})"


def _view(r: Rollup, seconds: int, target: str, source: str) -> View:
    bucket = f"toInt64(floor(`{r.time}` / {seconds})) * {seconds}"
    select = ", ".join(f"{expr} AS `{n}`" for n, _, expr in r.columns)
    return View(
        target=target,
        source=source,
        keys=(*((n, n) for n, _ in (("tenant", ""), *r.keys)), ("bucket", bucket)),
        select=f"{select}, max(`{STORED}`) AS `{STORED}`",
    )


def rollup_views(layout: Layout) -> list[View]:
    """The views that feed the rollups."""
    suffix = "_local" if layout.cluster else ""
    return [
        _view(r, seconds, f"{r.name}_{res}{suffix}", f"{r.source}{suffix}")
        for r in ROLLUPS
        for res, seconds in RESOLUTIONS.items()
    ]


def _one(r: Rollup, res: str, seconds: int, layout: Layout) -> list[str]:
    db = layout.database
    table = f"{r.name}_{res}"
    target = f"{table}_local" if layout.cluster else table
    source = f"{r.source}_local" if layout.cluster else r.source
    window = (
        "replicated_deduplication_window"
        if layout.cluster
        else "non_replicated_deduplication_window"
    )
    keys = [("tenant", "LowCardinality(String)"), *r.keys, ("bucket", "Int64")]
    cols = [f"`{n}` {t}" for n, t in keys]
    cols += [f"`{n}` {t}" for n, t, _ in r.columns]
    cols.append(f"`{STORED}` SimpleAggregateFunction(max, DateTime)")
    ttl = ""
    if days := layout.ttl_days(table):
        ttl = "\n" + ttl_sql("`bucket`", days)
    order = ", ".join(f"`{n}`" for n, _ in keys)
    stmts = [
        f"CREATE TABLE IF NOT EXISTS {db}.{target}{layout.on_cluster} (\n  "
        + ",\n  ".join(cols)
        + f"\n) ENGINE = {_replicated(layout, 'AggregatingMergeTree', target)}\n"
        f"ORDER BY ({order}){ttl}\nSETTINGS {window} = {DEDUP_WINDOW}",
        _view(r, seconds, target, source).create_sql(layout),
    ]
    if layout.cluster:
        shard = "cityHash64(`run_id`)" if any(n == "run_id" for n, _ in r.keys) else "rand()"
        stmts.append(
            f"CREATE TABLE IF NOT EXISTS {db}.{table}{layout.on_cluster} AS {db}.{target} "
            f"ENGINE = Distributed({layout.cluster}, {db}, {target}, {shard})"
        )
    return stmts


def rollup_statements(layout: Layout) -> list[str]:
    """The rollup tables and the materialized views that feed them; all idempotent."""
    return [
        stmt
        for r in ROLLUPS
        for res, seconds in RESOLUTIONS.items()
        for stmt in _one(r, res, seconds, layout)
    ]
