"""A run-less producer for node agents: device and host samples through the SDK's exporter.

The same guarantees as a training run's telemetry (bounded buffer, background batching, disk
spool, replay, counted drops), without a run: samples of a node belong to whatever runs on it
and are joined to runs through placement, later.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from ..errors import ConfigError
from ..schema import KINDS
from .buffer import SAMPLE, RecordBuffer
from .config import SDKConfig
from .exporter import Exporter
from .route import open_transport
from .spool import Spool, default_spool_root
from .tables import Identity
from .transport import Transport

__all__ = ["Recorder"]


class Recorder:
    def __init__(self, cfg: SDKConfig, transport: Transport | None = None) -> None:
        spool = cfg.spool_dir or os.path.join(default_spool_root(), f"agent-{cfg.node_id}")
        self.config = dataclasses.replace(cfg, run_id="", job_id="", spool_dir=spool)
        self._buffer = RecordBuffer(self.config.buffer_caps)
        self._spool = Spool(spool, self.config.spool_max_bytes)
        self._transport = transport or open_transport(self.config)[0]
        self._exporter = Exporter(
            self.config,
            self._buffer,
            self._transport,
            Identity(rank=-1, node_id=cfg.node_id, gpu=-1),
            self._spool,
        )
        self._exporter.start()
        self.errors = 0

    def sample(self, kind: str, priority: int = 2, **columns: Any) -> None:
        """Queue one record of ``kind`` (column name -> value); never raises."""
        try:
            if kind not in KINDS:
                raise ConfigError(f"unknown record kind {kind!r}")
            columns.setdefault("time", time.time())
            self._buffer.put(priority, (SAMPLE, kind, columns))
        except Exception:
            self.errors += 1

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self._exporter.counts)
        out["dropped"] = sum(self._exporter.dropped())
        out["spool_bytes"] = self._spool.total_bytes
        out["spool_foreign_files"] = self._spool.foreign_files
        out["internal_errors"] += self.errors
        return out

    def flush(self, timeout: float = 5.0) -> bool:
        return self._exporter.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self._exporter.flush(timeout)
        self._exporter.stop(timeout)
        self._exporter.spill()
        close = getattr(self._transport, "close", None)
        if callable(close) and not self._exporter.alive:
            close()
