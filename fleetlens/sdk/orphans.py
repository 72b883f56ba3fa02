"""Spools whose process will not come back, found and sent by the next process of the same user.

A rank that spooled batches and then ended without sending them (killed with ``kill -9`` while
the collector was away, or a last batch that missed ``finish()``'s exit flush) leaves them in its
directory under the spool root (``<run>-<rank>``). A rank started again with the same run and
rank replays them; a finished job's ranks never are. So every SDK process sweeps the directory
its own spool lives in, once the collector has taken one of its batches (never while it does
not: the batches would only move from one spool to another) and then every ``SWEEP_EVERY_S``:
a sibling whose process is gone and whose batches were bound for the same collector with the
same token is adopted. Its batches are moved into this process's spool (a rename, on the same
file system; at most half of the spool, the other half kept for this run's own) and replayed
with this process's own; the directory is removed once empty. A batch carries its own run and
batch id, so it is stored in its run, once: the collector keeps a batch id for 10 minutes (its
ingest ledger's window), so the one case stored twice is a batch the collector stored but
whose answer never came back (a send timed out), whose process then died before replaying
it, adopted more than 10 minutes later. ``fleetlens spool`` shows the spools of a node and
``--send`` sends the gone ones' now (a job's epilogue: :mod:`fleetlens.cli.spool`).

A spool directory says who may adopt it with two files, made with the directory:

- ``.lock``, held with ``flock`` by its process while it may still write there: until its run's
  exit paths let go of it (:meth:`Spool.release`, removing the directory when empty) or the
  process dies (the kernel lets go, ``kill -9`` included; a forked child, such as a data
  loader's worker, holds it until it exits too);
- ``.owner``, a digest of the collector's address and the token (never the token itself),
  written once the lock is held.

Taking the lock never waits: a rank restarted into its directory while a sweep of another
process holds it (moving its predecessor's batches out) goes on and claims the directory at its
next write or replay. A directory is adopted only when it is this user's, its ``.owner`` (a
regular file) matches this process's and its lock can be taken. One without ``.owner`` (an
older SDK's, the node relay's, one being made) is left alone; a planted symlink is not
followed, nor a FIFO waited on. A sweep looks at no more than ``_MAX_NAMES`` names and
``_MAX_DIRS`` unlocked directories: what is left waits for the next sweep, of this process or
another.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import TransportError
from .transport import Cadence, batch_headers

try:
    import fcntl
except ImportError:  # not POSIX: no locks, so no directory is ever taken for an orphan
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from .spool import Spool
    from .transport import Transport

__all__ = [
    "LOCK",
    "OWNER",
    "SWEEP_EVERY_S",
    "Sent",
    "SpoolDir",
    "claim",
    "owner_digest",
    "remove_if_empty",
    "send_gone",
    "survey",
    "sweep",
]

LOCK = ".lock"
OWNER = ".owner"
SWEEP_EVERY_S = 600.0
_MAX_NAMES = 4096
_MAX_DIRS = 64
# Never follow a planted symlink, never block on a planted FIFO.
_SAFE = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def owner_digest(server: str, token: str | None) -> str:
    """Whose batches a spool holds: the collector they go to and the token they go with."""
    return hashlib.sha256(f"{server}\n{token or ''}".encode()).hexdigest()[:32]


def _lock(directory: str) -> int | None:
    """The descriptor holding ``directory``'s lock, or None while another process holds it (or
    it cannot be taken); never waits. The file locked must still be the one at its path: a sweep
    that adopted the directory removes it, and a lock on a removed file guards nothing."""
    if fcntl is None:
        return None
    path = os.path.join(directory, LOCK)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _SAFE, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held, there = os.fstat(fd), os.lstat(path)
        if stat.S_ISREG(held.st_mode) and (held.st_dev, held.st_ino) == (
            there.st_dev,
            there.st_ino,
        ):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def claim(directory: str, owner: str) -> int | None:
    """Hold a spool directory's lock and say whose batches it holds; the descriptor (kept
    open: closing it, or the process's end, lets go), or None where it could not be taken."""
    fd = _lock(directory)
    if fd is None:
        return None
    path = os.path.join(directory, OWNER)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _SAFE, 0o600), "w") as f:
            f.write(owner)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return fd


