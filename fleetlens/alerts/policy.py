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

from ..analysis.regression import TIERS
from ..errors import ConfigError

__all__ = ["BASELINE_S", "DEFAULT_POLICY", "METRICS", "Inhibit", "Policy", "Rule"]

SEVERITIES = ("page", "ticket", "never")
AUDIENCES = ("researcher", "infra_oncall", "ml_platform")
SIGNALS = ("goodput", "hang", "finding", "metric", "evaluation")
OPS = ("above", "drop", "rise")
# The run metrics a "metric" rule can read (seed 001 s36), as the monitor samples them per run
# and /metrics exports them: name -> Prometheus series.
METRICS: dict[str, str] = {
    "mfu": "fleetlens_run_mfu",
    "tokens_per_s": "fleetlens_run_tokens_per_second",
    "gpu_temp_max": "fleetlens_run_gpu_temperature_max_celsius",
    "comm_ratio": "fleetlens_run_communication_ratio",
    "data_wait_ratio": "fleetlens_run_data_wait_ratio",
    "rank_step_ratio": "fleetlens_run_rank_step_time_ratio",
    "prefetch_empty_share": "fleetlens_run_prefetch_empty_ratio",
    "storage_read_p99_s": "fleetlens_run_storage_read_latency_p99_seconds",
}
BASELINE_S = 3600.0
"""A ``drop``/``rise`` rule compares the window with the run's own values of the hour before it."""


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
    #                              evaluation: the regression kinds (safety, benchmark, ...)
    metric: str = ""  # metric: one of METRICS
    op: str = ""  # metric: above (the threshold), drop / rise (by the threshold, a fraction,
    #               against the run's own hour before the window)
    runbook_url: str = ""  # where its alerts say to look; "" = this server's /runbooks page

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ConfigError(f"rule {self.name}: severity {self.severity!r}; use {SEVERITIES}")
        if self.signal not in SIGNALS:
            raise ConfigError(f"rule {self.name}: signal {self.signal!r}; use {SIGNALS}")
        if self.audience not in AUDIENCES:
            raise ConfigError(f"rule {self.name}: audience {self.audience!r}; use {AUDIENCES}")
        if self.signal == "metric":
            if self.metric not in METRICS:
                raise ConfigError(f"rule {self.name}: metric {self.metric!r}; use {list(METRICS)}")
            if self.op not in OPS:
                raise ConfigError(f"rule {self.name}: op {self.op!r}; use {OPS}")
            if self.threshold is None:
                raise ConfigError(f"rule {self.name}: a metric rule needs a threshold")


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
        Rule(
            "TensorParallelSplit",
            "finding",
            "ticket",
            "infra_oncall",
            "tensor-parallel groups placed across NVLink domains or nodes",
            diagnoses=("topology",),
        ),
        Rule(
            "PipelineStageImbalance",
            "finding",
            "ticket",
            "researcher",
            "one pipeline stage computes longer than the others at every replica",
            diagnoses=("stage_imbalance",),
        ),
        Rule(
            "BatchImbalance",
            "finding",
            "ticket",
            "researcher",
            "the data-parallel replicas' batches cost unevenly from step to step",
            diagnoses=("batch_imbalance",),
        ),
        Rule(
            "PerformanceRegression",
            "finding",
            "ticket",
            "infra_oncall",
            "a run is slower (step time, MFU, scaling, startup, recovery, checkpoints or "
            "allocation) than the fleet baseline of its workload, architecture or pool, with "
            "the software change that coincides",
            diagnoses=tuple(f"{t}_regression" for t in TIERS),
        ),
        Rule(
            "MemoryClimb",
            "finding",
            "ticket",
            "researcher",
            "a rank's memory climbs step after step and reaches its limit within 1,000 steps",
            diagnoses=("memory_climb",),
        ),
        # The per-metric alerts of seed 001 s36, each on the run's own series.
        Rule(
            "MFUDrop",
            "metric",
            "ticket",
            "researcher",
            "MFU more than 20% under the run's own previous hour for 10 minutes",
            threshold=0.2,
            for_s=600.0,
            metric="mfu",
            op="drop",
        ),
        Rule(
            "TokensPerSecondDrop",
            "metric",
            "ticket",
            "researcher",
            "tokens/s more than 25% under the run's own previous hour for 10 minutes",
            threshold=0.25,
            for_s=600.0,
            metric="tokens_per_s",
            op="drop",
        ),
        Rule(
            "GPUTemperatureHigh",
            "metric",
            "ticket",
            "infra_oncall",
            "a GPU the run uses above 87 C (H100 slowdown) for 5 minutes",
            threshold=87.0,
            for_s=300.0,
            metric="gpu_temp_max",
            op="above",
        ),
        Rule(
            "CommunicationRatioHigh",
            "metric",
            "ticket",
            "ml_platform",
            "collectives take over 30% of the step for 10 minutes",
            threshold=0.3,
            for_s=600.0,
            metric="comm_ratio",
            op="above",
        ),
        Rule(
            "RankStepTimeSpread",
            "metric",
            "ticket",
            "researcher",
            "the slowest rank's step over 2x the mean rank's for 5 minutes",
            threshold=2.0,
            for_s=300.0,
            metric="rank_step_ratio",
            op="above",
        ),
        Rule(
            "DataloaderWaitHigh",
            "metric",
            "ticket",
            "ml_platform",
            "ranks wait for data over 10% of the step for 10 minutes",
            threshold=0.1,
            for_s=600.0,
            metric="data_wait_ratio",
            op="above",
        ),
        Rule(
            "PrefetchQueueEmpty",
            "metric",
            "ticket",
            "ml_platform",
            "the prefetch queue is empty in most rank-steps for 5 minutes (Run.data)",
            threshold=0.5,
            for_s=300.0,
            metric="prefetch_empty_share",
            op="above",
        ),
        Rule(
            "StorageLatencyUp",
            "metric",
            "ticket",
            "ml_platform",
            "storage read latency p99 over 2x the run's own previous hour for 10 minutes",
            threshold=1.0,
            for_s=600.0,
            metric="storage_read_p99_s",
            op="rise",
        ),
        # Evaluation regressions against the production version (seed 001 s36): a candidate's
        # safety regression pages, a benchmark, latency or cost regression tickets.
        Rule(
            "EvalSafetyRegression",
            "evaluation",
            "page",
            "ml_platform",
            "a candidate model version is less safe than production (a safety gate failed)",
            kinds=("safety",),
        ),
        Rule(
            "EvalBenchmarkRegression",
            "evaluation",
            "ticket",
            "researcher",
            "a candidate model version scores worse than production on a benchmark",
            kinds=("benchmark",),
        ),
        Rule(
            "EvalLatencyRegression",
            "evaluation",
            "ticket",
            "ml_platform",
            "a candidate model version answers slower than production (p95 latency)",
            kinds=("latency",),
        ),
        Rule(
            "EvalCostRegression",
            "evaluation",
            "ticket",
            "ml_platform",
            "a candidate model version costs more per example than production, or over its bound",
            kinds=("cost",),
        ),
    ),
    inhibit=(
        # A dead GPU stops the job: the hang it causes is the same incident, not a second page.
        Inhibit("FatalHardwareFault", "JobHang"),
        Inhibit("FatalHardwareFault", "GoodputLow"),
        Inhibit("JobHang", "GoodputLow"),
    ),
)
