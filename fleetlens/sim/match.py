"""Strict matching of findings to injected faults (what ``bench/detection.py`` scores).

A finding matches a fault of the same run when all of these hold:

- **diagnosis**: equal to the fault's (``straggler.persistent`` does not match an
  intermittent straggler; ``family=True`` relaxes this to the part before the first dot, and
  is reported beside the strict figure, never instead of it);
- **where**: the ranks it names are all ranks of the fault, and the nodes it names are all
  nodes of the fault (a healthy rank or node named makes it a false positive). A fault tied to
  ranks (stragglers, thermal, data stall, hang, OOM) must be named by at least half of its
  ranks; one tied to nodes (Xids, NVLink, rack cooling) by at least one node. Faults of the
  whole job (network, moving straggler, NaN, preemption) have no place to check;
- **when**: its onset (``start_step``) lies in the fault's window ``[start - 10, end + 10]``
  steps, and it was detected (``step``) within 100 steps of the fault becoming visible: the
  onset for a slowdown, the step it ended the attempt at for a terminating fault. The checks
  that work on blocks of committed steps (network, NVLink, rack cooling: ``block_steps`` = 50)
  date an onset to a block's first step and decide at a block's end, so for them the window
  opens one block (50 steps) before the fault and the bound is three blocks (150 steps).

Each fault is matched by at most one finding; a further finding that matches an already
matched fault is a duplicate (counted, not a false positive). Every other finding is false.

A **false alarm** is a finding that names no fault at all: none of the run's faults matches it
with the class of straggler relaxed, without the bound on the delay and without the share of
the fault's ranks it must name, so it blames a rank, node or span of steps where nothing was
injected. A false finding that is not a false alarm names a fault wrongly (its class, too few
of its ranks, or too late): precision and recall charge it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .truth import GroundTruth, TruthFault

__all__ = ["Matched", "match_findings"]

ONSET_TOLERANCE = 10
MAX_DELAY = 100
BLOCK = 50  # AnalyzerConfig.block_steps
_BLOCK_KINDS = {"network", "nvlink", "rack_cooling"}
_RANK_TIED = {"straggler.persistent", "straggler.intermittent", "thermal", "data_stall", "hang",
              "oom"}  # fmt: skip
_NODE_TIED = {"fatal_xid", "ecc_xid", "nvlink", "rack_cooling"}


@dataclass
class Matched:
    """Per fault, the finding that matched it (index into the findings) or None; per finding,
    ``"tp"``, ``"dup"`` or ``"fp"``; the steps from visibility to detection per matched fault."""

    fault_hit: dict[str, int | None]
    finding_state: list[str]
    delay_steps: dict[str, int]
    false_alarm: list[bool]


def _family(d: str) -> str:
    return d.split(".", 1)[0]


def visible_step(f: TruthFault) -> int:
    """The step at which a fault can first be seen: its onset, or the step it ended the
    attempt at (a terminating fault)."""
    return f.end_step if f.fatal or f.kind in ("hang", "preemption") else f.start_step


def _ok(f: TruthFault, d: dict[str, Any], family: bool, strict: bool = True) -> bool:
    """Whether finding ``d`` matches fault ``f``; not ``strict``: whether it names only the
    fault's ranks and nodes within its window, however few of them and however late."""
    diag = str(d.get("diagnosis", ""))
    if diag != f.diagnosis and not (family and _family(diag) == _family(f.diagnosis)):
        return False
    ranks, nodes = set(d.get("ranks") or ()), set(d.get("nodes") or ())
    if ranks and f.ranks and not ranks <= set(f.ranks):
        return False
    if nodes and f.nodes and not nodes <= set(f.nodes):
        return False
    if strict and f.kind in _RANK_TIED and f.ranks and 2 * len(ranks & set(f.ranks)) < len(f.ranks):
        return False
    if strict and f.kind in _NODE_TIED and f.nodes and not nodes:
        return False
    block = f.kind in _BLOCK_KINDS
    onset = d.get("start_step")
    onset = d.get("step") if onset is None or int(onset) < 0 else onset
    early = BLOCK if block else ONSET_TOLERANCE
    if onset is None or not f.start_step - early <= int(onset) <= f.end_step + ONSET_TOLERANCE:
        return False
    step = d.get("step")
    if not strict:
        return True
    return step is not None and int(step) - visible_step(f) <= (3 * BLOCK if block else MAX_DELAY)


def match_findings(
    truth: GroundTruth, findings: list[dict[str, Any]], family: bool = False
) -> Matched:
    """Match a run's findings (dicts with ``diagnosis``, ``ranks``, ``nodes``, ``step``,
    ``start_step``) to its injected faults; see the module docstring for the rules."""
    hit: dict[str, int | None] = {f.id: None for f in truth.faults}
    state = ["fp"] * len(findings)
    delay: dict[str, int] = {}
    # earliest detection first, so a fault is credited to the finding that came first
    order = sorted(range(len(findings)), key=lambda i: int(findings[i].get("step") or 0))
    for i in order:
        for f in truth.faults:
            if not _ok(f, findings[i], family):
                continue
            if hit[f.id] is None:
                hit[f.id], state[i] = i, "tp"
                delay[f.id] = max(0, int(findings[i]["step"]) - visible_step(f))
                break
            state[i] = "dup"
    alarm = [not any(_ok(f, d, True, strict=False) for f in truth.faults) for d in findings]
    return Matched(hit, state, delay, alarm)
