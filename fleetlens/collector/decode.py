"""Decode and validate a wire batch into numpy columns, or refuse it whole.

Validation is strict and names the field: a batch is either entirely valid or nothing of it is
written. Numeric columns arrive as packed little-endian arrays and become numpy views of the
request body (no Python object per value); JSON's plain lists take the slow path.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from ..errors import BatchTooLarge, UnsupportedVersion, WireError
from ..schema import CTX_KEYS, DTYPES, EVENT_KINDS, KINDS, WIRE_VERSION, RecordKind
from ..wire import Batch, DictColumn

__all__ = ["DecodeLimits", "DecodedBatch", "StringColumn", "decode_batch"]

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@/+=-]{0,127}$")
_CTX_MAX = 256
_MSGPACK_DECODER = msgspec.msgpack.Decoder(Batch)
_JSON_DECODER = msgspec.json.Decoder(Batch)


@dataclass(frozen=True)
class DecodeLimits:
    max_body_bytes: int = 64 << 20
    max_decoded_bytes: int = 512 << 20
    max_rows: int = 4_000_000


@dataclass(frozen=True)
class StringColumn:
    """A dictionary-encoded string column: ``values[i] == dictionary[codes[i]]``."""

    dictionary: list[str]
    codes: np.ndarray[Any, np.dtype[np.int32]]

    def values(self) -> list[str]:
        d = self.dictionary
        return [d[c] for c in self.codes.tolist()]


Col = np.ndarray[Any, Any] | StringColumn


@dataclass
class DecodedBatch:
    batch_id: str
    ctx: dict[str, str]
    tables: dict[str, tuple[int, dict[str, Col]]]
    source: str = ""
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(n for n, _ in self.tables.values())


def _decompress(body: bytes, encoding: str, limits: DecodeLimits) -> bytes:
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in ("gzip", "deflate"):
        raise WireError(f"Content-Encoding {encoding!r} is not supported; use gzip or none")
    wbits = 31 if enc == "gzip" else 15
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, limits.max_decoded_bytes)
    except zlib.error as exc:
        raise WireError(f"body is not valid {enc}: {exc}") from exc
    if d.unconsumed_tail:
        raise BatchTooLarge(f"decompressed body is over {limits.max_decoded_bytes} bytes")
    if not d.eof:
        raise WireError(f"{enc} body is truncated")
    return out


def decode_batch(
    body: bytes,
    content_type: str = "application/msgpack",
    content_encoding: str = "",
    limits: DecodeLimits = DecodeLimits(),
) -> DecodedBatch:
    """Decode ``body`` into validated columns; raise :class:`WireError` naming what is wrong."""
    if len(body) > limits.max_body_bytes:
        raise BatchTooLarge(f"body is {len(body)} bytes; the limit is {limits.max_body_bytes}")
    raw = _decompress(body, content_encoding, limits)
    ctype = content_type.split(";")[0].strip().lower()
    try:
        if ctype in ("application/json", "text/json"):
            batch = _JSON_DECODER.decode(raw)
        elif ctype in ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack"):
            batch = _MSGPACK_DECODER.decode(raw)
        else:
            raise WireError(
                f"Content-Type {content_type!r} is not supported; "
                "use application/msgpack or application/json"
            )
    except msgspec.ValidationError as exc:
        msg = str(exc)
        if "`$.v`" in msg or msg.startswith("Object missing required field `v`"):
            raise UnsupportedVersion(f"batch has no valid wire version: {msg}", "v") from exc
        raise WireError(f"batch does not match the wire schema: {msg}", _path(msg)) from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise WireError(f"batch is not valid {ctype}: {exc}") from exc
    return _validate(batch, limits)


def _path(msg: str) -> str | None:
    m = re.search(r"at `\$\.?([^`]*)`", msg)
    return m.group(1) if m else None


def _validate(batch: Batch, limits: DecodeLimits) -> DecodedBatch:
    if batch.v != WIRE_VERSION:
        raise UnsupportedVersion(
            f"wire version {batch.v} is not supported; this server reads version {WIRE_VERSION}",
            "v",
        )
    if not _ID_RE.match(batch.batch_id):
        raise WireError(
            f"batch_id {batch.batch_id!r} is not valid: 1-128 characters of letters, digits "
            "and _.:@/+=-, starting with a letter or digit",
            "batch_id",
        )
    for key, value in batch.ctx.items():
        if key not in CTX_KEYS:
            raise WireError(f"ctx key {key!r} is not known; known keys: {list(CTX_KEYS)}", "ctx")
        if len(value) > _CTX_MAX or not value.isprintable():
            raise WireError(
                f"ctx.{key} must be printable and at most {_CTX_MAX} characters", f"ctx.{key}"
            )
    if not batch.tables:
        raise WireError("batch has no tables", "tables")
    total = 0
    tables: dict[str, tuple[int, dict[str, Col]]] = {}
    for kind_name, table in batch.tables.items():
        kind = KINDS.get(kind_name)
        if kind is None:
            raise WireError(
                f"record kind {kind_name!r} is not known; known kinds: {sorted(KINDS)}",
                f"tables.{kind_name}",
            )
        for key in kind.ctx_required:
            if not batch.ctx.get(key):
                raise WireError(
                    f"records of kind {kind_name!r} need ctx.{key}; add it to the batch ctx",
                    f"ctx.{key}",
                )
        n = table.n
        if n < 0:
            raise WireError(f"tables.{kind_name}.n is {n}; must be >= 0", f"tables.{kind_name}.n")
        total += n
        if total > limits.max_rows:
            raise BatchTooLarge(f"batch has more than {limits.max_rows} rows; split it")
        cols = {name: _column(kind, name, value, n) for name, value in table.cols.items()}
        for col in kind.columns:
            if col.required and col.name not in cols:
                raise WireError(
                    f"tables.{kind_name} is missing required column {col.name!r}",
                    f"tables.{kind_name}.cols.{col.name}",
                )
        _check_rows(kind, cols, n)
        tables[kind_name] = (n, cols)
    return DecodedBatch(batch.batch_id, dict(batch.ctx), tables, batch.source, dict(batch.dropped))


def _column(kind: RecordKind, name: str, value: object, n: int) -> Col:
    where = f"tables.{kind.name}.cols.{name}"
    col = kind.by_name.get(name)
    if col is None:
        raise WireError(
            f"record kind {kind.name!r} has no column {name!r}; columns: {list(kind.column_names)}",
            where,
        )
    if col.dtype == "string":
        if isinstance(value, DictColumn):
            codes = _codes(value.codes, where)
            if len(codes) != n:
                raise WireError(f"{where} has {len(codes)} codes; n is {n}", where)
            if len(codes) and (int(codes.min()) < 0 or int(codes.max()) >= len(value.dict)):
                raise WireError(f"{where} has a code outside its dictionary", where)
            return StringColumn(list(value.dict), codes)
        if isinstance(value, list):
            if len(value) != n:
                raise WireError(f"{where} has {len(value)} values; n is {n}", where)
            index: dict[str, int] = {}
            codes_l = []
            for i, v in enumerate(value):
                if not isinstance(v, str):
                    raise WireError(f"{where}[{i}] is {v!r}; expected a string", where)
                codes_l.append(index.setdefault(v, len(index)))
            return StringColumn(list(index), np.asarray(codes_l, dtype=np.int32))
        raise WireError(f"{where} must be a list of strings or a dictionary column", where)
    np_dtype = np.dtype(DTYPES[col.dtype][1])
    if isinstance(value, bytes):
        if len(value) != n * np_dtype.itemsize:
            raise WireError(
                f"{where} is {len(value)} bytes; {n} values of {col.dtype} need "
                f"{n * np_dtype.itemsize}",
                where,
            )
        return np.frombuffer(value, dtype=np_dtype)
    if isinstance(value, list):
        if len(value) != n:
            raise WireError(f"{where} has {len(value)} values; n is {n}", where)
        for i, v in enumerate(value):
            if isinstance(v, bool) or (not isinstance(v, int | float) and v is not None):
                raise WireError(f"{where}[{i}] is {v!r}; expected a number", where)
            if np_dtype.kind == "i" and not isinstance(v, int):
                raise WireError(f"{where}[{i}] is {v!r}; expected an integer", where)
        try:
            return np.asarray([math.nan if v is None else v for v in value], dtype=np_dtype)
        except OverflowError as exc:
            raise WireError(f"{where} has a value out of range for {col.dtype}", where) from exc
    raise WireError(f"{where} must be packed bytes or a list of numbers", where)


def _codes(raw: bytes | list[int], where: str) -> np.ndarray[Any, np.dtype[np.int32]]:
    if isinstance(raw, bytes):
        if len(raw) % 4:
            raise WireError(f"{where}.codes is {len(raw)} bytes; not a multiple of 4", where)
        codes = np.frombuffer(raw, dtype="<u4")
        if len(codes) and int(codes.max()) > np.iinfo(np.int32).max:
            raise WireError(f"{where}.codes has a code too large", where)
        return codes.view(np.int32)
    try:
        return np.asarray(raw, dtype=np.int32)
    except (OverflowError, ValueError, TypeError) as exc:
        raise WireError(f"{where}.codes must be non-negative integers", where) from exc


def _first_bad(mask: np.ndarray[Any, Any]) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if len(idx) else None


def _require(kind: RecordKind, cols: dict[str, Col], name: str, bad: Any, rule: str) -> None:
    i = _first_bad(bad)
    if i is not None:
        value = cols[name]
        shown = value.values()[i] if isinstance(value, StringColumn) else value[i].item()
        raise WireError(
            f"field `{name}` of {kind.name} record {i} is {shown!r}; {rule}",
            f"tables.{kind.name}.cols.{name}",
        )


def _check_rows(kind: RecordKind, cols: dict[str, Col], n: int) -> None:
    """Row rules a user relies on: ranks and steps non-negative, times real, known kinds."""

    def num(name: str) -> np.ndarray[Any, Any] | None:
        v = cols.get(name)
        return v if isinstance(v, np.ndarray) else None

    if n == 0:
        return
    if (rank := num("rank")) is not None and kind.name != "event":
        _require(kind, cols, "rank", rank < 0, "ranks are >= 0")
    if (step := num("step")) is not None and kind.name != "event":
        _require(kind, cols, "step", step < 0, "steps are >= 0")
    for name in ("time", "submit", "enter", "exit"):
        if (t := num(name)) is not None:
            _require(kind, cols, name, ~np.isfinite(t) | (t < 0), "times are finite UNIX seconds")
    if (d := num("duration")) is not None:
        _require(kind, cols, "duration", ~np.isfinite(d) | (d < 0), "durations are finite, >= 0")
    for name in ("data_wait", "forward", "backward", "optimizer", "comm"):
        if (p := num(name)) is not None:
            _require(kind, cols, name, p < 0, "phase times are >= 0 seconds (or NaN if unknown)")
    if (g := num("gpus")) is not None:
        _require(kind, cols, "gpus", g <= 0, "an allocation holds at least one GPU")
    if kind.name == "event":
        kinds = cols["kind"]
        dictionary = kinds.dictionary if isinstance(kinds, StringColumn) else []
        for j, value in enumerate(dictionary):
            if value not in EVENT_KINDS:
                i = _first_bad(kinds.codes == j) if isinstance(kinds, StringColumn) else 0
                raise WireError(
                    f"field `kind` of event record {i} is {value!r}; known kinds: "
                    f"{sorted(EVENT_KINDS)}",
                    "tables.event.cols.kind",
                )
        attrs = cols.get("attrs")
        if isinstance(attrs, StringColumn):
            for value in attrs.dictionary:
                try:
                    ok = isinstance(json.loads(value), dict)
                except ValueError:
                    ok = False
                if not ok:
                    raise WireError(
                        f"field `attrs` of an event is {value[:80]!r}; it must be a JSON object",
                        "tables.event.cols.attrs",
                    )
    for name in kind.column_names:
        col = cols.get(name)
        if isinstance(col, StringColumn):
            for value in col.dictionary:
                if len(value) > 65536:
                    raise WireError(
                        f"a value of `{name}` is {len(value)} characters; the limit is 65536",
                        f"tables.{kind.name}.cols.{name}",
                    )
