"""Telemetry on a ClickHouse server or cluster, through clickhouse-connect.

The same SQL and DDL as the embedded store. ``clickhouse://user:pass@host:8123/db?cluster=name``
selects a cluster: tables become ReplicatedMergeTree shards behind Distributed tables.
An insert returns once the server has written it (``wait_end_of_query``), so the collector's
acknowledgement means the same thing as with chDB.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlparse

import pyarrow as pa

from ..errors import ConfigError, StoreError
from ..schema import KINDS
from .ddl import Layout, insert_settings
from .retention import ensure_schema
from .telemetry import context_for, with_context

__all__ = ["ClickHouseStore", "parse_clickhouse_url"]


def parse_clickhouse_url(url: str) -> tuple[dict[str, Any], Layout]:
    u = urlparse(url)
    if u.scheme not in ("clickhouse", "http", "https") or not u.hostname:
        raise ConfigError(
            f"--clickhouse {url!r} is not a ClickHouse URL; "
            "use clickhouse://user:password@host:8123/database[?cluster=NAME]"
        )
    q = parse_qs(u.query)
    database = (u.path or "/").strip("/") or "fleetlens"
    client = {
        "host": u.hostname,
        "port": u.port or (8443 if u.scheme == "https" else 8123),
        "username": u.username or "default",
        "password": u.password or "",
        "secure": u.scheme == "https",
    }
    cluster = q.get("cluster", [""])[0] or None
    return client, Layout(database=database, cluster=cluster)


class ClickHouseStore:
    def __init__(
        self,
        url: str,
        database: str | None = None,
        retention: tuple[tuple[str, int], ...] | None = None,
    ) -> None:
        import clickhouse_connect

        client_args, layout = parse_clickhouse_url(url)
        if database and not urlparse(url).path.strip("/"):
            layout = Layout(database=database, cluster=layout.cluster)
        self.database = layout.database
        try:
            self._client = clickhouse_connect.get_client(
                **client_args, settings={"wait_end_of_query": 1}
            )
        except Exception as exc:
            raise StoreError(
                f"cannot connect to ClickHouse at {client_args['host']}: {exc}"
            ) from exc
        ensure_schema(self, layout, retention)

    def insert(self, kind: str, data: pa.Table, ctx: dict[str, str], batch_id: str) -> None:
        values = context_for(kind, ctx)
        try:
            self._client.insert_arrow(
                f"{self.database}.{KINDS[kind].table}",
                with_context(kind, data, ctx),
                settings=insert_settings(batch_id, kind, values),
            )
        except Exception as exc:
            raise StoreError(f"insert of {kind} records failed: {exc}") from exc

    def query(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        try:
            result = self._client.query_arrow(sql, parameters=params or {})
        except Exception as exc:
            raise StoreError(f"query failed: {exc}") from exc
        return result

    def command(self, sql: str) -> None:
        try:
            self._client.command(sql)
        except Exception as exc:
            raise StoreError(f"statement failed: {exc}") from exc

    def command_params(self, sql: str, params: dict[str, Any]) -> None:
        try:
            self._client.command(sql, parameters=params)
        except Exception as exc:
            raise StoreError(f"statement failed: {exc}") from exc

    def close(self) -> None:
        self._client.close()
