"""Per-example scores of evaluations (``eval_examples``): the table, the shards' writes and the
tenant's reads."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from .reader import TenantReader
from .telemetry import TelemetryStore

__all__ = ["ExampleScores", "create_examples_table", "insert_examples", "read_examples"]

EXAMPLES_DDL = """
CREATE TABLE IF NOT EXISTS {db}.eval_examples (
    tenant LowCardinality(String),
    evaluation_id String,
    benchmark LowCardinality(String),
    shard_index UInt32,
    example_id String,
    metric LowCardinality(String),
    value Float64,
    detail String DEFAULT '',
    prompt String DEFAULT '',
    output String DEFAULT '',
    reference String DEFAULT '',
    at DateTime64(3) DEFAULT now64(3)
) ENGINE = ReplacingMergeTree
ORDER BY (tenant, evaluation_id, benchmark, example_id, metric)
"""


TEXTS = ("prompt", "output", "reference")


def create_examples_table(telemetry: TelemetryStore) -> None:
    """Make ``eval_examples`` where it is not yet; a table made before the example texts gains
    their columns."""
    db = telemetry.database
    telemetry.command(EXAMPLES_DDL.format(db=db))
    for col in TEXTS:
        telemetry.command(
            f"ALTER TABLE {db}.eval_examples ADD COLUMN IF NOT EXISTS {col} String DEFAULT ''"
        )


@dataclass(frozen=True)
class ExampleScores:
    """One shard's scores, a row per (example, metric); ``detail`` is '' when there is none. An
    example's prompt, output and reference ride on its first row ('' on the others)."""

    example_id: list[str]
    metric: list[str]
    value: list[float]
    detail: list[str]
    prompt: list[str]
    output: list[str]
    reference: list[str]


def read_examples(reader: TenantReader, evaluation_id: str, limit: int) -> pa.Table:
    """An evaluation's scores (benchmark, shard_index, example_id, metric, value, detail,
    prompt, output, reference), by benchmark, example and metric, at most ``limit``."""
    return reader.table(
        "SELECT benchmark, shard_index, example_id, metric, value, detail, prompt, output, "
        "reference "
        "FROM {db}.eval_examples FINAL "
        "WHERE evaluation_id = {eid:String} "
        "ORDER BY benchmark, example_id, metric LIMIT {lim:UInt32}",
        eid=evaluation_id,
        lim=int(limit),
    )


def insert_examples(
    telemetry: TelemetryStore,
    tenant: str,
    evaluation_id: str,
    benchmark: str,
    shard_index: int,
    scores: ExampleScores,
) -> None:
    """Store one shard's scores for ``tenant``."""
    telemetry.command_params(
        f"INSERT INTO {telemetry.database}.eval_examples "
        "(tenant, evaluation_id, benchmark, shard_index, example_id, metric, value, detail, "
        "prompt, output, reference) "
        "SELECT {t:String}, {e:String}, {b:String}, {i:UInt32}, z.1, z.2, z.3, z.4, z.5, z.6, z.7 "
        "FROM (SELECT arrayJoin(arrayZip({ex:Array(String)}, {met:Array(String)}, "
        "{val:Array(Float64)}, {det:Array(String)}, {pr:Array(String)}, {out:Array(String)}, "
        "{ref:Array(String)})) AS z)",
        {
            "t": tenant,
            "e": evaluation_id,
            "b": benchmark,
            "i": shard_index,
            "ex": scores.example_id,
            "met": scores.metric,
            "val": scores.value,
            "det": scores.detail,
            "pr": scores.prompt,
            "out": scores.output,
            "ref": scores.reference,
        },
    )
