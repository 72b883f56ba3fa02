"""When a finding justifies taking a node out of a run.

* A fatal hardware fault (``fatal_xid``, ``ecc_xid``): always. The GPU will not recover by
  itself, and the job either already failed or soon will; a drain now saves the steps since the
  last checkpoint.
* A hung rank whose node is known (the live hang check names the ranks behind all others):
  always. The job makes no progress at all until the node is out.
* A persistent straggler (or a thermally throttled GPU): only when its expected cost over the
  rest of the run exceeds the cost of a restart -- the straggler-replacement trade of
  003_43c4c54df3bebfa6.txt (table 10: program goodput regained against runtime goodput spent on
  draining, restarting and reloading). The straggler costs ``wait_per_step_s`` of wall-clock per
  step (every rank waits for it) over the steps left; a restart costs the measured recoveries of
  this run, or ``restart_cost_s`` before there is one. The remaining steps come from the run's
  config (``total_steps``, ``max_steps``, ``train_steps`` or ``steps``), else ``horizon_s`` of
  wall-clock at the current step time.

A straggler is acted on only while it is slowing the job (its finding has no end step) and once
it has been flagged for ``persist_s``: an intermittent one whose latest episode is still going
counts, one between episodes does not (an episode that ends by itself is cheaper than a
restart). Moving stragglers never are: replacing a node does not fix data skew.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..errors import ConfigError
from ..store.findings import FindingRow

__all__ = ["MODES", "Cost", "Decision", "RemediationPolicy", "RunContext", "choose", "decide"]

MODES = ("off", "recommend", "approve", "automatic")
_STEP_KEYS = ("total_steps", "max_steps", "train_steps", "steps")


@dataclass(frozen=True)
class RemediationPolicy:
    mode: str = "recommend"
    fatal: tuple[str, ...] = ("fatal_xid", "ecc_xid")
    stragglers: tuple[str, ...] = ("straggler.persistent", "straggler.intermittent", "thermal")
    restart_cost_s: float = 300.0
    horizon_s: float = 24 * 3600.0
    margin: float = 1.0  # act when straggler cost > margin x restart cost
    persist_s: float = 300.0  # a straggler must have been flagged this long

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"remediation mode {self.mode!r}; use one of {', '.join(MODES)}")
        if min(self.restart_cost_s, self.horizon_s, self.margin) <= 0 or self.persist_s < 0:
            raise ConfigError("restart_cost_s, horizon_s and margin must be > 0, persist_s >= 0")


@dataclass(frozen=True)
class RunContext:
    world: int
    last_step: int
    step_time_s: float | None
    config: dict[str, Any] = field(default_factory=dict)
    measured_restart_s: list[float] = field(default_factory=list)
    now: float = 0.0

    def remaining_steps(self, horizon_s: float) -> tuple[float, str]:
        for key in _STEP_KEYS:
            v = self.config.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                return max(0.0, float(v) - self.last_step - 1), f"config {key}={v}"
        if self.step_time_s:
            return horizon_s / self.step_time_s, f"{horizon_s:.0f}s horizon"
        return 0.0, "unknown"


class Cost(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """Why a decision acts: its rule and, for a straggler, the trade it made (stored on the
    remediation and answered as it is stored: ``waitPerStepS``, ``expectedLossS``, ...)."""

    rule: str
    wait_per_step_s: float | None = None
    """Wall-clock seconds every rank waits for the straggler each step."""
    remaining_steps: float | None = None
    remaining_basis: str | None = None
    """Where the remaining steps come from (the run's configured total, or the horizon)."""
    expected_loss_s: float | None = None
    """``wait_per_step_s`` x ``remaining_steps``: what leaving the straggler in costs."""
    restart_cost_s: float | None = None
    restart_cost_basis: str | None = None
    margin: float | None = None

    def stored(self) -> dict[str, Any]:
        """The JSON kept on the remediation (camelCase, the keys set)."""
        doc: dict[str, Any] = msgspec.to_builtins(self)
        return doc


@dataclass(frozen=True)
class Decision:
    node: str
    ranks: list[int]
    reason: str
    summary: str
    cost: Cost

    @property
    def priority(self) -> tuple[int, float]:
        """Which of several to act on first: faults, then hangs, then the costliest straggler."""
        rule = self.cost.rule
        rank = 3 if rule == "fatal hardware fault" else 2 if rule == "hung node" else 1
        return rank, self.cost.expected_loss_s or 0.0


def decide(policy: RemediationPolicy, finding: FindingRow, run: RunContext) -> Decision | None:
    """The action a finding justifies, or None."""
    diag = finding.diagnosis
    nodes = [str(n) for n in finding.nodes if n]
    if len(nodes) != 1:  # no node, or a rack / switch-level problem: not one node's removal
        return None
    node, ranks = nodes[0], [int(r) for r in finding.ranks]
    if diag in policy.fatal:
        return Decision(
            node,
            ranks,
            diag,
            f"fatal hardware fault on {node}: {finding.summary}",
            Cost("fatal hardware fault"),
        )
    if diag == "hang":
        return Decision(
            node,
            ranks,
            diag,
            f"rank(s) {ranks} on {node} hung: {finding.summary}",
            Cost("hung node"),
        )
    if diag not in policy.stragglers:
        return None
    if run.now - (finding.first_seen or run.now) < policy.persist_s:
        return None  # not yet shown to persist: an episode may end by itself
    wait = 0.0
    for ev in finding.evidence:
        if isinstance(ev, dict) and isinstance(ev.get("wait_per_step_s"), (int, float)):
            wait = float(ev["wait_per_step_s"])
    left, basis = run.remaining_steps(policy.horizon_s)
    measured = sorted(run.measured_restart_s)
    restart = measured[len(measured) // 2] if measured else policy.restart_cost_s
    expected = wait * left
    cost = Cost(
        "straggler cost over the remaining run vs restart cost",
        wait_per_step_s=wait,
        remaining_steps=left,
        remaining_basis=basis,
        expected_loss_s=expected,
        restart_cost_s=restart,
        restart_cost_basis="median of this run's recoveries" if measured else "default",
        margin=policy.margin,
    )
    if expected <= policy.margin * restart:
        return None
    return Decision(
        node,
        ranks,
        diag,
        f"straggler on {node} costs {wait * 1000:.0f} ms/step x {left:.0f} steps = "
        f"{expected:.0f} s, more than a restart ({restart:.0f} s)",
        cost,
    )


def choose(
    policy: RemediationPolicy,
    findings: list[FindingRow],
    run: RunContext,
    *,
    live_nodes: set[str],
    taken_nodes: set[str],
    taken_keys: set[str],
) -> tuple[FindingRow, Decision] | None:
    """Of a run's findings, the one to act on now and its decision: faults first, then hangs,
    then the costliest straggler. None when no finding justifies an action, when each is acted
    on already (``taken_keys``, or its node in ``taken_nodes``), or when taking a node out of
    the running job (``live_nodes``) would leave it below its ``min_nodes`` (config)."""
    min_nodes = run.config.get("min_nodes")
    floor = int(min_nodes) if isinstance(min_nodes, (int, float)) else 1
    if live_nodes and len(live_nodes) - 1 < max(1, floor):
        return None
    cands = []
    for f in findings:
        if f.key in taken_keys or (f.kind == "straggler" and f.end_step is not None):
            continue  # acted on already, or an episode that ended
        d = decide(policy, f, run)
        if d is None or d.node in taken_nodes:
            continue
        if live_nodes and d.node not in live_nodes:
            continue  # the node is no longer in the running job
        cands.append((d.priority, f, d))
    if not cands:
        return None
    _, f, d = max(cands, key=lambda c: c[0])
    return f, d
