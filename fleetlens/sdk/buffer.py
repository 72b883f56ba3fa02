"""The bounded in-memory buffer between the training thread and the exporter thread.

One ``collections.deque`` per priority. The training thread only appends small tuples (CPython
makes ``deque.append`` and ``popleft`` atomic, so no lock is needed); the exporter pops them. The
length check before the append is not atomic with it, so a cap can be overshot by at most one
entry per producing thread, which keeps memory bounded without a lock on the hot path. A full
deque drops the *new* entry and counts the records it held: dropping old data instead would need
the exporter's cooperation on the hot path.

Entries are tuples whose first element says their shape:

=========== ====================================================================================
STEP        (STEP, step, time, duration, data_wait, forward, backward, optimizer, comm, tokens)
SCALARS     (SCALARS, step, time, {name: value, ...})   -- one ``run.log`` call
EVENT       (EVENT, time, kind, step, message, attrs_dict_or_None)
COLLECTIVE  (COLLECTIVE, step, seq, op, group, enter, exit, bytes)
PLACEMENT   (PLACEMENT, time, rank, local_rank, world_size, node_id, gpu)
SAMPLE      (SAMPLE, kind, {column: value, ...})  -- any record kind by column name (agents)
=========== ====================================================================================
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = [
    "COLLECTIVE",
    "EVENT",
    "PLACEMENT",
    "SAMPLE",
    "SCALARS",
    "STEP",
    "RecordBuffer",
    "records_in",
]

STEP, SCALARS, EVENT, COLLECTIVE, PLACEMENT, SAMPLE = range(6)

Entry = tuple[Any, ...]


def records_in(entry: Entry) -> int:
    """How many records (rows) an entry becomes on the wire."""
    if entry[0] == SCALARS:
        return len(entry[3])
    return 1


class RecordBuffer:
    """Four bounded deques (P0..P3) and exact per-priority drop counters."""

    __slots__ = ("caps", "dropped", "queues")

    def __init__(self, caps: tuple[int, int, int, int]) -> None:
        self.queues: tuple[deque[Entry], ...] = tuple(deque() for _ in range(4))
        self.caps = caps
        # Only ever incremented; read by the exporter for the batch's ``dropped`` field.
        self.dropped = [0, 0, 0, 0]

    def put(self, priority: int, entry: Entry) -> None:
        """The slow-path append, for callers that are not per-step (the hot ones inline it)."""
        q = self.queues[priority]
        if len(q) < self.caps[priority]:
            q.append(entry)
        else:
            self.dropped[priority] += records_in(entry)

    def drain(self, priority: int, max_rows: int) -> tuple[list[Entry], int]:
        """Pop up to about ``max_rows`` records' worth of entries, oldest first; the entries
        and the records they hold."""
        q = self.queues[priority]
        out: list[Entry] = []
        rows = 0
        pop, put = q.popleft, out.append
        while rows < max_rows:
            try:
                entry = pop()
            except IndexError:
                break
            put(entry)
            rows += len(entry[3]) if entry[0] == SCALARS else 1  # records_in, inlined
        return out, rows

    def pending(self) -> int:
        return sum(len(q) for q in self.queues)
