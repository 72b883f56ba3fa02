"""The data directory's free space: ingest stops before the disk is full, not at it.

A full disk once turned ingest into 500s without Retry-After, and in 2 of 3 runs held every
telemetry read until space came back (the commit thread kept the store's lock inside work the
full disk could not finish). So the collector keeps ``collector.min_free_bytes`` free: below it,
no insert is tried; ingest is refused with 503 and a Retry-After (:class:`OutOfSpace`), every
read keeps answering, and ``/healthz`` and ``/metrics`` say so
(``fleetlens_storage_free_bytes``, ``fleetlens_storage_out_of_space``). An insert that fails
for lack of space all the same (another process filled the disk between two looks) is treated
the same way until the free space is back above the floor. Nothing acknowledged is lost:
the senders keep what was refused (the SDK's buffer and spool, a relay's spool) and send it
again after Retry-After.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from ..errors import StoreError

__all__ = ["DiskSpace", "OutOfSpace", "SpaceHealth", "SpaceMetrics", "is_out_of_space"]

_LOOK_EVERY_S = 1.0
_MARGIN = 64 << 20  # after an insert failed for space: how much more must be free to try again
_NO_SPACE = ("no space left on device", "not_enough_space", "cannot reserve", "disk quota")


@dataclass(frozen=True)
class SpaceHealth:
    """What ``/healthz`` says of the data directory's space."""

    path: str
    free_bytes: int
    """-1 when the file system cannot be asked."""
    min_free_bytes: int
    out_of_space: bool
    """Ingest is refused until space is freed."""


class OutOfSpace(StoreError):
    """The data directory is out of space: nothing was stored; retry after ``retry_after``."""

    retry_after = 10


def is_out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (an OS or engine error, or what it was raised from) says the disk is
    full."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(s in str(seen).lower() for s in _NO_SPACE):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class DiskSpace:
    """Free bytes of the file system holding ``path``, looked at most once a second."""

    def __init__(self, path: str, min_free_bytes: int) -> None:
        self.path = path
        self.min_free_bytes = min_free_bytes
        self._lock = threading.Lock()
        self._looked = 0.0
        self._free = -1
        # Set when an insert failed for lack of space: the free bytes a look must find before
        # ingest is tried again (what was free then, plus a margin: it was not enough).
        self._need = 0

    def free_bytes(self) -> int:
        """Bytes free to this process (-1 when the file system cannot be asked)."""
        now = time.monotonic()
        with self._lock:
            if now - self._looked >= _LOOK_EVERY_S:
                self._looked = now
                try:
                    st = os.statvfs(self.path)
                    self._free = st.f_bavail * st.f_frsize
                except OSError:
                    self._free = -1
                if self._free > self._need:
                    self._need = 0
            return self._free

    def full(self) -> bool:
        """Whether ingest must wait: below the floor, or an insert just failed for space."""
        free = self.free_bytes()
        return bool(self._need) or 0 <= free <= self.min_free_bytes

    def failed(self) -> None:
        """An insert failed for lack of space: full until a look finds ``_MARGIN`` more free
        than now (and more than the floor)."""
        with self._lock:
            self._looked = 0.0  # look again at the next question
        free = self.free_bytes()
        with self._lock:
            self._need = max(self.min_free_bytes, free) + _MARGIN

    def refusal(self) -> OutOfSpace:
        free = self.free_bytes()
        return OutOfSpace(
            f"the server's disk is full ({max(free, 0) >> 20} MiB free at {self.path}; it keeps "
            f"{self.min_free_bytes >> 20} MiB free): nothing was stored; retry later"
        )

    def health(self) -> SpaceHealth:
        """What ``/healthz`` says of the data directory's space."""
        return SpaceHealth(self.path, self.free_bytes(), self.min_free_bytes, self.full())


class SpaceMetrics:
    """The data directory's free space on ``/metrics``, for the operator and on-call."""

    def __init__(self, space: DiskSpace) -> None:
        self.space = space

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "fleetlens_storage_free_bytes",
            "Bytes free on the file system of the data directory",
            value=self.space.free_bytes(),
        )
        yield GaugeMetricFamily(
            "fleetlens_storage_out_of_space",
            "1 while ingest is refused because the data directory is at its free-space floor",
            value=int(self.space.full()),
        )
