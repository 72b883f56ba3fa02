"""Where simulated records go: a collector over HTTP, a directory of batch files, or memory.

Records are columns (numpy arrays, or lists of strings) grouped into batches of the wire format
exactly as the SDK sends them: one ctx per batch (run and job attempt), numeric columns packed,
string columns dictionary-encoded, up to ``batch_rows`` rows. The HTTP sink honours 429/503 with
Retry-After and raises on any other 4xx, because a batch the server refuses is a simulator bug.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import APIError, SimError, TransportError
from ..schema import DTYPES, KINDS
from ..wire import DictColumn, Table, encode_batch

__all__ = [
    "Batcher",
    "DirSink",
    "HttpSink",
    "MemorySink",
    "SimError",
    "Sink",
    "by_data_time",
    "open_sink",
]

Cols = dict[str, Any]


class Sink(Protocol):
    def send(self, ctx: dict[str, str], tables: dict[str, tuple[int, Cols]]) -> None: ...

    def close(self) -> None: ...


def _table(kind: str, n: int, cols: Cols) -> Table:
    rk = KINDS[kind]
    out: dict[str, Any] = {}
    for name, values in cols.items():
        col = rk.by_name[name]
        if col.dtype == "string":
            if isinstance(values, tuple):  # (dictionary, codes) already encoded
                out[name] = DictColumn(
                    dict=list(values[0]), codes=values[1].astype("<u4").tobytes()
                )
            else:
                index: dict[str, int] = {}
                codes = np.fromiter((index.setdefault(v, len(index)) for v in values), "<u4")
                out[name] = DictColumn(dict=list(index), codes=codes.tobytes())
        else:
            out[name] = np.ascontiguousarray(values, dtype=DTYPES[col.dtype][1]).tobytes()
    return Table(n=n, cols=out)


def encode(ctx: dict[str, str], tables: dict[str, tuple[int, Cols]]) -> bytes:
    built = {kind: _table(kind, n, cols) for kind, (n, cols) in tables.items()}
    return encode_batch(built, ctx, source="fleetlens-sim")[1]


class HttpSink:
    """POST batches to ``{url}/v1/ingest`` through :class:`fleetlens.client.Client`.

    ``token`` None takes ``$FLEETLENS_TOKEN``; ``""`` sends none.
    """

    def __init__(
        self,
        url: str,
        timeout: float = 120.0,
        max_retries: int = 200,
        token: str | None = None,
    ) -> None:
        from ..client import Client

        u = urllib.parse.urlparse(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise SimError(f"server URL {url!r} is not valid; use http://host:port")
        self.client = Client(url, token, timeout=timeout)
        self.timeout = timeout
        self.max_retries = max_retries
        self.batches = 0

    def send(self, ctx: dict[str, str], tables: dict[str, tuple[int, Cols]]) -> None:

        body = encode(ctx, tables)
        for attempt in range(self.max_retries):
            try:
                self.client.ingest(body, timeout=self.timeout)
            except TransportError:
                if attempt >= 5:
                    raise
                time.sleep(0.5 * (attempt + 1))
                continue
            except APIError as exc:
                if exc.status in (429, 503) or exc.status >= 500:
                    wait = 0.5 if exc.retry_after is None else exc.retry_after
                    time.sleep(min(wait, 5.0))
                    continue
                raise SimError(
                    f"collector refused a simulated batch: HTTP {exc.status}: {exc.message[:500]}"
                ) from exc
            self.batches += 1
            return
        raise TransportError(f"collector kept refusing a batch after {self.max_retries} tries")

    def close(self) -> None:
        self.client.close()


class DirSink:
    """Write each batch as ``batch-000001.msgpack`` (the body the SDK would POST)."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.batches = 0

    def send(self, ctx: dict[str, str], tables: dict[str, tuple[int, Cols]]) -> None:
        self.batches += 1
        (self.dir / f"batch-{self.batches:06d}.msgpack").write_bytes(encode(ctx, tables))

    def close(self) -> None:
        pass


class MemorySink:
    """Keep batches as columns, for tests and in-process analysis (no encoding)."""

    def __init__(self) -> None:
        self.batches: list[tuple[dict[str, str], dict[str, tuple[int, Cols]]]] = []

    def send(self, ctx: dict[str, str], tables: dict[str, tuple[int, Cols]]) -> None:
        self.batches.append((dict(ctx), tables))

    def close(self) -> None:
        pass

    def column(self, kind: str, name: str, job_id: str | None = None) -> Any:
        """All values of one column of ``kind`` (numeric: one array; string: one list)."""
        parts: list[Any] = []
        for ctx, tables in self.batches:
            if kind in tables and (job_id is None or ctx.get("job_id") == job_id):
                n, cols = tables[kind]
                parts.append(_values(cols[name], n) if name in cols else None)
        if not parts:
            return np.array([])
        if isinstance(parts[0], list):
            return [v for p in parts for v in p]
        return np.concatenate(parts)


