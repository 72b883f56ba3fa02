"""One PyTorch NCCL Flight Recorder dump, read safely and parsed once into typed values.

PyTorch writes, per rank, a pickled dict (or JSON when the job asked for it): ``version``,
``pg_config`` (process group name -> ``{name, desc, ranks}``, the ranks as the string
``"[0, 1, 2]"``), ``pg_status`` (per-rank ``pg_id`` -> ``{last_completed_collective, ...}``)
and ``entries`` (the recorded collectives: ``process_group`` ``[name, desc]``, ``pg_id``,
``collective_seq_id``, ``state``, ``profiling_name``, ``is_p2p``, ``time_created_ns``,
``input_sizes``, ``input_dtypes``, ...). Versions 2.x (NCCL and gloo) are read; a field a
version leaves out takes the default below, fields the analysis does not read are dropped.

Unpickling runs code a pickle names, so :func:`load_dump` reads pickles with an unpickler that
refuses every global: a dump is plain dicts, lists, tuples, strings and numbers, and anything
else is not a dump. :func:`parse_dump` checks the decoded dict and makes the
:class:`FlightRecorderDump` the analyses read (``fleetlens.analysis.flight_recorder`` and
``fleetlens.analysis.hangs``); a malformed dump is a :class:`TraceFormatError` naming the file.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import TraceFormatError

__all__ = [
    "FlightRecorderDump",
    "FlightRecorderEntry",
    "PgConfig",
    "load_dump",
    "parse_dump",
]


@dataclass(frozen=True, slots=True)
class FlightRecorderEntry:
    """One recorded collective (or p2p op) of a rank.

    ``group`` is ``process_group[0]``, the group's name, the same on every rank (``pg_id`` is
    per rank); ``group_desc`` is ``process_group[1]``, None when the entry names no desc.
    ``seq`` is ``collective_seq_id`` (-1 when absent), ``op`` ``profiling_name``. The sizes and
    dtypes are JSON values (a pickle's tuples as lists), kept for a finding's evidence."""

    group: str
    group_desc: str | None
    pg_id: str
    seq: int
    state: str
    op: str
    is_p2p: bool
    time_created_ns: int | None = None
    input_sizes: tuple[Any, ...] = ()
    input_dtypes: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class PgConfig:
    """A process group as a rank's ``pg_config`` describes it: its name (None when the dump
    gives none), its description ("" when none) and its member ranks (empty when not given)."""

    name: str | None
    desc: str
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FlightRecorderDump:
    """What the analyses read of one rank's dump: its entries, oldest first; its process
    groups (``pg_config``, by the key PyTorch gives them: the group's name); and the last
    collective completed per ``pg_id`` (``pg_status``, where it holds an int)."""

    entries: tuple[FlightRecorderEntry, ...] = ()
    pg_config: Mapping[str, PgConfig] = field(default_factory=dict)
    last_completed: Mapping[str, int] = field(default_factory=dict)


class _NoGlobals(pickle.Unpickler):
    """An unpickler that builds only the pickle protocol's own types (dict, list, tuple, str,
    bytes, numbers, bool, None): every global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refers to {module}.{name}; a dump holds plain data only")


def load_dump(raw: bytes, name: str) -> FlightRecorderDump:
    """One dump from a pickle (PyTorch's format) or JSON; TraceFormatError names the file and
    what is wrong with it."""
    head = raw.lstrip()[:1]
    try:
        if raw[:1] == b"\x80":
            dump = _NoGlobals(io.BytesIO(raw)).load()
        elif head in (b"{", b"["):
            dump = json.loads(raw)
        else:
            raise TraceFormatError(
                f"{name}: neither a pickle nor JSON (starts with {raw[:8]!r}); send the file "
                "PyTorch wrote to TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>"
            )
    except TraceFormatError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as exc:
        raise TraceFormatError(f"{name}: not a Flight Recorder dump: {exc}") from exc
    except RecursionError as exc:
        raise TraceFormatError(f"{name}: nested too deeply to be a dump") from exc
    return parse_dump(dump, name)


