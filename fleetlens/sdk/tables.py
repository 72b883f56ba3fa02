"""Turns buffered entries into the columnar tables of a wire batch (exporter thread only).

This is where the cost the hot path avoided is paid: attribute dicts become JSON, scalars are
exploded into rows, columns are packed. A user value that cannot be packed (a step that is not an
integer, a scalar that is not a number) must not cost the whole batch, so a table that fails on
the fast path is rebuilt entry by entry and the bad entries are counted and dropped.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

import msgspec

from ..schema import KINDS
from ..wire import Table, TableBuilder
from .buffer import COLLECTIVE, EVENT, PLACEMENT, SAMPLE, SCALARS, STEP, Entry

__all__ = ["Identity", "build_tables"]

_JSON = msgspec.json.Encoder(enc_hook=repr)
_SHAPE = itemgetter(0)


class Identity(msgspec.Struct, frozen=True):
    """Per-process columns that the hot path leaves out of its tuples."""

    rank: int
    node_id: str
    gpu: int


def _attrs_json(attrs: dict[str, Any] | None) -> str:
    if not attrs:
        return "{}"
    try:
        return _JSON.encode(attrs).decode()
    except Exception:  # a key that is not a string, a cycle, ...
        return _JSON.encode({str(k): repr(v) for k, v in attrs.items()}).decode()


_I64 = struct.Struct("<q").pack
_F64 = struct.Struct("<d").pack
_I32 = struct.Struct("<i").pack


def _ints(tb: TableBuilder, name: str, values: Sequence[Any]) -> TableBuilder:
    """An integer column: packed as they are, or as ``int()`` reads them (a float step)."""
    try:
        return tb.add(name, values)
    except TypeError:
        return tb.add(name, [int(v) for v in values])


def _step(rows: Sequence[Entry], ident: Identity) -> Table:
    # One transposition in C, then a pack per column.
    _, step, t, duration, data_wait, forward, backward, optimizer, comm, tokens = zip(
        *rows, strict=True
    )
    tb = _ints(TableBuilder("step"), "step", step).add_packed("rank", _I32(ident.rank) * len(rows))
    tb.add("time", t).add("duration", duration).add("data_wait", data_wait)
    tb.add("forward", forward).add("backward", backward).add("optimizer", optimizer)
    return _ints(tb.add("comm", comm), "tokens", tokens).build()


def _scalar(rows: Sequence[Entry], ident: Identity) -> Table:
    # A run logs the same names step after step, ten or more a step: an entry's step and time
    # are packed once and repeated as bytes, its names' codes worked out once per set of names,
    # so an entry costs a few C calls rather than a Python step per value.
    steps: list[bytes] = []
    times: list[bytes] = []
    codes: list[bytes] = []
    values: list[Any] = []
    index: dict[str, int] = {}
    last: tuple[str, ...] = ()
    last_codes = b""
    for _, step, t, scalars in rows:
        k = len(scalars)
        steps.append(_I64(int(step)) * k)
        times.append(_F64(t) * k)
        values += scalars.values()
        names = tuple(scalars)
        if names != last:
            last = names
            last_codes = struct.pack(f"<{k}I", *(index.setdefault(n, len(index)) for n in names))
        codes.append(last_codes)
    n = len(values)
    tb = TableBuilder("scalar").add_packed("step", b"".join(steps))
    tb.add_packed("rank", _I32(ident.rank) * n).add_packed("time", b"".join(times))
    tb.add_dict("name", list(index), b"".join(codes))
    try:
        tb.add("value", values)
    except TypeError:  # numbers in other clothes (a numeric string, say): as float() reads them
        tb.add("value", [float(v) for v in values])
    return tb.build()


def _event(rows: Sequence[Entry], ident: Identity) -> Table:
    n = len(rows)
    return (
        TableBuilder("event")
        .add("time", [e[1] for e in rows])
        .add("kind", [str(e[2]) for e in rows])
        .add("step", [-1 if e[3] is None else int(e[3]) for e in rows])
        .add("rank", [ident.rank] * n)
        .add("node_id", [ident.node_id] * n)
        .add("gpu", [ident.gpu] * n)
        .add("message", [str(e[4]) for e in rows])
        .add("attrs", [_attrs_json(e[5]) for e in rows])
        .build()
    )


def _collective(rows: Sequence[Entry], ident: Identity) -> Table:
    return (
        TableBuilder("collective")
        .add("step", [int(e[1]) for e in rows])
        .add("rank", [ident.rank] * len(rows))
        .add("seq", [int(e[2]) for e in rows])
        .add("op", [str(e[3]) for e in rows])
        .add("group", [str(e[4]) for e in rows])
        .add("enter", [float(e[5]) for e in rows])
        .add("exit", [float(e[6]) for e in rows])
        .add("bytes", [int(e[7]) for e in rows])
        .build()
    )


def _placement(rows: Sequence[Entry], ident: Identity) -> Table:
    return (
        TableBuilder("placement")
        .add("time", [e[1] for e in rows])
        .add("rank", [e[2] for e in rows])
        .add("local_rank", [e[3] for e in rows])
        .add("world_size", [e[4] for e in rows])
        .add("node_id", [e[5] for e in rows])
        .add("gpu", [e[6] for e in rows])
        .build()
    )


_BUILDERS: dict[int, tuple[str, Callable[[Sequence[Entry], Identity], Table]]] = {
    STEP: ("step", _step),
    SCALARS: ("scalar", _scalar),
    EVENT: ("event", _event),
    COLLECTIVE: ("collective", _collective),
    PLACEMENT: ("placement", _placement),
}


def _samples(rows: Sequence[Entry]) -> tuple[dict[str, Table], int]:
    """SAMPLE entries by kind; a column some rows lack takes the schema's fill value."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    bad = 0
    for _, kind, values in rows:
        if kind in KINDS and isinstance(values, dict):
            by_kind.setdefault(kind, []).append(values)
        else:
            bad += 1
    tables: dict[str, Table] = {}
    for kind, dicts in by_kind.items():
        spec = KINDS[kind]
        names = [c for c in spec.column_names if any(c in d for d in dicts)]
        try:
            tb = TableBuilder(kind)
            for name in names:
                fill = spec.by_name[name].fill
                tb.add(name, [d.get(name, fill) for d in dicts])
            tables[kind] = tb.build()
        except Exception:
            bad += len(dicts)
    return tables, bad


def build_tables(entries: Sequence[Entry], ident: Identity) -> tuple[dict[str, Table], int]:
    """Group entries by shape and build one table per record kind; returns (tables, bad)."""
    groups: dict[int, list[Entry]] = {}
    # A drain holds long runs of one shape (a class's queue at a time): group runs, not entries.
    for code, run in groupby(entries, key=_SHAPE):
        group = groups.get(code)
        if group is None:
            groups[code] = list(run)
        else:
            group.extend(run)
    tables: dict[str, Table] = {}
    bad = 0
    samples = groups.pop(SAMPLE, None)
    if samples:
        tables, bad = _samples(samples)
    for code, rows in groups.items():
        if code not in _BUILDERS:
            bad += len(rows)
            continue
        kind, build = _BUILDERS[code]
        try:
            tables[kind] = build(rows, ident)
        except Exception:
            good: list[Entry] = []
            for e in rows:
                try:
                    build([e], ident)
                except Exception:
                    bad += 1
                else:
                    good.append(e)
            if good:
                tables[kind] = build(good, ident)
    return tables, bad