def _values(v: Any, n: int) -> Any:
    if isinstance(v, tuple):
        d = v[0]
        return [d[c] for c in v[1].tolist()]
    if isinstance(v, list):
        return v
    return np.broadcast_to(np.asarray(v), (n,))


class NullSink:
    """Count nothing, keep nothing: for measuring generation alone."""

    def send(self, ctx: dict[str, str], tables: dict[str, tuple[int, Cols]]) -> None:
        pass

    def close(self) -> None:
        pass


def open_sink(
    server: str | None, out_dir: str | os.PathLike[str] | None, token: str | None = None
) -> Sink:
    if server:
        return HttpSink(server, token=token)
    if out_dir:
        return DirSink(Path(out_dir) / "batches")
    return NullSink()


class Batcher:
    """Groups columns into batches of up to ``max_rows`` rows with one ctx each."""

    def __init__(self, sink: Sink, max_rows: int = 200_000) -> None:
        self.sink = sink
        self.max_rows = max_rows
        self.ctx: dict[str, str] = {}
        self.parts: dict[str, list[tuple[int, Cols]]] = {}
        self.rows = 0
        self.total: dict[str, int] = {}

    def add(self, ctx: dict[str, str], kind: str, n: int, cols: Cols) -> None:
        if n == 0:
            return
        if ctx != self.ctx or self.rows + n > self.max_rows:
            self.flush()
            self.ctx = dict(ctx)
        self.parts.setdefault(kind, []).append((n, cols))
        self.rows += n
        self.total[kind] = self.total.get(kind, 0) + n

    def flush(self) -> None:
        if not self.parts:
            return
        tables = {kind: _concat(parts) for kind, parts in self.parts.items()}
        self.parts = {}
        self.rows = 0
        self.sink.send(self.ctx, tables)


def _concat(parts: Sequence[tuple[int, Cols]]) -> tuple[int, Cols]:
    """Parts of one table as one. A column some parts lack (the DCGM sample that carries an
    Xid has no temperature or clocks) is NaN in their rows: a value the record did not have,
    never the column dropped from the other parts' rows."""
    if len(parts) == 1:
        return parts[0]
    n = sum(p[0] for p in parts)
    names = list(dict.fromkeys(name for _, cols in parts for name in cols))
    out: Cols = {}
    for name in names:
        have = [cols[name] for _, cols in parts if name in cols]
        if len(have) < len(parts) and not all(
            isinstance(v, np.ndarray) and v.dtype.kind == "f" for v in have
        ):
            raise ValueError(f"column {name!r} is missing from some rows and is not a float")
        vals = [_values(cols[name], k) if name in cols else np.full(k, np.nan) for k, cols in parts]
        out[name] = (
            [v for p in vals for v in p] if isinstance(vals[0], list) else np.concatenate(vals)
        )
    return n, out


Sent = tuple[dict[str, str], dict[str, tuple[int, Cols]]]


def _take(v: Any, mask: Any, idx: Any) -> Any:
    if isinstance(v, tuple):  # (dictionary, codes)
        return (v[0], v[1][mask])
    if isinstance(v, np.ndarray):
        return v[mask]
    return [v[i] for i in idx.tolist()]


def by_data_time(batches: Sequence[Sent], t0: float, tick: float) -> dict[int, list[Sent]]:
    """What a sink was sent, cut into slices of ``tick`` seconds of the records' own time from
    ``t0`` (slice ``b`` holds ``[t0 + b * tick, t0 + (b + 1) * tick)``; tables without a time
    column are slice -1): to replay a run at another pace than it was simulated at."""
    slices: dict[int, list[Sent]] = {}
    for ctx, tables in batches:
        for kind, (n, cols) in tables.items():
            t = cols.get("time", cols.get("enter", cols.get("submit")))
            if n == 0:
                continue
            if not isinstance(t, np.ndarray):
                slices.setdefault(-1, []).append((ctx, {kind: (n, cols)}))
                continue
            bucket = np.floor((t - t0) / tick).astype(np.int64)
            for b in np.unique(bucket).tolist():
                mask = bucket == b
                idx = np.flatnonzero(mask)
                part = {k: _take(v, mask, idx) for k, v in cols.items()}
                slices.setdefault(b, []).append((ctx, {kind: (len(idx), part)}))
    return slices
