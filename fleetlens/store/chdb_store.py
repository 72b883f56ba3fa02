"""The embedded telemetry store: the ClickHouse engine in-process (chDB) on a local directory.

chDB runs one engine per process. This store holds two connections to it, each behind its own
lock: one for the collector's inserts and one for everything else (queries, DDL, the settle
after a crash). A connection serializes its own queries, so with one for both a commit waited
for whatever read held it (an analysis pass's, a portal page's) and the stored rate stopped at
what the reads left; the engine runs an insert beside a read on another connection. An insert
that returned is on disk (chDB keeps every returned insert across SIGKILL), which is what lets
the collector acknowledge a batch once ``insert`` returns.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any, ClassVar

import chdb
import pyarrow as pa

from ..errors import StoreError
from ..schema import KINDS
from .ddl import Layout, View, insert_settings, views
from .retention import ensure_schema
from .telemetry import context_for

__all__ = ["ATOMIC_ROWS", "ChdbStore"]

ATOMIC_ROWS = 500_000
"""Rows an insert may hold and still be one part (half the engine's squashing threshold)."""
_SETTING_RE = re.compile(r"^[A-Za-z0-9_:.@/+=-]*$")


def _settings_sql(settings: dict[str, str | int]) -> str:
    parts = []
    for key, value in settings.items():
        if isinstance(value, str):
            if not _SETTING_RE.match(value):
                raise StoreError(f"setting {key} has characters we do not quote: {value!r}")
            parts.append(f"{key} = '{value}'")
        else:
            parts.append(f"{key} = {int(value)}")
    return ", ".join(parts)


_ESCAPED = {
    "\\": "\\\\",
    "\t": "\\t",
    "\n": "\\n",
    "\r": "\\r",
    "\0": "\\0",
    "\b": "\\b",
    "\f": "\\f",
}
_QUOTED = {**_ESCAPED, "'": "\\'"}


def _escape(value: str, table: dict[str, str]) -> str:
    if not any(ch in value for ch in table):
        return value
    return "".join(table.get(ch, ch) for ch in value)


def _param(value: Any) -> Any:
    """A parameter as the engine parses it: a String from its escaped text form (a tab, a
    newline or a backslash in it would otherwise break or change the value), an Array from its
    text form ``['a','b']`` with each string quoted."""
    if isinstance(value, str):
        return _escape(value, _ESCAPED)
    if isinstance(value, list | tuple):
        parts = []
        for v in value:
            if isinstance(v, str):
                parts.append("'" + _escape(v, _QUOTED) + "'")
            else:
                parts.append(repr(v))
        return "[" + ",".join(parts) + "]"
    return value


_REBUILD_GROUPS = 500
"""Groups of a view recomputed per statement (keeps each under the engine's query size)."""


def _tuples(rows: list[dict[str, Any]]) -> str:
    """Rows as a list of tuple literals for ``(a, b) IN (...)``: strings quoted, numbers as
    text; a lone tuple is listed twice, so that it still reads as a list of tuples."""

    def lit(v: Any) -> str:
        return "'" + _escape(v, _QUOTED) + "'" if isinstance(v, str) else repr(v)

    items = ["tuple(" + ", ".join(lit(v) for v in row.values()) + ")" for row in rows]
    return ", ".join(items * 2 if len(items) == 1 else items)


def _params(params: dict[str, Any] | None) -> dict[str, Any]:
    return {k: _param(v) for k, v in (params or {}).items()}


class ChdbStore:
    """Telemetry in chDB under ``data_dir``. One per process at a time (an engine limit)."""

    atomic_rows: ClassVar[int] = ATOMIC_ROWS
    _open_path: ClassVar[str | None] = None
    _class_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        data_dir: str,
        database: str = "fleetlens",
        retention: tuple[tuple[str, int], ...] | None = None,
    ) -> None:
        path = os.path.abspath(data_dir)
        with ChdbStore._class_lock:
            if ChdbStore._open_path is not None:
                raise StoreError(
                    f"a chDB store is already open in this process at {ChdbStore._open_path}; "
                    "chDB runs one engine per process: close it first"
                )
            os.makedirs(path, exist_ok=True)
            try:
                self._conn = chdb.connect(path)  # type: ignore[no-untyped-call]
            except Exception as exc:  # chDB raises plain RuntimeError for a bad path
                raise StoreError(f"cannot open chDB at {path}: {exc}") from exc
            try:
                self._writer = chdb.connect(path)  # type: ignore[no-untyped-call]
            except Exception as exc:
                self._conn.close()
                raise StoreError(f"cannot open chDB at {path}: {exc}") from exc
            ChdbStore._open_path = path
        self.path = path
        self.database = database
        self._lock = threading.Lock()  # the connection of queries and statements
        self._write_lock = threading.Lock()  # the connection of inserts
        layout = Layout(database=database)
        self._views = views(layout)
        ensure_schema(self, layout, retention)
        # The engine's first Arrow result costs ~150 ms once per process: pay it at startup,
        # not in the first user's request.
        self.query("SELECT 1 AS one")

    def insert(self, kind: str, data: pa.Table, ctx: dict[str, str], batch_id: str) -> None:
        table = KINDS[kind].table
        values = context_for(kind, ctx)
        cols = ", ".join(f"`{c}`" for c in (*values, *data.column_names))
        params = {f"c{i}": _param(v) for i, v in enumerate(values.values())}
        consts = "".join(f"{{c{i}:String}}, " for i in range(len(values)))
        settings = _settings_sql(insert_settings(batch_id, kind, values))
        _fl_rows = data
        sql = (
            f"INSERT INTO {self.database}.{table} ({cols}) "
            f"SELECT {consts}* FROM Python(_fl_rows) SETTINGS {settings}"
        )
        with self._write_lock:
            try:
                self._writer.query(sql, params=params)
            except Exception as exc:
                raise StoreError(f"insert into {table} failed: {exc}") from exc

    def insert_rows(self, kind: str, data: pa.Table) -> None:
        """Insert rows that carry their context columns and ``_batch`` keys (group commit).

        An insert of fewer rows than the engine squashes into one block
        (``min_insert_block_size_rows``, ~1M) is one part: a crash leaves all of it or none. The
        collector keeps its inserts under :data:`ATOMIC_ROWS`."""
        table = KINDS[kind].table
        cols = ", ".join(f"`{c}`" for c in data.column_names)
        _fl_rows = data
        sql = (
            f"INSERT INTO {self.database}.{table} ({cols}) SELECT * FROM Python(_fl_rows) "
            "SETTINGS insert_allow_materialized_columns = 1, insert_deduplicate = 0"
        )
        with self._write_lock:
            try:
                self._writer.query(sql)
            except Exception as exc:
                raise StoreError(f"insert into {table} failed: {exc}") from exc

    def settle(self, pieces: list[tuple[str, int, int]]) -> set[int]:
        """Of (kind, key, rows) pieces an interrupted insert held, the keys stored whole; rows
        of a piece stored in part are deleted, so that its retry stores it whole.

        The engine writes a table and then its materialized views: a crash between the two
        leaves rows a view never saw. Each view is asked whether it saw the insert (two counts,
        :meth:`View.seen_sql`) and one that missed it is fed the insert's rows alone
        (:meth:`View.catch_up_sql`): the cost is a few reads and at most one insert per view,
        whatever the size of the interrupted insert, so a restart is not held by it. Only what
        a count cannot explain (a piece stored in part, a view off by some other number of
        rows) falls back to computing its groups again (:meth:`_rebuild`)."""
        by_kind: dict[str, dict[int, int]] = {}
        for kind, key, rows in pieces:
            if kind in KINDS:
                by_kind.setdefault(kind, {})[key] = rows
        whole: set[int] = set()
        for kind, want in by_kind.items():
            table = f"{self.database}.{KINDS[kind].table}"
            keys = ", ".join(str(int(k)) for k in want)
            got = self.query(
                f"SELECT _batch AS k, count() AS n FROM {table} WHERE _batch IN ({keys}) "
                "GROUP BY _batch"
            )
            if not got.num_rows:
                continue  # none of it reached the table, so none reached its views
            counts = {int(r["k"]): int(r["n"]) for r in got.to_pylist()}
            whole |= {k for k, n in counts.items() if n >= want.get(k, 0)}
            partial = [k for k, n in counts.items() if n < want.get(k, 0)]
            views = [v for v in self._views if v.source == KINDS[kind].table]
            if partial:
                self._rebuild(table, views, keys, partial)
                continue
            present = sum(counts.values())
            for view in views:
                seen = self.query(view.seen_sql(self.database, keys)).to_pylist()[0]
                missed = int(seen["source"] or 0) - int(seen["target"] or 0)
                if missed == present:
                    self.command(view.catch_up_sql(self.database, keys))
                elif missed:
                    self._rebuild(table, [view], keys, [])
        return whole

    def _rebuild(self, table: str, views: list[View], keys: str, partial: list[int]) -> None:
        """Delete the ``partial`` pieces' rows from ``table`` and compute every group of
        ``views`` the pieces ``keys`` fall in again from it (synchronous mutations, slow on a
        large insert: only for what :meth:`settle` cannot settle by counting)."""
        touched = [
            (view, self.query(view.groups_sql(self.database, keys)).to_pylist()) for view in views
        ]
        if partial:
            self.command(
                f"ALTER TABLE {table} DELETE WHERE _batch IN "
                f"({', '.join(map(str, partial))}) SETTINGS mutations_sync = 1"
            )
        for view, groups in touched:
            for i in range(0, len(groups), _REBUILD_GROUPS):
                literal = _tuples(groups[i : i + _REBUILD_GROUPS])
                for stmt in view.rebuild_sql(self.database, literal):
                    self.command(stmt)

    def query(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        with self._lock:
            try:
                result = self._conn.query(sql, "ArrowTable", params=_params(params))
            except Exception as exc:
                if "empty message" in str(exc):  # chDB's Arrow answer to an empty result
                    return pa.table({})
                raise StoreError(f"query failed: {exc}") from exc
        if not isinstance(result, pa.Table):
            raise StoreError(f"chDB returned {type(result).__name__}, expected an Arrow table")
        return result

    def command(self, sql: str) -> None:
        with self._lock:
            try:
                self._conn.query(sql)
            except Exception as exc:
                raise StoreError(f"statement failed: {exc}\n{sql}") from exc

    def command_params(self, sql: str, params: dict[str, Any]) -> None:
        with self._lock:
            try:
                self._conn.query(sql, params=_params(params))
            except Exception as exc:
                raise StoreError(f"statement failed: {exc}") from exc

    def close(self) -> None:
        """Close both connections, each once the statement running on it ended (or after
        :data:`_CLOSE_WAIT_S`: a statement stuck in the engine does not hold the shutdown)."""
        with ChdbStore._class_lock:
            if ChdbStore._open_path != self.path:
                return
        try:
            _close(self._writer, self._write_lock)
        finally:
            try:
                _close(self._conn, self._lock)
            finally:
                with ChdbStore._class_lock:
                    if ChdbStore._open_path == self.path:
                        ChdbStore._open_path = None


_CLOSE_WAIT_S = 30.0


def _close(conn: Any, lock: threading.Lock) -> None:
    held = lock.acquire(timeout=_CLOSE_WAIT_S)
    try:
        conn.close()
    finally:
        if held:
            lock.release()
