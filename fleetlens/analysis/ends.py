"""How the ranks of an attempt ended, as findings: a rank that died without a word (SIGKILL, the
OOM killer, a lost node) while its peers failed waiting for it in a collective, or were stopped
by the launcher. The peers' errors ("Connection closed by peer") are its consequence, not
crashes of their own: they are the evidence of this finding (:mod:`fleetlens.lifecycle`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..lifecycle import END_STATE_OF_EVENT, RankEnd, job_verdict
from .evidence import Evidence
from .rootcause import Diagnosis

__all__ = ["diagnose_ends", "rank_ends"]


def rank_ends(events: Sequence[dict[str, Any]], job_id: str) -> list[RankEnd]:
    """The events of ``job_id`` that end a rank's part of it."""
    return [
        RankEnd(
            int(e["rank"]),
            END_STATE_OF_EVENT[e["kind"]],
            float(e["time"]),
            int(e["step"]),
            str(e.get("message") or ""),
        )
        for e in events
        if e["job_id"] == job_id and e["kind"] in END_STATE_OF_EVENT
    ]


def diagnose_ends(
    events: Sequence[dict[str, Any]],
    job_id: str,
    world: int,
    last_seen: float,
    now: float,
    last_step: int,
) -> tuple[list[Diagnosis], bool]:
    """(findings, whether to look again): the ranks of ``job_id`` that died without a word, once
    the others ended and the job's data stopped; look again while it may still be ending."""
    ends = rank_ends(events, job_id)
    if not ends:
        return [], False
    verdict = job_verdict(world, ends, last_seen, now, last_step)
    if verdict is None:
        return [], True
    spoke = {e.rank for e in ends}
    silent = [r for r in verdict.ranks if r not in spoke]
    if verdict.status != "FAILED" or not silent:
        return [], False
    peers = sorted({e.rank for e in ends if e.peer})
    placed = {
        int(e["rank"]): str(e["node_id"])
        for e in events
        if e["job_id"] == job_id and e["kind"] == "job_start" and e["node_id"]
    }
    evidence: list[Evidence] = [
        {
            "metric": "ranks with no finish, error or signal",
            "value": silent[:64],
            "world": world,
            "last_step": last_step,
        },
    ]
    evidence += [
        {"metric": f"rank {e.rank} ended: {e.state}", "value": e.message[:500], "time": e.at}
        for e in sorted(ends, key=lambda e: e.at)[:8]
    ]
    summary = verdict.reason + (
        f"; ranks {peers[:16]} failed waiting for it in a collective" if peers else ""
    )
    return [
        Diagnosis(
            f"lost:{job_id}:{silent[0]}",
            "rank_lost",
            "failure",
            0.8,
            summary,
            step=last_step,
            start_step=last_step,
            end_step=last_step,
            time=last_seen,
            ranks=silent,
            nodes=sorted({placed[r] for r in silent if r in placed}),
            job_id=job_id,
            evidence=evidence,
        )
    ], False
