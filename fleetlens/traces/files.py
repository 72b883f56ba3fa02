"""The trace files themselves, kept beside the data so the portal can open them in Perfetto.

``fleetlens traces import --upload-files`` sends each rank's file (gzip-compressed JSON, as the
profiler writes ``*.json.gz``) after its tables. The server keeps one file per run and rank under
``{data}/trace_files/{key}/rank-{rank}.json.gz``, ``key`` a digest of tenant and run (no path a
run id could steer). A file is written to a temporary name, synced and then renamed: a reader
sees the whole previous file or the whole new one, never a part.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio

from ..errors import FleetlensError

__all__ = ["GZIP_MAGIC", "TraceFileRefused", "TraceFiles"]

GZIP_MAGIC = b"\x1f\x8b"
_RANK_FILE = re.compile(r"rank-(\d+)\.json\.gz")


class TraceFileRefused(FleetlensError):
    """An upload that is not a gzip file, or over the limit; ``status`` is its HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class TraceFiles:
    """The stored trace files of a server's runs."""

    def __init__(self, data_dir: str | Path) -> None:
        self.root = Path(data_dir) / "trace_files"

    def _dir(self, tenant: str, run_id: str) -> Path:
        key = hashlib.sha256(f"{tenant}\0{run_id}".encode()).hexdigest()[:32]
        return self.root / key

    def path(self, tenant: str, run_id: str, rank: int) -> Path:
        return self._dir(tenant, run_id) / f"rank-{rank}.json.gz"

    def sizes(self, tenant: str, run_id: str) -> dict[int, int]:
        """Rank -> bytes of every stored file of the run."""
        d = self._dir(tenant, run_id)
        if not d.is_dir():
            return {}
        out: dict[int, int] = {}
        for f in d.iterdir():
            m = _RANK_FILE.fullmatch(f.name)
            if m:
                out[int(m.group(1))] = f.stat().st_size
        return out

    async def store(
        self,
        tenant: str,
        run_id: str,
        rank: int,
        chunks: AsyncIterator[bytes],
        limit: int,
        verify: Callable[[Path], Any] | None = None,
    ) -> int:
        """Write the file from ``chunks``; its size. Refused (nothing kept) when it does not
        start as gzip or grows past ``limit`` bytes, or when ``verify`` (given the whole file
        before it replaces the previous one, in a worker thread) raises."""
        final = self.path(tenant, run_id, rank)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{id(chunks)}.part")
        size = 0
        try:
            with open(tmp, "wb") as fh:
                async for chunk in chunks:
                    if not chunk:
                        continue
                    if size == 0 and not chunk.startswith(GZIP_MAGIC[: len(chunk)]):
                        raise TraceFileRefused(
                            "a trace file is sent gzip-compressed (a profiler's *.json.gz)", 415
                        )
                    size += len(chunk)
                    if size > limit:
                        raise TraceFileRefused(
                            f"the trace file is over {limit} bytes "
                            "(collector.max_trace_file_bytes)",
                            413,
                        )
                    await anyio.to_thread.run_sync(fh.write, chunk)  # the event loop goes on
                if size < len(GZIP_MAGIC):
                    raise TraceFileRefused("the trace file is empty", 400)
                fh.flush()
                await anyio.to_thread.run_sync(os.fsync, fh.fileno())
            if verify is not None:
                await anyio.to_thread.run_sync(verify, tmp)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return size
