"""The bounded disk spool: encoded batches the collector has not acknowledged yet.

One file per batch, holding exactly the bytes that were (or would have been) sent, so a replay
carries the same ``batch_id`` and the server stores it once. The file name carries everything
needed to manage it without reading it::

    p{priority}-{unix_ns:020d}-{counter:06d}-{records}-{batch_id}.batch

Files are written under a ``.tmp`` name and ``os.replace``-d into place, so a process killed
mid-write never leaves a half batch that a later process would replay. The total size is capped:
a new batch evicts the oldest batches of the lowest priority class below its own, and is itself
dropped when nothing below it is left (so P0 is only ever dropped when the spool is full of P0).
A lock guards the index because a signal handler or ``finish`` may spool from the training
thread while the exporter thread replays.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass

__all__ = ["Spool", "SpoolEntry"]

_SUFFIX = ".batch"
_TMP = ".tmp"


@dataclass(frozen=True, order=True)
class SpoolEntry:
    """One spooled batch; entries order oldest first."""

    ns: int
    counter: int
    priority: int
    records: int
    batch_id: str
    size: int
    name: str


def _parse(name: str, size: int) -> SpoolEntry | None:
    if not name.endswith(_SUFFIX) or not name.startswith("p"):
        return None
    parts = name[: -len(_SUFFIX)].split("-", 4)
    if len(parts) != 5:
        return None
    try:
        prio, ns, counter, records = int(parts[0][1:]), int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        return None
    if not 0 <= prio <= 3 or not parts[4]:
        return None
    return SpoolEntry(ns, counter, prio, records, parts[4], size, name)


class Spool:
    """A directory of batches, oldest first, at most ``max_bytes`` in total."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: list[SpoolEntry] = []
        self._bytes = 0
        self._counter = 0
        # Records of evicted or refused batches, by priority; the owner folds them into its drops.
        self.dropped = [0, 0, 0, 0]
        self.dropped_batches = 0
        self._scanned = False

    def _scan(self) -> None:
        """Index what an earlier process left; tolerant of a missing or unreadable directory."""
        self._scanned = True
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            path = os.path.join(self.dir, name)
            if name.endswith(_TMP):
                with contextlib.suppress(OSError):
                    os.unlink(path)  # the half-written batch of a process that died mid-write
                continue
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            entry = _parse(name, size)
            if entry is not None:
                self._entries.append(entry)
                self._bytes += size
        self._entries.sort()
        if self._entries:
            self._counter = max(e.counter for e in self._entries) + 1

    def _ensure(self) -> None:
        if not self._scanned:
            self._scan()

    def __len__(self) -> int:
        with self._lock:
            self._ensure()
            return len(self._entries)

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def put(self, priority: int, batch_id: str, body: bytes, records: int) -> bool:
        """Spool a batch; False if it was dropped because the spool is full of higher classes."""
        size = len(body)
        with self._lock:
            self._ensure()
            while self._bytes + size > self.max_bytes:
                victim = self._victim(priority)
                if victim is None:
                    self.dropped[priority] += records
                    self.dropped_batches += 1
                    return False
                self._remove(victim)
                self.dropped[victim.priority] += victim.records
                self.dropped_batches += 1
            ns = time.time_ns()
            entry = SpoolEntry(
                ns,
                self._counter,
                priority,
                records,
                batch_id,
                size,
                f"p{priority}-{ns:020d}-{self._counter:06d}-{records}-{batch_id}" + _SUFFIX,
            )
            self._counter += 1
            os.makedirs(self.dir, exist_ok=True)
            final = os.path.join(self.dir, entry.name)
            tmp = final + _TMP
            try:
                with open(tmp, "wb") as f:
                    f.write(body)
                os.replace(tmp, final)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._entries.append(entry)
            self._bytes += size
            return True

    def _victim(self, priority: int) -> SpoolEntry | None:
        """The oldest batch of the lowest class strictly below ``priority``."""
        lowest: SpoolEntry | None = None
        for e in self._entries:  # oldest first, so the first of a class is its oldest
            if e.priority > priority and (lowest is None or e.priority > lowest.priority):
                lowest = e
        return lowest

    def _remove(self, entry: SpoolEntry) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.dir, entry.name))
        self._entries.remove(entry)
        self._bytes -= entry.size

    def oldest(self) -> tuple[SpoolEntry, bytes] | None:
        """The oldest batch and its bytes, skipping files that vanished or cannot be read."""
        with self._lock:
            self._ensure()
            while self._entries:
                entry = self._entries[0]
                try:
                    with open(os.path.join(self.dir, entry.name), "rb") as f:
                        return entry, f.read()
                except OSError:
                    self._entries.pop(0)
                    self._bytes -= entry.size
            return None

    def delete(self, entry: SpoolEntry) -> None:
        """Forget a batch once the collector has acknowledged (or permanently refused) it."""
        with self._lock:
            if entry in self._entries:
                self._remove(entry)
