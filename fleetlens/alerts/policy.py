"""The alerting policy, as data: page on what hurts a job, ticket what may, stay silent on the rest.

From the seed's policy: page when a run's goodput stays under its threshold for a window
(default 80% for 30 minutes), when a job stops making progress (a hang), and on a fatal hardware
fault on a node the job uses; ticket recoverable hardware events, drained or quarantined nodes,
a straggler spread that has not yet cost the goodput threshold, and throughput drops against the
run's own baseline; never alert on component metrics with no job impact, nor on anything derived
from GPU utilization alone. Teams override thresholds per project or run (``Policy.merged``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

__all__ = ["DEFAULT_POLICY", "Inhibit", "Policy", "Rule"]

SEVERITIES = ("page", "ticket", "never")
AUDIENCES = ("researcher", "infra_oncall", "ml_platform")
SIGNALS = ("goodput", "hang", "finding")


@dataclass(frozen=True)
class Rule:
    """One alert: what raises it, how loud, and who hears it."""

    name: str
    signal: str
    severity: str
    audience: str
    description: str
    threshold: float | None = None  # goodput: the floor; hang: step-time multiple
    for_s: float = 0.0  # the condition must hold this long before the alert fires
    floor_s: float = 0.0  # hang: never sooner than this
    diagnoses: tuple[str, ...] = ()  # finding: which diagnoses raise it
    kinds: tuple[str, ...] = ()  # finding: only these kinds (e.g. "failure"); empty: any

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ConfigError(f"rule {self.name}: severity {self.severity!r}; use {SEVERITIES}")
        if self.signal not in SIGNALS:
            raise ConfigError(f"rule {self.name}: signal {self.signal!r}; use {SIGNALS}")
        if self.audience not in AUDIENCES:
            raise ConfigError(f"rule {self.name}: audience {self.audience!r}; use {AUDIENCES}")


@dataclass(frozen=True)
class Inhibit:
    """While ``source`` fires for the same ``equal`` labels, ``target`` is suppressed."""

    source: str
    target: str
    equal: tuple[str, ...] = ("run_id",)


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    inhibit: tuple[Inhibit, ...] = field(default=())

    def rule(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise ConfigError(f"no alert rule named {name!r}; rules: {[r.name for r in self.rules]}")

    def merged(self, overrides: dict[str, dict[str, Any]]) -> Policy:
        """This policy with per-rule field overrides, e.g. {"GoodputLow": {"threshold": 0.7}}."""
        rules = []
        names = {r.name for r in self.rules}
        unknown = set(overrides) - names
        if unknown:
            raise ConfigError(
                f"override for unknown rule(s) {sorted(unknown)}; rules: {sorted(names)}"
            )
        allowed = {f.name for f in dataclasses.fields(Rule)} - {"name", "signal"}
        for r in self.rules:
            o = overrides.get(r.name, {})
            bad = set(o) - allowed
            if bad:
                raise ConfigError(
                    f"rule {r.name}: cannot override {sorted(bad)}; fields: {sorted(allowed)}"
                )
            for key in ("diagnoses", "kinds"):
                if key in o:
                    o = {**o, key: tuple(o[key])}
            rules.append(dataclasses.replace(r, **o))
        return Policy(tuple(rules), self.inhibit)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rules": [dataclasses.asdict(r) for r in self.rules],
            "inhibit": [dataclasses.asdict(i) for i in self.inhibit],
        }


DEFAULT_POLICY = Policy(
    rules=(
        Rule(
            "GoodputLow",
            "goodput",
            "page",
            "researcher",
            "the run's goodput stayed under its threshold for the whole window",
            threshold=0.8,
            for_s=1800.0,
        ),
        Rule(
            "JobHang",
            "hang",
            "page",
            "researcher",
            "no step progress for a multiple of the recent step time",
            threshold=10.0,
            floor_s=60.0,
        ),
        Rule(
            "FatalHardwareFault",
            "finding",
            "page",
            "infra_oncall",
            "a fatal hardware fault on a node the job uses",
            diagnoses=("fatal_xid", "ecc_xid"),
            kinds=("failure",),
        ),
        Rule(
            "RecoverableHardwareFault",
            "finding",
            "ticket",
            "infra_oncall",
            "a recoverable hardware event on a node the job uses",
            diagnoses=("thermal", "rack_cooling", "nvlink", "ecc_xid"),
        ),
        Rule(
            "NodeDrained",
            "finding",
            "ticket",
            "infra_oncall",
            "a node the job used was drained, cordoned or taken for maintenance",
            diagnoses=("maintenance", "drain"),
        ),
        Rule(
            "StragglerSpread",
            "finding",
            "ticket",
            "researcher",
            "a rank is slowing the job, not yet past the goodput threshold",
            diagnoses=("straggler.persistent", "straggler.intermittent", "straggler.moving"),
        ),
        Rule(
            "ThroughputDrop",
            "finding",
            "ticket",
            "ml_platform",
            "tokens/s or step time worse than the run's own baseline",
            diagnoses=(
                "network",
                "data_stall",
                "slow_checkpoint",
                "throughput_drop",
                "host",
                "inefficient_compute",
            ),
        ),
        Rule(
            "TrainingInstability",
            "finding",
            "ticket",
            "researcher",
            "NaN/Inf or out-of-memory in the training code",
            diagnoses=("instability", "oom"),
        ),
    ),
    inhibit=(
        # A dead GPU stops the job: the hang it causes is the same incident, not a second page.
        Inhibit("FatalHardwareFault", "JobHang"),
        Inhibit("FatalHardwareFault", "GoodputLow"),
        Inhibit("JobHang", "GoodputLow"),
    ),
)
