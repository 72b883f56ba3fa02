"""The wire format: versioned, columnar batches.

A batch is one MessagePack map (JSON is accepted too, for people and curl)::

    {"v": 1, "batch_id": "...", "ctx": {"run_id": "r1", ...}, "source": "sdk/0.1.0",
     "dropped": {"P3": 12},
     "tables": {"step": {"n": 3, "cols": {"step": <bin>, "rank": <bin>, ...}}}}

A numeric column is a packed little-endian typed array (MessagePack ``bin``) whose type is the
column's dtype in :mod:`fleetlens.schema`, so the server turns it into an array without a Python
object per value. A string column is a list of strings, or dictionary-encoded as
``{"dict": [...], "codes": <bin of little-endian uint32>}``. In JSON, any column may be a plain
list. The body may be gzip-compressed (``Content-Encoding: gzip``). Every batch has a
``batch_id``; a retried batch is stored once.

This module is imported by the SDK: standard library and msgspec only.
"""

from __future__ import annotations

import gzip
import sys
import time
import uuid
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, Union

import msgspec

from .errors import WireError
from .schema import DTYPES, KINDS, WIRE_VERSION

__all__ = [
    "BATCHES_CONTENT_TYPE",
    "Batch",
    "BatchFrame",
    "DictColumn",
    "Table",
    "TableBuilder",
    "encode_batch",
    "encode_frames",
    "new_batch_id",
]

BATCHES_CONTENT_TYPE = "application/vnd.fleetlens.batches+msgpack"
"""``POST /v1/ingest/batches``: a MessagePack array of :class:`BatchFrame`, many senders' batches
in one request (a node relay's), each validated, stored and answered on its own."""


class DictColumn(msgspec.Struct, forbid_unknown_fields=True):
    """A dictionary-encoded string column: ``values[i] == dict[codes[i]]``."""

    dict: list[str]
    codes: Union[bytes, list[int]]  # noqa: UP007 - msgspec needs the explicit union


ColumnValue = Union[bytes, list[Union[int, float, str, None]], DictColumn]  # noqa: UP007


class Table(msgspec.Struct, forbid_unknown_fields=True):
    n: int
    cols: dict[str, ColumnValue]


class Batch(msgspec.Struct, forbid_unknown_fields=True):
    v: int
    batch_id: str
    tables: dict[str, Table]
    ctx: dict[str, str] = {}
    source: str = ""
    sent_at: float = 0.0
    dropped: dict[str, int] = {}


class BatchFrame(msgspec.Struct, forbid_unknown_fields=True):
    """One batch inside a multi-batch request: its body exactly as its sender encoded it, with
    the body's ``Content-Type`` and ``Content-Encoding``, so that the server decodes (and
    deduplicates) it as if it had come alone."""

    body: bytes
    type: str = "application/msgpack"
    encoding: str = ""


_BIG_ENDIAN = sys.byteorder == "big"
_ENCODER = msgspec.msgpack.Encoder()


def new_batch_id() -> str:
    return uuid.uuid4().hex


def _pack(values: Iterable[Any], typecode: str) -> bytes:
    arr = array(typecode, values)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


def _dict_encode(values: Sequence[str]) -> DictColumn:
    index: dict[str, int] = {}
    codes = [index.setdefault(v, len(index)) for v in values]
    return DictColumn(dict=list(index), codes=_pack(codes, "I"))


class TableBuilder:
    """Builds one table of a batch from Python lists, column by column."""

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise WireError(f"unknown record kind {kind!r}; known: {sorted(KINDS)}")
        self.kind = KINDS[kind]
        self.cols: dict[str, ColumnValue] = {}
        self.n: int | None = None

    def add(self, name: str, values: Sequence[Any]) -> TableBuilder:
        col = self.kind.by_name.get(name)
        if col is None:
            raise WireError(f"record kind {self.kind.name!r} has no column {name!r}")
        if self.n is None:
            self.n = len(values)
        elif len(values) != self.n:
            raise WireError(f"column {name!r} has {len(values)} values, expected {self.n}")
        if col.dtype == "string":
            self.cols[name] = _dict_encode(values)
        else:
            self.cols[name] = _pack(values, DTYPES[col.dtype][0])
        return self

    def add_dict(self, name: str, values: list[str], codes: bytes) -> TableBuilder:
        """Add a string column already dictionary-encoded: row ``i`` is ``values[codes[i]]``,
        ``codes`` packed little-endian uint32."""
        col = self.kind.by_name.get(name)
        if col is None or col.dtype != "string":
            raise WireError(f"record kind {self.kind.name!r} has no string column {name!r}")
        self.add_packed(name, codes, "I")
        self.cols[name] = DictColumn(dict=values, codes=codes)
        return self

    def add_packed(self, name: str, packed: bytes, typecode: str = "") -> TableBuilder:
        """Add a numeric column that is already a packed little-endian array (e.g. numpy);
        ``typecode`` when its items are not the column's type (a string column's codes)."""
        col = self.kind.by_name[name]
        size = array(typecode or DTYPES[col.dtype][0]).itemsize
        n = len(packed) // size
        if self.n is None:
            self.n = n
        elif n != self.n:
            raise WireError(f"column {name!r} has {n} values, expected {self.n}")
        self.cols[name] = packed
        return self

    def build(self) -> Table:
        return Table(n=self.n or 0, cols=self.cols)


def encode_batch(
    tables: dict[str, Table],
    ctx: dict[str, str] | None = None,
    *,
    batch_id: str | None = None,
    source: str = "",
    dropped: dict[str, int] | None = None,
    compress: bool = False,
) -> tuple[str, bytes]:
    """Encode a batch; returns ``(batch_id, body)``. Gzip the body when ``compress``."""
    bid = batch_id or new_batch_id()
    batch = Batch(
        v=WIRE_VERSION,
        batch_id=bid,
        tables=tables,
        ctx=dict(ctx or {}),
        source=source,
        sent_at=time.time(),
        dropped=dict(dropped or {}),
    )
    body = _ENCODER.encode(batch)
    if compress:
        body = gzip.compress(body, compresslevel=1)
    return bid, body


def encode_frames(frames: Sequence[BatchFrame]) -> bytes:
    """The body of a multi-batch request (:data:`BATCHES_CONTENT_TYPE`)."""
    return _ENCODER.encode(list(frames))
