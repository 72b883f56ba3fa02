"""Decode and validate a wire batch into numpy columns.

Two levels of refusal (docs/architecture.md, "Strict"):

- the batch: it does not decode, has an unknown version, kind or column, a column of the wrong
  length, a required column missing, or a bad ``ctx`` -> :class:`WireError` naming the field,
  nothing of it written (:class:`BatchTooLarge` over the size, row or decoded-bytes limits);
- a row: it breaks a rule (a negative or out-of-range rank or step, a time that is not finite or
  is too far ahead of the server's clock, an unknown event kind, event attrs the ingest path
  cannot read, a scalar name outside its alphabet, a string over 64 KiB) -> that row alone is
  dropped and counted in ``DecodedBatch.rejected`` by field. A batch whose every row is refused
  is refused whole (a 400 naming the first bad field).

Every rule is checked here, before anything is written, so the ingest path never fails on a
value after it stored part of a batch. Numeric columns arrive as packed little-endian arrays and
become numpy views of the decompressed body (no copy, no Python object per value); JSON's plain
lists take the slow path and get a tighter size limit, as they cost ~10x their size in objects.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
import zlib
from collections.abc import Callable
from typing import Any, Union

import msgspec
import numpy as np

from ..errors import BatchTooLarge, UnsupportedVersion, WireError
from ..schema import CTX_KEYS, DTYPES, KINDS, WIRE_VERSION, RecordKind
from ..store.batch import Col, DecodedBatch, StringColumn
from ..wire import Batch, BatchFrame, DictColumn
from .rows import NAME_RULE, TIME_COLUMNS, DecodeLimits, Rules

__all__ = [
    "ID_PATTERN",
    "NAME_RULE",
    "DecodeLimits",
    "DecodedBatch",
    "StringColumn",
    "decode_batch",
    "decode_frames",
]

_BATCH_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@/+=-]{0,127}$")
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@+=-]{0,255}$"
"""Run, job, project and experiment ids: they are path segments of the API, so no ``/``, no
spaces and no control characters."""
_ID_RE = re.compile(ID_PATTERN)
_CTX_IDS = ("project", "experiment_id", "run_id", "job_id")
_CHUNK = 32 << 20
"""Inflate in pieces this large: glibc maps allocations of 32 MiB and more on their own and
gives them back when freed, so the bodies of many requests do not pile up in per-thread arenas
(with 1 MiB pieces four concurrent bombs left ~1 GB resident, with 32 MiB ~0.6 GB)."""


class _DictColumn(msgspec.Struct, forbid_unknown_fields=True):
    dict: list[str]
    codes: Union[memoryview, list[int]]  # noqa: UP007 - msgspec needs the explicit union


_ColumnValue = Union[memoryview, list[Union[int, float, str, None]], _DictColumn]  # noqa: UP007


class _Table(msgspec.Struct, forbid_unknown_fields=True):
    n: int
    cols: dict[str, _ColumnValue]


class _Batch(msgspec.Struct, forbid_unknown_fields=True):
    """:class:`fleetlens.wire.Batch` as the server reads MessagePack: packed columns stay
    views of the body instead of copies."""

    v: int
    batch_id: str
    tables: dict[str, _Table]
    ctx: dict[str, str] = {}
    source: str = ""
    sent_at: float = 0.0
    dropped: dict[str, int] = {}


_MSGPACK_DECODER = msgspec.msgpack.Decoder(_Batch)
_JSON_DECODER = msgspec.json.Decoder(Batch)


def _decompress(body: bytes, encoding: str, limit: int) -> bytes | bytearray:
    """The body, decompressed in chunks: a bomb costs at most ``limit`` bytes, never more. The
    chunks go into one buffer that grows in place (a list of chunks and their join held twice
    the body at the end: a 256 MiB bomb cost 512 MiB on its decode slot)."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        if len(body) > limit:
            raise BatchTooLarge(f"body is {len(body)} bytes; the decoded limit is {limit}")
        return body
    if enc not in ("gzip", "deflate"):
        raise WireError(f"Content-Encoding {encoding!r} is not supported; use gzip or none")
    d = zlib.decompressobj(31 if enc == "gzip" else 15)
    out = bytearray()
    data = body
    try:
        while True:
            chunk = d.decompress(data, min(_CHUNK, limit - len(out) + 1))
            if len(out) + len(chunk) > limit:
                del out[:]  # a refusal kept with its traceback must not keep the bomb
                raise BatchTooLarge(f"decompressed body is over {limit} bytes")
            out += chunk
            del chunk
            data = d.unconsumed_tail
            if not data or d.eof:
                break
    except zlib.error as exc:
        raise WireError(f"body is not valid {enc}: {exc}") from exc
    if not d.eof:
        raise WireError(f"{enc} body is truncated")
    return out


