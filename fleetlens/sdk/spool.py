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

The spool is private: its directory is made 0700 and its files 0600 (they carry the job's
config), and a batch is replayed with the job's token, so a file another user could have
planted must never be sent. A directory not owned by this process's user is not used at all, and
a file that is not a regular file owned by it (a symlink, another user's file) is ignored and
counted in ``foreign_files``. A batch the collector keeps failing on while others go through is
moved aside to ``quarantine/`` (:meth:`Spool.quarantine`), so it never blocks the ones behind it.

A directory that cannot be written (read-only, full, gone) does not lose an outage's batches:
they are held in memory instead, up to ``memory_max_bytes`` (64 MiB by default, never more than
the spool's own limit), replayed and evicted by the same rules, and the degradation is said once
(a warning naming the directory and the error) and counted (``memory_batches``, ``unwritable``).
An owner that acknowledges what it spools to someone else (``fsync``: the node relay) gets the
error instead, since memory is not durable.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from .orphans import claim, remove_if_empty

__all__ = ["Spool", "SpoolEntry", "batch_entries", "default_spool_root", "private_dir"]

_SUFFIX = ".batch"
_TMP = ".tmp"
QUARANTINE = "quarantine"
# Quarantined batches kept for a person to look at; past this the oldest are deleted.
_QUARANTINE_KEEP = 64
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_MEMORY_MAX = 64 << 20
_log = logging.getLogger(__name__)


def private_dir(path: str) -> None:
    """Make ``path`` (and missing parents) and make sure only this user can use it.

    Raises OSError when it is a symlink or belongs to another user: planted batches would be
    replayed with our token, and ours would be readable.
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"spool directory {path} is not a directory (a symlink?)")
    if st.st_uid != os.geteuid():
        raise OSError(
            f"spool directory {path} belongs to uid {st.st_uid}, not to this user "
            f"({os.geteuid()}); set FLEETLENS_SPOOL_DIR to a directory of your own"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


def default_spool_root(environ: Mapping[str, str] | None = None) -> str:
    """Where spools go unless a spool directory is given: ``FLEETLENS_SPOOL_ROOT`` (a disk that
    outlives a reboot where the temporary directory does not, a node-local one), else one
    directory per user under the temporary directory, so that no user shares (or can pre-create)
    another's. Each rank of a run keeps its own directory below it (``<run>-<rank>``), and a
    rank started again with the same run and rank replays what its predecessor left there; what a
    rank that will not come back left is adopted by a later one (:mod:`fleetlens.sdk.orphans`)."""
    env = os.environ if environ is None else environ
    root = env.get("FLEETLENS_SPOOL_ROOT", "")
    return root or os.path.join(tempfile.gettempdir(), f"fleetlens-spool-{os.geteuid()}")


def _fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _own_file(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


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


def batch_entries(directory: str) -> list[SpoolEntry]:
    """The batches in a spool directory that are regular files of this user, oldest first;
    none when it cannot be read."""
    found: list[SpoolEntry] = []
    with contextlib.suppress(OSError), os.scandir(directory) as it:
        for item in it:
            with contextlib.suppress(OSError):
                st = item.stat(follow_symlinks=False)
                entry = _parse(item.name, st.st_size) if _own_file(st) else None
                if entry is not None:
                    found.append(entry)
    return sorted(found)


class Spool:
    """A directory of batches, oldest first, at most ``max_bytes`` in total.

    With ``fsync`` a batch is on disk when :meth:`put` returns (file and directory entry
    fsync'd), for an owner that acknowledges it to someone else (a node relay); the SDK's own
    spool does without, since its batches are not acknowledged to anybody yet."""

    def __init__(
        self,
        directory: str,
        max_bytes: int,
        *,
        fsync: bool = False,
        memory_max_bytes: int = _MEMORY_MAX,
        owner: str = "",
    ) -> None:
        self.dir = directory
        # Whose batches these are (fleetlens.sdk.orphans): with it, the directory is claimed
        # when it is made or found, so that a later process may adopt it once this one is gone.
        self.owner = owner
        self._claim_fd: int | None = None
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.memory_max_bytes = 0 if fsync else min(memory_max_bytes, max_bytes)
        # Batches held in memory because the directory could not be written, by file name.
        self._held: dict[str, bytes] = {}
        self._held_bytes = 0
        self.memory_batches = 0  # batches ever held in memory instead of on disk
        self.unwritable = ""  # why the directory could not be written, once it could not
        self._lock = threading.Lock()
        self._entries: list[SpoolEntry] = []
        self._bytes = 0
        self._counter = 0
        # Records of evicted or refused batches, by priority; the owner folds them into its drops.
        self.dropped = [0, 0, 0, 0]
        self.dropped_batches = 0
        # Files in the spool that are not ours to send (another user's, symlinks): ignored.
        self.foreign_files = 0
        self.quarantined = 0
        self._scanned = False

    def _scan(self) -> None:
        """Index what an earlier process left; tolerant of a missing or unreadable directory,
        and of nothing in a directory that is not privately ours."""
        self._scanned = True
        try:
            st = os.lstat(self.dir)
        except OSError:
            return
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            self.foreign_files += 1
            return
        self._claim()
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            path = os.path.join(self.dir, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if name == QUARANTINE and stat.S_ISDIR(st.st_mode):
                continue
            if not _own_file(st):
                self.foreign_files += 1
                continue
            if name.endswith(_TMP):
                with contextlib.suppress(OSError):
                    os.unlink(path)  # the half-written batch of a process that died mid-write
                continue
            size = st.st_size
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

    def _claim(self) -> None:
        """Hold the directory (once made) while this process may still write it: see ``owner``.
        Never waits: a lock another process holds (a sweep moving batches out of a restarted
        rank's directory, a second process given the same run and rank) is tried again at the
        next write."""
        if self.owner and self._claim_fd is None:
            self._claim_fd = claim(self.dir, self.owner)

    def release(self) -> None:
        """Let go of the directory once the run is over (its exit paths, after the last spill):
        what is left in it is a later process's, or a later run's of this one, to adopt; an
        empty one is removed. A write after it claims the directory again."""
        with self._lock:
            fd, self._claim_fd = self._claim_fd, None
            if fd is None:
                return
            if not self._entries:
                remove_if_empty(self.dir)
            os.close(fd)

    def __len__(self) -> int:
        with self._lock:
            self._ensure()
            return len(self._entries)

    def __contains__(self, entry: object) -> bool:
        with self._lock:
            return entry in self._entries

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
            self._bytes += size  # held while it is written, so a concurrent put evicts for it
            if not self.fsync:
                try:
                    private_dir(self.dir)
                    self._claim()
                    self._write(entry, body)
                except OSError as exc:
                    if not self.memory_max_bytes:
                        self._bytes -= size
                        raise
                    if not self._hold(entry, body, exc):
                        self._bytes -= size
                        self.dropped[priority] += records
                        self.dropped_batches += 1
                        return False
                self._entries.append(entry)
                return True
            try:
                private_dir(self.dir)
            except OSError:
                self._bytes -= size
                raise
        # Durable writes happen outside the lock: concurrent writers' fsyncs then share the
        # file system's journal commits instead of waiting for each other's.
        try:
            self._write(entry, body)
        except OSError:
            with self._lock:
                self._bytes -= size
            raise
        with self._lock:
            bisect.insort(self._entries, entry)
        return True

    def _write(self, entry: SpoolEntry, body: bytes) -> None:
        final = os.path.join(self.dir, entry.name)
        tmp = final + _TMP
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
            with open(fd, "wb") as f:
                f.write(body)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, final)
            if self.fsync:
                _fsync_dir(self.dir)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _hold(self, entry: SpoolEntry, body: bytes, exc: OSError) -> bool:
        """Keep a batch the directory would not take in memory, evicting held batches of lower
        classes; False when the memory bound is full of its class or higher. The first time,
        say why (once: a full disk must not also fill the job's log)."""
        if not self.unwritable:
            self.unwritable = f"{type(exc).__name__}: {exc}"
            _log.warning(
                "fleetlens: the spool %s cannot be written (%s); keeping up to %.1f MiB of "
                "unsent batches in memory instead",
                self.dir,
                self.unwritable,
                self.memory_max_bytes / (1 << 20),
            )
        while self._held_bytes + entry.size > self.memory_max_bytes:
            victim = self._victim(entry.priority, held_only=True)
            if victim is None:
                return False
            self._remove(victim)
            self.dropped[victim.priority] += victim.records
            self.dropped_batches += 1
        self._held[entry.name] = body
        self._held_bytes += entry.size
        self.memory_batches += 1
        return True

    def _victim(self, priority: int, held_only: bool = False) -> SpoolEntry | None:
        """The oldest batch of the lowest class strictly below ``priority``."""
        lowest: SpoolEntry | None = None
        for e in self._entries:  # oldest first, so the first of a class is its oldest
            if held_only and e.name not in self._held:
                continue
            if e.priority > priority and (lowest is None or e.priority > lowest.priority):
                lowest = e
        return lowest

    def _forget(self, entry: SpoolEntry) -> bool:
        """Drop a batch held in memory; False if it is a file."""
        if self._held.pop(entry.name, None) is None:
            return False
        self._held_bytes -= entry.size
        return True

    def _remove(self, entry: SpoolEntry) -> None:
        if not self._forget(entry):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.dir, entry.name))
        self._entries.remove(entry)
        self._bytes -= entry.size

    def oldest(self, skip: frozenset[str] = frozenset()) -> tuple[SpoolEntry, bytes] | None:
        """The oldest batch (by name, not in ``skip``) and its bytes, forgetting files that
        vanished, cannot be read or are no longer a regular file of ours."""
        with self._lock:
            self._ensure()
            if self._entries:
                self._claim()  # a directory found held by another (a sweep's moment): again
            i = 0
            while i < len(self._entries):
                entry = self._entries[i]
                if entry.name in skip:
                    i += 1
                    continue
                held = self._held.get(entry.name)
                if held is not None:
                    return entry, held
                try:
                    fd = os.open(os.path.join(self.dir, entry.name), os.O_RDONLY | _NOFOLLOW)
                    with open(fd, "rb") as f:
                        if _own_file(os.fstat(f.fileno())):
                            return entry, f.read()
                        self.foreign_files += 1
                except OSError:
                    pass
                self._entries.pop(i)
                self._bytes -= entry.size
            return None

    def quarantine(self, entry: SpoolEntry) -> None:
        """Move a batch the collector keeps failing on to ``quarantine/``, out of the replay
        order; the newest ``_QUARANTINE_KEEP`` are kept for a person to look at."""
        with self._lock:
            if entry not in self._entries:
                return
            qdir = os.path.join(self.dir, QUARANTINE)
            if self._forget(entry):  # held in memory: nowhere to put it aside, dropped
                self._entries.remove(entry)
                self._bytes -= entry.size
                self.quarantined += 1
                return
            try:
                private_dir(qdir)
                os.replace(os.path.join(self.dir, entry.name), os.path.join(qdir, entry.name))
            except OSError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir, entry.name))
            self._entries.remove(entry)
            self._bytes -= entry.size
            self.quarantined += 1
            with contextlib.suppress(OSError):
                kept = sorted(
                    (n for n in os.listdir(qdir) if n.endswith(_SUFFIX)),
                    key=lambda n: n.split("-")[1:3],  # by time and counter, not priority
                )
                for name in kept[: max(0, len(kept) - _QUARANTINE_KEEP)]:
                    os.unlink(os.path.join(qdir, name))

    def adopt(self, source: str) -> int:
        """Move the batches of another spool directory, whose process is gone, into this one,
        oldest first while this spool stays at most half full, the other half kept for this
        process's own (one larger batch alone into an empty spool; fleetlens.sdk.orphans); the
        number moved."""
        found = batch_entries(source)
        moved = 0
        with self._lock:
            self._ensure()
            room = self.max_bytes // 2 - self._bytes
            fits: list[SpoolEntry] = []
            for entry in found:
                # One batch larger than half goes alone into an empty spool, or never would.
                alone = not fits and not self._bytes and entry.size <= self.max_bytes
                if entry.size > room and not alone:
                    break
                fits.append(entry)
                room -= entry.size
            if not fits:
                return 0
            try:
                private_dir(self.dir)
            except OSError:
                return 0
            self._claim()
            for entry in fits:
                try:
                    os.rename(os.path.join(source, entry.name), os.path.join(self.dir, entry.name))
                except OSError:
                    continue
                bisect.insort(self._entries, entry)
                self._bytes += entry.size
                moved += 1
        return moved

    def delete(self, entry: SpoolEntry) -> None:
        """Forget a batch once the collector has acknowledged (or permanently refused) it."""
        with self._lock:
            if entry in self._entries:
                self._remove(entry)
