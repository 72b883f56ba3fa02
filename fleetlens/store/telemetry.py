"""The telemetry store boundary: a narrow protocol, and the batch -> Arrow conversion.

Two implementations stand behind it: :class:`~fleetlens.store.chdb_store.ChdbStore` (the
ClickHouse engine in-process, the embedded default) and
:class:`~fleetlens.store.clickhouse_store.ClickHouseStore` (a server or cluster through
clickhouse-connect). Both speak the same SQL; the DDL comes from :mod:`fleetlens.store.ddl`.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import numpy as np
import pyarrow as pa

from ..errors import ConfigError
from ..schema import KINDS
from .batch import Col, DecodedBatch, StringColumn

__all__ = [
    "Part",
    "TelemetryStore",
    "batch_tables",
    "context_for",
    "merged_table",
    "open_telemetry",
    "part_shape",
    "slice_columns",
    "with_context",
]


class TelemetryStore(Protocol):
    database: str

    def insert(self, kind: str, data: pa.Table, ctx: dict[str, str], batch_id: str) -> None:
        """Store rows of one record kind durably; ``ctx`` fills the kind's context columns.

        ``batch_id`` is the insert's idempotency key: a second insert with the same key, kind
        and context (tenant, project, run, job) is dropped by the engine
        (:func:`fleetlens.store.ddl.dedup_token`); the same key in another context is not.
        """

    def query(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        """Run a read query; ``{name:Type}`` placeholders are bound from ``params``."""

    def command(self, sql: str) -> None:
        """Run a statement that returns nothing (DDL, OPTIMIZE)."""

    def command_params(self, sql: str, params: dict[str, Any]) -> None:
        """A statement with ``{name:Type}`` parameters (INSERT ... SELECT)."""

    def close(self) -> None: ...


def _aligned(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``values``, copied when it is a view at an odd place in a body: the engine's Arrow reader
    warns on every insert of a misaligned buffer, and may read it slowly."""
    return values.copy() if values.ctypes.data % values.dtype.itemsize else values


def batch_tables(batch: DecodedBatch) -> dict[str, pa.Table]:
    """One Arrow table per record kind holding the columns the batch sent.

    Columns the batch left out are filled by the table's defaults, and the context identifiers
    travel as query parameters: neither costs an array per row.
    """
    out: dict[str, pa.Table] = {}
    for kind_name, (_n, cols) in batch.tables.items():
        kind = KINDS[kind_name]
        arrays: list[pa.Array] = []
        names: list[str] = []
        for col in kind.columns:
            value = cols.get(col.name)
            if value is None:
                continue
            if isinstance(value, StringColumn):
                arr = pa.DictionaryArray.from_arrays(
                    pa.array(_aligned(value.codes)), pa.array(value.dictionary, pa.string())
                ).dictionary_decode()
            else:
                arr = pa.array(_aligned(value))
            arrays.append(arr)
            names.append(col.name)
        out[kind_name] = pa.Table.from_arrays(arrays, names=names)
    return out


Part = tuple[dict[str, str], dict[str, Col], int, int]
"""One batch's rows of one kind for a merged insert: (context, columns, rows, batch key)."""


def part_shape(cols: dict[str, Col]) -> tuple[tuple[str, str], ...]:
    """What parts must share to be concatenated: their columns and each one's type."""
    return tuple(
        (name, "str" if isinstance(v, StringColumn) else v.dtype.str) for name, v in cols.items()
    )


def slice_columns(cols: dict[str, Col], start: int, stop: int) -> dict[str, Col]:
    """Rows ``start:stop`` of decoded columns (views, no copy)."""
    return {
        name: StringColumn(v.dictionary, v.codes[start:stop])
        if isinstance(v, StringColumn)
        else v[start:stop]
        for name, v in cols.items()
    }


