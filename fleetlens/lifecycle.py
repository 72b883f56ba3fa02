"""How a job attempt ended, from what its ranks said last: the rules of a run's status.

Each rank's last word is kept (:class:`RankEnd`, one per rank and attempt, the most telling
one: failed over stopped over finished): its ``finish``, its ``exception``/``oom``/``failure``,
or the ``signal`` its SDK caught (SIGTERM from the launcher or the scheduler). A rank killed
with SIGKILL (by hand, the OOM killer, a lost node) says nothing; its peers then end in errors
of the collective they were in ("Connection closed by peer") or are stopped by the launcher. So:

- a rank's own failure -> FAILED, that rank;
- every rank finished -> FINISHED;
- every rank ended, some stopped (a signal), none failed of its own -> STOPPED;
- some ranks ended and the others went silent (no data for ``grace`` seconds): if the ended
  ones were stopped or failed on a peer's error, the silent ranks died -> FAILED, them; if they
  all finished, the silent ranks' finish was lost or never sent -> FINISHED, said so;
- nothing ended yet -> no verdict (RUNNING or STALLED by the age of the data).

Events of the job as a whole (an importer's or the simulator's, ``rank`` -1) count for every
rank. Pure functions, no I/O: the metadata store feeds them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "ATTEMPT_ENDS",
    "END_STATE_OF_EVENT",
    "GRACE_S",
    "LIVE",
    "RANK_ENDS",
    "RELEASES",
    "STOPS",
    "JobVerdict",
    "RankEnd",
    "job_verdict",
    "more_telling",
    "peer_error",
]

LIVE = ("RUNNING", "HUNG", "STALLED")
"""The statuses of a run whose newest attempt has not ended (FINISHED, FAILED, STOPPED have)."""

GRACE_S = 30.0
"""Seconds without data after which ranks that said nothing are judged gone. Longer than the
SDK's exit flush (5 s) and two heartbeats of a rank blocked in a collective (10 s each)."""

END_STATE_OF_EVENT = {
    "finish": "finished",
    "failure": "failed",
    "exception": "failed",
    "oom": "failed",
    "signal": "stopped",
    "preemption": "stopped",
}
"""The events that end a rank's part of an attempt, and the state each leaves it in."""

RANK_ENDS = frozenset(END_STATE_OF_EVENT)
"""The events that end a rank's part of an attempt (the keys of :data:`END_STATE_OF_EVENT`)."""

ATTEMPT_ENDS = frozenset({"finish", "failure", "preemption"})
"""The events that end an attempt as a whole: when it let its nodes go (a job's finish, its
declared failure, its preemption)."""

RELEASES = RANK_ENDS | {"drain", "maintenance"}
"""The events after which an attempt holds nothing: a rank's end, or its nodes taken away."""

STOPS = RELEASES | {"hardware_fault", "nan"}
"""The events that end an attempt's progress for the hang rule: it let its devices go, or died
of the fault (a stall after one is explained, not a hang)."""

_RANK = {"finished": 0, "stopped": 1, "failed": 2}

# What a rank raises when a peer of its collective went away: not its own fault. gloo, NCCL,
# torch.distributed's store and elastic agent, MPI.
_PEER = re.compile(
    r"connection (closed|reset) by peer|broken pipe|remote process exited|"
    r"communicator was aborted|ncclRemoteError|DistBackendError|DistNetworkError|"
    r"socket timeout|recvBytes|Connection refused|peer.*(closed|disconnected)|"
    r"SignalException|ProcessGroupGloo|MPI_ERR",
    re.IGNORECASE,
)


def peer_error(message: str) -> bool:
    """True when a failure's message is a collective's error about a peer that went away."""
    return bool(_PEER.search(message or ""))


@dataclass(frozen=True)
class RankEnd:
    """The last word of one rank (``rank`` -1: the job as a whole) in one attempt."""

    rank: int
    state: str  # finished | stopped | failed
    at: float
    step: int = -1
    message: str = ""

    @property
    def peer(self) -> bool:
        return self.state == "failed" and peer_error(self.message)


def more_telling(old: RankEnd | None, new: RankEnd) -> bool:
    """Whether ``new`` replaces ``old`` as a rank's last word: failed over stopped over
    finished; a rank's own failure over a peer's error; else the later one."""
    if old is None:
        return True
    a, b = (_RANK[old.state], not old.peer), (_RANK[new.state], not new.peer)
    return b > a or (b == a and new.at >= old.at)


@dataclass(frozen=True)
class JobVerdict:
    """A job attempt's end: its status, the ranks it names, the step, and why."""

    status: str  # FINISHED | FAILED | STOPPED
    ranks: tuple[int, ...]
    step: int
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {
            "status": self.status,
            "ranks": list(self.ranks),
            "step": self.step,
            "reason": self.reason,
        }


def _names(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:16])
    more = f" and {len(ranks) - 16} more" if len(ranks) > 16 else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{more}"


def job_verdict(
    world: int,
    ends: Iterable[RankEnd],
    last_seen: float,
    now: float,
    last_step: int = -1,
    grace: float = GRACE_S,
) -> JobVerdict | None:
    """The verdict on one attempt of ``world`` ranks, or None while it has not ended."""
    whole: list[RankEnd] = []
    per: dict[int, RankEnd] = {}
    for e in ends:
        if e.rank < 0:
            whole.append(e)
        elif more_telling(per.get(e.rank), e):
            per[e.rank] = e
    world = max(world, max(per, default=-1) + 1)
    own = sorted(
        (e for e in per.values() if e.state == "failed" and not e.peer), key=lambda e: e.at
    )
    failed_whole = [e for e in whole if e.state == "failed"]
    if own or failed_whole:
        first = own[0] if own else failed_whole[0]
        ranks = tuple(sorted(e.rank for e in own))
        return JobVerdict(
            "FAILED",
            ranks,
            first.step if first.step >= 0 else last_step,
            f"{_names(ranks) + ': ' if ranks else ''}{first.message}".strip(),
        )
    done_whole = sorted(whole, key=lambda e: e.at)
    if done_whole:
        last = done_whole[-1]
        status = "FINISHED" if last.state == "finished" else "STOPPED"
        return JobVerdict(status, (), last.step if last.step >= 0 else last_step, last.message)
    if not per:
        return None
    silent = [r for r in range(world) if r not in per]
    states = {e.state for e in per.values()}
    peers = sorted(r for r, e in per.items() if e.peer)
    if not silent:
        if states == {"finished"}:
            return JobVerdict("FINISHED", (), last_step, f"all {world} ranks finished")
        if peers:
            return JobVerdict(
                "FAILED",
                tuple(peers),
                min(per[r].step for r in peers),
                f"{_names(peers)} failed in a collective: {per[peers[0]].message}",
            )
        stopped = sorted(r for r, e in per.items() if e.state == "stopped")
        return JobVerdict(
            "STOPPED", (), last_step, f"{_names(stopped)} stopped: {per[stopped[0]].message}"
        )
    if now - last_seen < grace:
        return None  # the others may still be saying their last word
    if states == {"finished"}:
        return JobVerdict(
            "FINISHED",
            (),
            last_step,
            f"{len(per)} of {world} ranks finished; {_names(silent)} sent no finish",
        )
    return JobVerdict(
        "FAILED",
        tuple(silent),
        last_step,
        f"{_names(silent)} stopped reporting at step {last_step} without a finish, an error or "
        f"a signal while the others ended ({', '.join(sorted(states))}): killed (SIGKILL, the "
        "OOM killer) or its node was lost",
    )
