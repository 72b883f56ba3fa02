"""A run's memory scalars (:data:`fleetlens.schema.DEVICE_MEMORY_SCALARS`,
:data:`~fleetlens.schema.HOST_MEMORY_SCALARS`) per rank, bound to one tenant: what each rank
logged of each, and each over steps in buckets. :mod:`fleetlens.services.memory` reads them.
"""

from __future__ import annotations

import pyarrow as pa

from ..scalars import DEVICE_MEMORY_SCALARS, HOST_MEMORY_SCALARS
from .reader import TenantReader

__all__ = ["MEMORY_SCALARS", "MemoryQueries"]

MEMORY_SCALARS = [*DEVICE_MEMORY_SCALARS, *HOST_MEMORY_SCALARS]


class MemoryQueries:
    def __init__(self, reader: TenantReader) -> None:
        self.r = reader

    def totals(self, run_id: str) -> pa.Table:
        """Per rank and memory scalar: n (values), lo and hi (first and last step), last (the
        value at the last step, its newest), peak (the largest)."""
        return self.r.table(
            "SELECT rank, name, count() AS n, min(step) AS lo, max(step) AS hi,"
            " argMax(value, (step, time)) AS last, max(value) AS peak FROM {db}.scalars"
            " WHERE run_id = {run:String} AND name IN {names:Array(String)}"
            " AND isFinite(value) GROUP BY rank, name ORDER BY rank, name",
            run=run_id,
            names=MEMORY_SCALARS,
        )

    def buckets(
        self,
        run_id: str,
        names: list[str],
        ranks: list[int] | None,
        lo: int,
        hi: int,
        width: int,
    ) -> pa.Table:
        """Memory scalars ``names`` of ``ranks`` (None: every rank) over steps ``lo..hi`` in
        buckets of ``width`` steps, each bucket's largest value: rank, name, last (the bucket's
        last step), v. Ordered by rank, name, last."""
        return self.r.table(
            "SELECT rank, name, max(step) AS last, max(value) AS v FROM {db}.scalars"
            " WHERE run_id = {run:String} AND name IN {names:Array(String)}"
            " AND (rank IN {ranks:Array(Int32)} OR {every:Bool})"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64} AND isFinite(value)"
            " GROUP BY rank, name, intDiv(step - {lo:Int64}, {w:Int64})"
            " ORDER BY rank, name, last",
            run=run_id,
            names=[n for n in names if n in MEMORY_SCALARS],
            ranks=ranks or [],
            every=ranks is None,
            lo=lo,
            hi=hi,
            w=max(1, width),
        )
