"""A run's log lines (:data:`fleetlens.schema.LOG`), bound to one tenant: searched by text, rank,
step range and level. :mod:`fleetlens.services.logs` reads them."""

from __future__ import annotations

import pyarrow as pa

from .reader import TenantReader

__all__ = ["LogQueries"]


class LogQueries:
    def __init__(self, reader: TenantReader) -> None:
        self.r = reader

    def search(
        self,
        run_id: str,
        text: str,
        ranks: list[int] | None,
        lo: int,
        hi: int,
        levels: list[str] | None,
        limit: int,
    ) -> pa.Table:
        """Lines of steps ``lo..hi`` holding ``text`` (any case; empty: every line), of ``ranks``
        and ``levels`` (None: all), in the order they were written, at most ``limit``: time,
        rank, step, level, source, message, job_id."""
        return self.r.table(
            "SELECT time, rank, step, level, source, message, job_id FROM {db}.logs"
            " WHERE run_id = {run:String} AND step BETWEEN {lo:Int64} AND {hi:Int64}"
            " AND (rank IN {ranks:Array(Int32)} OR {every_rank:Bool})"
            " AND (level IN {levels:Array(String)} OR {every_level:Bool})"
            " AND ({text:String} = '' OR positionCaseInsensitiveUTF8(message, {text:String}) > 0)"
            " ORDER BY time, rank LIMIT {limit:UInt32}",
            run=run_id,
            lo=lo,
            hi=hi,
            ranks=ranks or [],
            every_rank=ranks is None,
            levels=levels or [],
            every_level=levels is None,
            text=text,
            limit=limit,
        )