def measure_skew(sent_at: float, now: float, transmitted_at: float | None) -> tuple[float, bool]:
    """(server clock - sender clock, whether it is certain enough to correct times by).

    ``transmitted_at`` (the ``X-Fleetlens-Sent-At`` header, stamped by the sender on every
    attempt) measures the skew in both directions. Without it only the body's ``sent_at`` is
    known, stamped when the batch was encoded: a batch replayed from a spool carries an old one,
    so a sender that looks *behind* may only be late, and is flagged, not corrected; a sender
    that looks *ahead* is ahead (nothing makes ``sent_at`` later than the truth).
    """
    if transmitted_at is not None and math.isfinite(transmitted_at) and transmitted_at > 0:
        return now - transmitted_at, True
    if not math.isfinite(sent_at) or sent_at <= 0:
        return 0.0, False
    skew = now - sent_at
    return skew, skew < 0


DEFAULT_LIMITS = DecodeLimits()


def decode_batch(
    body: bytes,
    content_type: str = "application/msgpack",
    content_encoding: str = "",
    limits: DecodeLimits = DEFAULT_LIMITS,
    *,
    now: float | None = None,
    transmitted_at: float | None = None,
    declared_world: Callable[[dict[str, str]], int] | None = None,
) -> DecodedBatch:
    """Decode ``body`` into validated columns; raise :class:`WireError` naming what is wrong.

    ``now`` is when the server received it (default: now); ``declared_world(ctx)`` the world
    size the run's job declared earlier (0 if unknown), which bounds its ranks.
    """
    if len(body) > limits.max_body_bytes:
        raise BatchTooLarge(f"body is {len(body)} bytes; the limit is {limits.max_body_bytes}")
    ctype = content_type.split(";")[0].strip().lower()
    is_json = ctype in ("application/json", "text/json")
    if not is_json and ctype not in (
        "application/msgpack",
        "application/x-msgpack",
        "application/vnd.msgpack",
    ):
        raise WireError(
            f"Content-Type {content_type!r} is not supported; "
            "use application/msgpack or application/json"
        )
    limit = limits.max_json_bytes if is_json else limits.max_decoded_bytes
    raw = _decompress(body, content_encoding, limit)
    try:
        batch: Any = _JSON_DECODER.decode(raw) if is_json else _MSGPACK_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        if "`$.v`" in msg or msg.startswith("Object missing required field `v`"):
            raise UnsupportedVersion(f"batch has no valid wire version: {msg}", "v") from exc
        raise WireError(f"batch does not match the wire schema: {msg}", _path(msg)) from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise WireError(f"batch is not valid {ctype}: {exc}") from exc
    now = time.time() if now is None else now
    decoded = _validate(batch, limits, now, transmitted_at, declared_world)
    decoded.nbytes = len(raw)
    return decoded


def _path(msg: str) -> str | None:
    m = re.search(r"at `\$\.?([^`]*)`", msg)
    return m.group(1) if m else None


def _check_ctx(batch: Any) -> None:
    if not _BATCH_ID_RE.match(batch.batch_id):
        raise WireError(
            f"batch_id {batch.batch_id!r} is not valid: 1-128 characters of letters, digits "
            "and _.:@/+=-, starting with a letter or digit",
            "batch_id",
        )
    for key, value in batch.ctx.items():
        if key not in CTX_KEYS:
            raise WireError(f"ctx key {key!r} is not known; known keys: {list(CTX_KEYS)}", "ctx")
        if key in _CTX_IDS and value and not _ID_RE.match(value):
            raise WireError(
                f"ctx.{key} is {value[:80]!r}; ids are 1-256 characters of letters, digits and "
                "_.:@+=-, starting with a letter or digit (no '/', spaces or control characters)",
                f"ctx.{key}",
            )
        if len(value) > 256 or not value.isprintable():
            raise WireError(f"ctx.{key} must be printable and at most 256 characters", f"ctx.{key}")


def _validate(
    batch: Any,
    limits: DecodeLimits,
    now: float,
    transmitted_at: float | None,
    declared_world: Callable[[dict[str, str]], int] | None,
) -> DecodedBatch:
    if batch.v != WIRE_VERSION:
        raise UnsupportedVersion(
            f"wire version {batch.v} is not supported; this server reads version {WIRE_VERSION}",
            "v",
        )
    _check_ctx(batch)
    if not batch.tables:
        raise WireError("batch has no tables", "tables")
    total = 0
    parsed: dict[str, tuple[RecordKind, int, dict[str, Col]]] = {}
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
        parsed[kind_name] = (kind, n, cols)
    ctx = dict(batch.ctx)
    digests = {k: _digest(cols) for k, (_, _, cols) in parsed.items()}
    skew, certain = measure_skew(float(batch.sent_at), now, transmitted_at)
    shift = skew if certain and abs(skew) > limits.skew_tolerance_s else 0.0
    world = declared_world(ctx) if declared_world is not None else 0
    if "placement" in parsed:
        w = parsed["placement"][2].get("world_size")
        if isinstance(w, np.ndarray) and len(w):
            world = max(world, int(np.clip(w, 0, limits.max_world_size).max()))
    rules = Rules(limits, now, world)
    tables: dict[str, tuple[int, dict[str, Col]]] = {}
    for kind_name, (kind, n, cols) in parsed.items():
        if shift:
            cols = _shift_times(kind, cols, shift)
        keep = rules.check(kind, cols, n)
        if keep is not None:
            cols = {name: _take(value, keep) for name, value in cols.items()}
            n = int(keep.sum())
        tables[kind_name] = (n, cols)
    if total and not any(n for n, _ in tables.values()):
        field, message = rules.first
        raise WireError(message, field)
    return DecodedBatch(
        batch.batch_id,
        ctx,
        tables,
        batch.source,
        dict(batch.dropped),
        digests,
        rules.rejected,
        rules.errors,
        skew,
        shift,
    )