def _owner_of(directory: str) -> str:
    """The ``.owner`` of a directory of this user's, or "" (not a directory of ours, none)."""
    try:
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return ""
        fd = os.open(os.path.join(directory, OWNER), os.O_RDONLY | _SAFE)
    except OSError:
        return ""
    with open(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return ""
        return f.read(128).decode(errors="replace").strip()


def remove_if_empty(directory: str) -> bool:
    """Remove an adopted (or released) directory once no batch is left in it (a half-written
    one, which its process died writing, counts for none); its quarantine, if any, stays for a
    person. True when it is done with: no batch and no ``.owner`` left."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    if any(n.endswith(".batch") for n in names):
        return False
    for name in names:
        if name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
    # .owner first: from then on no sweep takes it for anyone's.
    for name in (OWNER, LOCK):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, name))
    with contextlib.suppress(OSError):
        os.rmdir(directory)
    # Done only when no sweep will take it again (a read-only directory keeps its .owner).
    return not os.path.lexists(os.path.join(directory, OWNER))


def _names(root: str) -> list[str]:
    """The first ``_MAX_NAMES`` names in ``root``, in the directory's order; none when it cannot
    be read."""
    try:
        with os.scandir(root) as it:
            return [e.name for _, e in zip(range(_MAX_NAMES), it, strict=False)]
    except OSError:
        return []


def sweep(spool: Spool, owner: str) -> tuple[int, int]:
    """Adopt the orphaned spools beside ``spool``'s directory bound where its own batches go:
    (directories it moved batches from or emptied and removed, batches moved into ``spool``)."""
    if not owner:
        return 0, 0
    own = os.path.abspath(spool.dir)
    root = os.path.dirname(own)
    dirs = batches = looked = 0
    for name in _names(root):
        if looked >= _MAX_DIRS:
            break
        path = os.path.join(root, name)
        if path == own or _owner_of(path) != owner:
            continue
        fd = _lock(path)
        if fd is None:
            continue  # its process is alive (or the lock cannot be had): not an orphan
        looked += 1
        try:
            moved = spool.adopt(path)
            if remove_if_empty(path) or moved:
                dirs += 1
                batches += moved
        finally:
            os.close(fd)
    return dirs, batches


@dataclass(frozen=True)
class SpoolDir:
    """One directory under a spool root, as ``fleetlens spool`` shows it."""

    name: str
    # "live": its process holds it; "gone": nobody does, its batches wait for a sweep;
    # "unclaimed": it says no owner (an older SDK's, the node relay's or agent's).
    state: str
    yours: bool  # bound for the server and token this process would send to
    batches: int
    bytes: int


def survey(root: str, owner: str) -> list[SpoolDir]:
    """This user's spool directories under ``root``, by name: whose process holds each, and
    what waits in it. A gone one's lock is taken and let go at once."""
    from .spool import batch_entries  # spool.py imports this module

    out = []
    for name in sorted(_names(root)):
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue
        said, state = _owner_of(path), "unclaimed"
        if said:
            fd = _lock(path)
            state = "live" if fd is None else "gone"
            if fd is not None:
                os.close(fd)
        entries = batch_entries(path)
        size = sum(e.size for e in entries)
        out.append(SpoolDir(name, state, bool(said) and said == owner, len(entries), size))
    return out


@dataclass(frozen=True)
class Sent:
    """What :func:`send_gone` did: spools of gone processes emptied or moved from, their
    batches acknowledged, refused as bad (dropped, as the exporter drops them), left in
    ``spool`` and why it stopped early ("" when everything went)."""

    spools: int
    batches: int
    refused: int
    left: int
    error: str


# Refusals of the caller, not of the batch: the batches are kept for a token that may send them.
_NOT_YOURS = (401, 403)


def send_gone(spool: Spool, transport: Transport, interval: float) -> Sent:
    """Adopt the gone spools beside ``spool`` (as a sweep does) and send their batches now,
    oldest first, once each, deleting each one acknowledged, stating its pace as a sender
    waiting ``interval`` would; stop at the first the collector cannot take now (unreachable,
    busy, failing, the token refused), leaving it and the rest in ``spool``, which a later
    sweep adopts once this process is gone."""
    spools = sent = refused = 0
    cadence = Cadence()
    while True:
        adopted, _ = sweep(spool, spool.owner)
        spools += adopted
        while (got := spool.oldest()) is not None:
            entry, body = got
            flush_s = cadence.stated(interval)
            try:
                transport.send(body, batch_headers(entry.batch_id, body, entry.priority, flush_s))
            except TransportError as exc:
                if not exc.permanent or exc.status in _NOT_YOURS:
                    return Sent(spools, sent, refused, len(spool), str(exc))
                refused += 1
            else:
                sent += 1
            spool.delete(entry)
        if not adopted:
            return Sent(spools, sent, refused, 0, "")