def merged_table(kind_name: str, parts: list[Part]) -> pa.Table:
    """Many batches' rows of one kind (same :func:`part_shape`) as one Arrow table: the context
    columns and the string columns dictionary-encoded (a code per row, each batch's strings
    once), numbers concatenated, and ``_batch`` holding each row's batch key."""
    kind = KINDS[kind_name]
    counts = np.fromiter((n for _, _, n, _ in parts), np.int64, len(parts))
    owner = np.repeat(np.arange(len(parts), dtype=np.int32), counts)
    arrays: list[pa.Array] = []
    names: list[str] = []
    for key in kind.ctx:
        values = [ctx.get(key, "") for ctx, _, _, _ in parts]
        index = {v: i for i, v in enumerate(dict.fromkeys(values))}
        codes = np.fromiter((index[v] for v in values), np.int32, len(values))[owner]
        arrays.append(pa.DictionaryArray.from_arrays(codes, pa.array(list(index), pa.string())))
        names.append(key)
    for col in kind.columns:
        if col.name not in parts[0][1]:
            continue
        first = parts[0][1][col.name]
        arr: pa.Array
        if isinstance(first, StringColumn):
            # One dictionary for all: the batches' dictionaries share words (every rank's
            # placement names the same node), and the engine refuses a dictionary with a word
            # twice in it.
            strings = [cast(StringColumn, cols[col.name]) for _, cols, _, _ in parts]
            words: dict[str, int] = {}
            codes = np.concatenate(
                [
                    np.fromiter(
                        (words.setdefault(w, len(words)) for w in v.dictionary),
                        np.int32,
                        len(v.dictionary),
                    )[v.codes]
                    if len(v.dictionary)
                    else v.codes.astype(np.int32)
                    for v in strings
                ]
            )
            arr = pa.DictionaryArray.from_arrays(codes, pa.array(list(words), pa.string()))
            if not col.low_cardinality:
                arr = arr.dictionary_decode()
        else:
            numbers = [cast(np.ndarray, cols[col.name]) for _, cols, _, _ in parts]
            arr = pa.array(_aligned(np.concatenate(numbers) if len(numbers) > 1 else first))
        arrays.append(arr)
        names.append(col.name)
    keys = np.fromiter((k for _, _, _, k in parts), np.uint64, len(parts))
    arrays.append(pa.array(keys[owner]))
    names.append("_batch")
    return pa.Table.from_arrays(arrays, names=names)


def context_for(kind: str, ctx: dict[str, str]) -> dict[str, str]:
    """The values of a kind's context columns: every one present, missing ones empty."""
    return {key: ctx.get(key, "") for key in KINDS[kind].ctx}


def with_context(
    kind: str, data: pa.Table, ctx: dict[str, str], *, dictionary: bool = False
) -> pa.Table:
    """``data`` with the kind's context columns in front, one value repeated per row; as
    dictionary arrays (4 bytes a row, not a copy of the string) when the writer takes them."""
    n = data.num_rows
    codes = pa.array(np.zeros(n, np.int32)) if dictionary else None
    for i, (key, value) in enumerate(context_for(kind, ctx).items()):
        if codes is not None:
            col = pa.DictionaryArray.from_arrays(codes, pa.array([value], pa.string()))
        else:
            col = pa.array([value] * n, pa.string())
        data = data.add_column(i, key, col)
    return data


def open_telemetry(
    data_dir: str | None = None,
    clickhouse_url: str | None = None,
    database: str = "fleetlens",
    retention: tuple[tuple[str, int], ...] | None = None,
) -> TelemetryStore:
    """The configured store: a ClickHouse server when a URL is given, else chDB in ``data_dir``;
    ``retention`` (table -> days, :func:`fleetlens.store.retention.retention_days`) is applied
    to new and existing tables (None: tables are made without TTLs and existing ones left as
    they are, for tools that open a store they do not own)."""
    if clickhouse_url:
        from .clickhouse_store import ClickHouseStore

        return ClickHouseStore(clickhouse_url, database=database, retention=retention)
    if not data_dir:
        raise ConfigError("the embedded telemetry store needs a data directory")
    from .chdb_store import ChdbStore

    return ChdbStore(data_dir, database=database, retention=retention)