def _digest(cols: dict[str, Col]) -> str:
    """A hash of a table's content as sent: same rows, same hash; any change, another one.
    (The bytes are hashed in one call: the same hash as one update a part, at a third of the
    cost on an SDK's batch of one step.)"""
    parts: list[bytes] = []
    for name in sorted(cols):
        value = cols[name]
        parts.append(name.encode() + b"\x00")
        if isinstance(value, StringColumn):
            for s in value.dictionary:
                b = s.encode("utf-8", "surrogatepass")
                parts.append(len(b).to_bytes(8, "little") + b)
            parts.append(value.codes.tobytes())  # C order, as ascontiguousarray's bytes
        else:
            parts.append(value.tobytes())
    return hashlib.sha256(b"".join(parts)).hexdigest()[:32]


def _shift_times(kind: RecordKind, cols: dict[str, Col], shift: float) -> dict[str, Col]:
    out = dict(cols)
    for name in TIME_COLUMNS:
        v = cols.get(name)
        if isinstance(v, np.ndarray) and kind.by_name[name].dtype.startswith("float"):
            out[name] = v + shift
    return out


def _take(value: Col, keep: np.ndarray[Any, Any]) -> Col:
    if isinstance(value, StringColumn):
        return StringColumn(value.dictionary, np.ascontiguousarray(value.codes[keep]))
    return np.ascontiguousarray(value[keep])


_NP_DTYPES = {name: np.dtype(np_name) for name, (_, np_name, _) in DTYPES.items() if np_name}


def _column(kind: RecordKind, name: str, value: object, n: int) -> Col:
    col = kind.by_name.get(name)
    np_dtype = _NP_DTYPES.get(col.dtype) if col is not None else None
    if np_dtype is not None and isinstance(value, bytes) and len(value) == n * np_dtype.itemsize:
        return np.frombuffer(value, dtype=np_dtype)  # packed, as the SDK sends: the common case
    where = f"tables.{kind.name}.cols.{name}"
    if col is None:
        raise WireError(
            f"record kind {kind.name!r} has no column {name!r}; columns: {list(kind.column_names)}",
            where,
        )
    if col.dtype == "string":
        if isinstance(value, DictColumn | _DictColumn):
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
    np_dtype = _NP_DTYPES[col.dtype]
    if isinstance(value, bytes | memoryview):
        size = value.nbytes if isinstance(value, memoryview) else len(value)
        if size != n * np_dtype.itemsize:
            raise WireError(
                f"{where} is {size} bytes; {n} values of {col.dtype} need {n * np_dtype.itemsize}",
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


def _codes(raw: bytes | memoryview | list[int], where: str) -> np.ndarray[Any, np.dtype[np.int32]]:
    if isinstance(raw, bytes | memoryview):
        size = raw.nbytes if isinstance(raw, memoryview) else len(raw)
        if size % 4:
            raise WireError(f"{where}.codes is {size} bytes; not a multiple of 4", where)
        codes = np.frombuffer(raw, dtype="<u4")
        if len(codes) and int(codes.max()) > np.iinfo(np.int32).max:
            raise WireError(f"{where}.codes has a code too large", where)
        return codes.view(np.int32)
    try:
        return np.asarray(raw, dtype=np.int32)
    except (OverflowError, ValueError, TypeError) as exc:
        raise WireError(f"{where}.codes must be non-negative integers", where) from exc


MAX_FRAMES = 4096
"""Batches in one multi-batch request (a relay sends far fewer: 256 by default)."""
_FRAMES = msgspec.msgpack.Decoder(list[BatchFrame])


def decode_frames(body: bytes, content_encoding: str = "") -> list[BatchFrame]:
    """The batches of a multi-batch request (:data:`fleetlens.wire.BATCHES_CONTENT_TYPE`).

    Only the envelope is checked here (each frame is decoded and validated on its own by
    :meth:`fleetlens.collector.ingest.Ingestor.prepare_frames`); raises :class:`WireError`
    naming what is wrong with it.
    """
    if content_encoding.strip().lower() not in ("", "identity"):
        raise WireError(
            f"Content-Encoding {content_encoding!r} on a multi-batch request; send it "
            "uncompressed: each batch carries its own encoding",
            "Content-Encoding",
        )
    try:
        frames = _FRAMES.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise WireError(f"not a MessagePack array of batch frames: {exc}", "frames") from exc
    if not frames:
        raise WireError("a multi-batch request holds no batch", "frames")
    if len(frames) > MAX_FRAMES:
        raise WireError(f"{len(frames)} batches in one request; at most {MAX_FRAMES}", "frames")
    return frames
