"""Where a job's ranks are, and what they are told: the in-memory side of the control channel.

Every rank polls ``GET /v1/runs/{run}/control`` with its position (job attempt, step, collective
sequence, when it last progressed); :class:`Positions` keeps the newest per rank and answers with
the :class:`Instruction` published for the run, if any. Ranks that answered ``stopped`` to a
drain are counted here too, not one row write per rank (10,000 ranks answer within a second).

The registry has its own lock and does no I/O, so a rank's poll, answered on the server's event
loop, never waits behind an actuator or the database. :func:`stuck_ranks` reads a live hang off
the positions: the ranks behind the others name the node.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..analysis.hangs import Stall, missing_from_groups
from ..analysis.rootcause import Diagnosis
from ..errors import NotFound

__all__ = ["Instruction", "Position", "Positions", "stuck_ranks"]


@dataclass
class Position:
    """Where one rank is, from its last control poll."""

    job_id: str
    rank: int
    world: int
    node: str
    step: int
    seq: int
    progress_at: float
    seen_at: float
    pid: int = 0
    agent_pid: int = 0


@dataclass(frozen=True)
class Instruction:
    """What the ranks of one job attempt are told: ``stop`` at the next step boundary,
    ``remove`` (the node's workers stop their agent) or ``restart``."""

    id: int
    phase: str
    node: str
    job_id: str
    force: bool  # a hung job cannot reach a step boundary: restart ranks stuck in a collective
    world: int


@dataclass
class _Run:
    ranks: dict[tuple[str, int], Position] = field(default_factory=dict)

    def current(self, now: float, stale_s: float) -> tuple[str, list[Position]]:
        fresh = [p for p in self.ranks.values() if now - p.seen_at <= stale_s]
        if not fresh:
            return "", []
        job = max(fresh, key=lambda p: p.seen_at).job_id
        return job, sorted((p for p in fresh if p.job_id == job), key=lambda p: p.rank)


class Positions:
    """The ranks' last positions per (tenant, run), the published instructions, and the ranks
    that stopped for each action. Thread-safe."""

    def __init__(self, stale_s: float = 10.0) -> None:
        self.stale_s = stale_s
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], _Run] = {}
        self._told: dict[tuple[str, str], Instruction] = {}
        self._stopped: dict[int, tuple[set[int], float]] = {}

    def report(self, tenant: str, run_id: str, pos: Position) -> Instruction | None:
        """Record a rank's position; the instruction for its job attempt, if any."""
        with self._lock:
            rp = self._runs.setdefault((tenant, run_id), _Run())
            rp.ranks[(pos.job_id, pos.rank)] = pos
            if len(rp.ranks) > 4 * max(pos.world, 1) + 64:  # forget attempts long gone
                for key in sorted(rp.ranks, key=lambda k: rp.ranks[k].seen_at)[: pos.world]:
                    del rp.ranks[key]
            told = self._told.get((tenant, run_id))
        if told is None or told.job_id not in ("", pos.job_id):
            return None
        return told

    def current(self, tenant: str, run_id: str, now: float) -> tuple[str, list[Position]]:
        """The newest job attempt and its ranks that polled within ``stale_s``."""
        with self._lock:
            rp = self._runs.get((tenant, run_id))
            return rp.current(now, self.stale_s) if rp else ("", [])

    def nodes(self, tenant: str, run_id: str, now: float) -> set[str]:
        """The nodes of every rank that polled within ``stale_s``, whatever its job attempt."""
        with self._lock:
            rp = self._runs.get((tenant, run_id))
            if rp is None:
                return set()
            return {p.node for p in rp.ranks.values() if now - p.seen_at <= self.stale_s}

    def on_node(self, tenant: str, run_id: str, job_id: str, node: str) -> frozenset[int]:
        """The ranks of a job attempt that reported from ``node``."""
        with self._lock:
            rp = self._runs.get((tenant, run_id))
            if rp is None:
                return frozenset()
            return frozenset(
                p.rank for (job, _), p in rp.ranks.items() if job == job_id and p.node == node
            )

    def publish(self, tenant: str, run_id: str, action_id: int, told: Instruction | None) -> None:
        """Tell the run's ranks ``told``; None withdraws what action ``action_id`` told them."""
        key = (tenant, run_id)
        with self._lock:
            if told is not None:
                self._told[key] = told
            elif key in self._told and self._told[key].id == action_id:
                del self._told[key]

    def stopped(
        self, tenant: str, run_id: str, action_id: int, job_id: str, rank: int, at: float
    ) -> tuple[int, int]:
        """A rank stopped for action ``action_id``: (ranks stopped so far, ranks to wait for)."""
        with self._lock:
            told = self._told.get((tenant, run_id))
            if told is None or told.id != action_id or job_id != told.job_id:
                raise NotFound(f"remediation {action_id} is not stopping run {run_id!r}")
            ranks, last = self._stopped.setdefault(action_id, (set(), 0.0))
            ranks.add(rank)
            self._stopped[action_id] = (ranks, max(last, at))
            return len(ranks), told.world

    def stops(self, action_id: int) -> tuple[int, float]:
        """How many ranks stopped for the action, and the latest of their stop times."""
        with self._lock:
            ranks, last = self._stopped.get(action_id, (set(), 0.0))
            return len(ranks), last

    def forget_stops(self, action_id: int) -> None:
        with self._lock:
            self._stopped.pop(action_id, None)


def stuck_ranks(job_id: str, ranks: list[Position], hang: Stall, now: float) -> Diagnosis | None:
    """The finding for a live hang of a whole job attempt (``ranks``, every rank polling): the
    ranks whose position (step, collective sequence) is behind the others' never reached the
    collective the others wait in, and their node is to blame. None when everyone is stuck in
    the same place, or the ranks behind are on more than one node (no one node to blame)."""
    order = {pos: i for i, pos in enumerate(sorted({(p.step, p.seq) for p in ranks}))}
    last = {"job": {p.rank: order[(p.step, p.seq)] for p in ranks}}
    groups = missing_from_groups(last, {"job": tuple(p.rank for p in ranks)})
    if not groups:
        return None
    missing = set(groups[0].missing)
    behind = [p for p in ranks if p.rank in missing]
    nodes = sorted({p.node for p in behind})
    if len(nodes) != 1:
        return None
    step = min(p.step for p in behind)
    return Diagnosis(
        f"stuck:{job_id}:{step}",
        "hang",
        "hang",
        0.9,
        f"no progress for {now - hang.since:.0f}s at step {step}: rank(s) "
        f"{[p.rank for p in behind]} on {nodes[0]} never reached the collective the others "
        "wait in",
        step=step,
        start_step=step,
        end_step=-1,
        time=now,
        ranks=[p.rank for p in behind],
        nodes=nodes,
        job_id=job_id,
        evidence=[
            {
                "metric": "seconds without progress (every rank)",
                "value": now - hang.since,
                "threshold": hang.threshold_s,
            },
            {
                "metric": "position (step, collective seq) of each rank",
                "value": {str(p.rank): [p.step, p.seq] for p in ranks},
            },
        ],
    )
