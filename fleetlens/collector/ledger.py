"""The ingest ledger: which batches are stored, across merged inserts and restarts.

Group commit (:mod:`.commit`) merges many requests into one insert per table, so the engine's
per-insert deduplication token no longer names one batch. Instead every row carries its batch's
key in a hidden column (``_batch``, a 64-bit hash of the tenant, project, run, job, batch id,
kind and content digest: :func:`batch_key`), and this ledger, a small append-only file beside
the data, says which keys are stored:

- before an insert: ``I <time> <kind>:<key>:<rows> ...`` (the intent: what it holds);
- after it returned (durable): ``C``.

A key is remembered for ``window_s`` (10 minutes) and at most ``max_keys``; a retry within that
window is acknowledged without storing it again. At startup the file is read back: committed
intents are remembered; an intent with no ``C`` after it is the insert a crash interrupted, and
is settled against the tables (:meth:`Ledger.settle`): a batch whose rows are all there counts as
stored, a partial one (an insert larger than one engine block) is deleted so that its retry
stores it whole. The file is rewritten to its live window when it grows past ``max_bytes``.
Writes are appends to the page cache: a killed process loses nothing; a power cut needs the
engine's fsync settings anyway.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

__all__ = ["Ledger", "Piece", "batch_key"]

Piece = tuple[str, int, int]
"""(kind, key, rows): one table of one batch."""

Settle = Callable[[list[Piece]], set[int]]
"""Given pieces whose fate is unknown, delete partial ones and return the keys stored whole."""


def batch_key(ctx: dict[str, str], batch_id: str, kind: str, digest: str) -> int:
    """The 63-bit key of one table of one batch (fits signed and unsigned 64-bit columns)."""
    h = hashlib.blake2b(digest_size=8)
    for part in (
        ctx.get("tenant", ""),
        ctx.get("project", ""),
        ctx.get("run_id", ""),
        ctx.get("job_id", ""),
        batch_id,
        kind,
        digest,
    ):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "little") >> 1 or 1


class Ledger:
    """The stored keys of the last ``window_s``, kept in memory and in ``path``."""

    def __init__(
        self,
        path: str,
        settle: Settle,
        window_s: float = 600.0,
        max_keys: int = 1_000_000,
        max_bytes: int = 64 << 20,
    ) -> None:
        self.path = path
        self.window_s = window_s
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self._settle = settle
        self._keys: set[int] = set()
        self._order: deque[tuple[float, list[int]]] = deque()
        self._lock = threading.Lock()
        self._pending: list[Piece] = []
        self.recovered = 0  # pieces of an interrupted insert found stored at startup
        self._open()

    # -- reads ---------------------------------------------------------------------------------

    def stored(self, key: int) -> bool:
        with self._lock:
            return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    # -- one insert: intend, then commit --------------------------------------------------------

    def intend(self, pieces: list[Piece]) -> None:
        """Record what the next insert holds, before it runs."""
        if self._pending:  # the last insert failed with its fate unknown: settle it now
            self._settle_pending()
        try:
            self._write(_intent_line(time.time(), pieces))
        except OSError:
            self._pending = []  # not announced, so not to be tried
            raise
        self._pending = list(pieces)

    def commit(self) -> None:
        """The insert announced by :meth:`intend` returned: its keys are stored. They are
        remembered first: if the file cannot take the ``C`` (a full disk), a retry is still
        acknowledged without a second copy, and a restart settles the intent against the
        tables."""
        pieces, self._pending = self._pending, []
        self._remember(time.time(), [key for _, key, _ in pieces])
        with contextlib.suppress(OSError):
            self._write("C\n")

    def settle_failed(self) -> None:
        """The insert announced last raised: find out what of it is stored (or leave it to the
        next :meth:`intend` or restart if the store cannot answer now)."""
        with contextlib.suppress(Exception):  # the store is down: settled later
            self._settle_pending()

    def _settle_pending(self) -> None:
        pieces = self._pending
        stored = self._settle(pieces)
        self._pending = []
        self._write("A\n")  # the intent as written is void; what is stored is written anew
        if stored:
            self._write(_intent_line(time.time(), [p for p in pieces if p[1] in stored]) + "C\n")
            self._remember(time.time(), sorted(stored))

    # -- memory and file -------------------------------------------------------------------------

    def _remember(self, at: float, keys: Iterable[int]) -> None:
        keys = list(keys)
        with self._lock:
            self._keys.update(keys)
            self._order.append((at, keys))
            horizon = time.time() - self.window_s
            while self._order and (self._order[0][0] < horizon or len(self._keys) > self.max_keys):
                _, old = self._order.popleft()
                self._keys.difference_update(old)
        if self._size > self.max_bytes:
            self._rewrite()

    def _write(self, line: str) -> None:
        data = line.encode()
        os.write(self._fd, data)
        self._size += len(data)

    def _open(self) -> None:
        entries: list[tuple[float, list[Piece]]] = []
        open_intents: list[Piece] = []
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8", errors="replace") as f:
                intent: tuple[float, list[Piece]] | None = None
                for raw in f:
                    line = raw.strip()
                    if line.startswith("I "):
                        if intent is not None:  # an intent with no outcome: settle it
                            open_intents += intent[1]
                        intent = _parse_intent(line)
                    elif line == "C" and intent is not None:
                        entries.append(intent)
                        intent = None
                    elif line == "A":
                        intent = None
                if intent is not None:
                    open_intents += intent[1]
        horizon = time.time() - self.window_s
        for at, pieces in entries:
            if at >= horizon:
                self._remember_quietly(at, [k for _, k, _ in pieces])
        if open_intents:
            stored = self._settle(open_intents)  # raises if the store cannot answer: fail start
            self.recovered = len(stored)
            if stored:
                self._remember_quietly(time.time(), sorted(stored))
        self._fd = -1
        self._size = 0
        self._rewrite()

    def _remember_quietly(self, at: float, keys: list[int]) -> None:
        self._keys.update(keys)
        self._order.append((at, keys))
        while len(self._keys) > self.max_keys and self._order:
            _, old = self._order.popleft()
            self._keys.difference_update(old)

    def _rewrite(self) -> None:
        """Write the live window to a new file and swap it in (atomic on POSIX)."""
        tmp = self.path + ".tmp"
        with self._lock:
            lines = [
                _intent_line(at, [("", k, 0) for k in keys]) + "C\n" for at, keys in self._order
            ]
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _intent_line(at: float, pieces: Iterable[Piece]) -> str:
    return f"I {at:.3f} " + " ".join(f"{kind}:{key}:{rows}" for kind, key, rows in pieces) + "\n"


def _parse_intent(line: str) -> tuple[float, list[Piece]]:
    parts = line.split()
    try:
        at = float(parts[1])
    except (IndexError, ValueError):
        return 0.0, []
    pieces: list[Piece] = []
    for item in parts[2:]:
        kind, _, rest = item.partition(":")
        key, _, rows = rest.partition(":")
        if key.isdigit() and rows.isdigit():
            pieces.append((kind, int(key), int(rows)))
    return at, pieces