def parse_dump(dump: object, name: str) -> FlightRecorderDump:
    """A decoded dump (the dict PyTorch pickled, or its JSON) as a :class:`FlightRecorderDump`;
    TraceFormatError names the file (``name``) and what is wrong with it."""
    if not isinstance(dump, dict):
        raise TraceFormatError(f"{name}: a dump is a dict; this file holds a {type(dump).__name__}")
    entries = dump.get("entries", [])
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, dict) for e in entries):
        raise TraceFormatError(f"{name}: `entries` must be a list of dicts")
    tables = {}
    for key in ("pg_config", "pg_status"):
        table = dump.get(key, {})
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            raise TraceFormatError(f"{name}: `{key}` must be a dict of dicts")
        tables[key] = table
    parsed = tuple(_entry(e, i, name) for i, e in enumerate(entries))
    if "entries" not in dump and "pg_config" not in dump:
        raise TraceFormatError(f"{name}: no `entries` or `pg_config`: not a Flight Recorder dump")
    return FlightRecorderDump(
        entries=parsed,
        pg_config={str(k): _pg_config(v, k, name) for k, v in tables["pg_config"].items()},
        last_completed={
            str(pg_id): int(done)
            for pg_id, st in tables["pg_status"].items()
            if isinstance(done := st.get("last_completed_collective"), int)
        },
    )


def _entry(e: dict[Any, Any], i: int, name: str) -> FlightRecorderEntry:
    seq, pg = e.get("collective_seq_id", -1), e.get("process_group", [""])
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TraceFormatError(f"{name}: entries[{i}].collective_seq_id is {seq!r}; an int")
    if not isinstance(pg, (list, tuple)) or not pg:
        raise TraceFormatError(f"{name}: entries[{i}].process_group is {pg!r}; [name, desc]")
    created = e.get("time_created_ns")
    return FlightRecorderEntry(
        group=str(pg[0]),
        group_desc=str(pg[1]) if len(pg) > 1 else None,
        pg_id=str(e.get("pg_id")),
        seq=seq,
        state=state if isinstance(state := e.get("state"), str) else "",
        op=str(e.get("profiling_name", "")),
        is_p2p=bool(e.get("is_p2p")),
        time_created_ns=int(created) if isinstance(created, int) else None,
        input_sizes=_json_list(e.get("input_sizes") or []),
        input_dtypes=_json_list(e.get("input_dtypes") or []),
    )


def _pg_config(cfg: dict[Any, Any], key: object, name: str) -> PgConfig:
    ranks = cfg.get("ranks")
    members: list[int] = []
    if ranks is not None:
        for part in str(ranks).strip("[]").split(","):
            if not part.strip():
                continue
            if not part.strip().isdecimal():
                raise TraceFormatError(
                    f"{name}: pg_config[{key!r}].ranks is {ranks!r}; the group's ranks, "
                    "as PyTorch writes them: '[0, 1, 2]'"
                )
            members.append(int(part))
    desc = cfg.get("desc")
    return PgConfig(
        name=None if cfg.get("name") is None else str(cfg["name"]),
        desc=str(desc) if desc else "",
        ranks=tuple(members),
    )


def _json_list(x: object) -> tuple[Any, ...]:
    """``x`` as JSON values (a pickle may hold tuples or bytes), a scalar as a one-item list."""
    out = _json(x)
    return tuple(out) if isinstance(out, list) else (out,)


def _json(x: object) -> Any:
    # What a json.dumps(x, default=str) / json.loads round trip gives, without the text.
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    if isinstance(x, (list, tuple)):
        return [_json(v) for v in x]
    if isinstance(x, dict):
        return {_key(k): _json(v) for k, v in x.items()}
    return str(x)


def _key(k: object) -> str:
    if isinstance(k, str):
        return k
    return json.dumps(k) if k is None or isinstance(k, (bool, int, float)) else str(k)
