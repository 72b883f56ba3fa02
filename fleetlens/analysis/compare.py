"""Run-to-run comparison, pure: config diff, matched-step deltas, slow episodes, a conclusion.

The comparison answers "why is run B worse than run A?" the way section 23 of the requirements
puts it: show only what differs (config keys that changed first), the speed and health of each
run side by side, the loss at the same steps, and a likely conclusion. The rules are simple and
stated (see :func:`conclude`); they point at configuration or infrastructure, never hide which
evidence they used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "QUALITY_METRICS",
    "Conclusion",
    "RunFigures",
    "SlowEpisode",
    "conclude",
    "config_diff",
    "derived_config",
    "flatten",
    "slow_episodes",
]

QUALITY_METRICS = ("val_loss", "validation_loss", "eval_loss", "lm_loss_validation", "loss")
"""Scalars compared at matched steps, in order of preference for the conclusion."""

# Thresholds of the conclusion rules (relative unless said otherwise).
QUALITY_REGRESSION = 0.01  # 1% worse loss at matched steps
SPEED_REGRESSION = 0.05  # 5% slower median step
GOODPUT_REGRESSION = 0.02  # 2 points of goodput lost (absolute)
STRAGGLER_SPREAD = 0.05  # slowest rank's compute 5% over the mean rank's
SLOW_STEP_SHARE = 0.02  # 2% of steps over twice the median
INFRA_FAULTS = ("hardware_fault", "hang", "failure", "restart", "preemption", "drain", "nan")


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1e-4}}`` -> ``{"optim.lr": 1e-4}``; lists stay values."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def derived_config(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Values implied by a config: tokens per step from the global batch and sequence length."""

    def num(*names: str) -> float | None:
        for n in names:
            for k, v in flat.items():
                if k.rsplit(".", 1)[-1] == n and isinstance(v, (int, float)):
                    return float(v)
        return None

    out: dict[str, Any] = {}
    gbs, seq = num("global_batch_size"), num("seq_length", "seq_len")
    if gbs is not None and seq is not None:
        out["derived.tokens_per_step"] = int(gbs * seq)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


_MISSING = object()


def config_diff(configs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The flattened keys whose values differ between the runs, changed keys first.

    A key present in every run with different values is ``changed``; one missing from some
    runs is ``added`` (absent from the first run) or ``removed``. Values are in run order,
    ``None`` where absent.
    """
    flats = [{**flatten(c), **derived_config(flatten(c))} for c in configs]
    keys = sorted(set().union(*flats)) if flats else []
    changed, partial = [], []
    for k in keys:
        vals = [f.get(k, _MISSING) for f in flats]
        if all(v is not _MISSING for v in vals):
            if all(_same(vals[0], v) for v in vals[1:]):
                continue
            changed.append({"key": k, "status": "changed", "values": vals})
        else:
            status = "added" if vals[0] is _MISSING else "removed"
            partial.append(
                {"key": k, "status": status, "values": [None if v is _MISSING else v for v in vals]}
            )
    return changed + partial


@dataclass(frozen=True)
class SlowEpisode:
    """Consecutive logged steps slower than a factor of the run's median step time."""

    from_step: int
    to_step: int
    points: int
    median_seconds: float
    """The episode's median step time."""
    run_median_seconds: float
    slowdown: float
    """The episode's median over the run's."""


def slow_episodes(
    steps: np.ndarray[Any, Any],
    durations: np.ndarray[Any, Any],
    factor: float = 2.0,
    min_points: int = 1,
) -> list[SlowEpisode]:
    """Runs of consecutive (logged) steps slower than ``factor`` x the run's median step time.

    ``steps`` sorted ascending; NaN durations (not measured) are skipped. Each episode names
    its first and last step, its median step time and the run's.
    """
    ok = np.isfinite(durations)
    s, d = np.asarray(steps)[ok], np.asarray(durations, dtype=np.float64)[ok]
    if len(d) == 0:
        return []
    med = float(np.median(d))
    slow = d > factor * med
    out: list[SlowEpisode] = []
    i = 0
    while i < len(d):
        if not slow[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(d) and slow[j + 1]:
            j += 1
        if j - i + 1 >= min_points:
            ep = d[i : j + 1]
            out.append(
                SlowEpisode(
                    from_step=int(s[i]),
                    to_step=int(s[j]),
                    points=j - i + 1,
                    median_seconds=float(np.median(ep)),
                    run_median_seconds=med,
                    slowdown=float(np.median(ep)) / med if med > 0 else math.inf,
                )
            )
        i = j + 1
    return out


@dataclass
class RunFigures:
    """What the conclusion reads of one run (None where not measured)."""

    run_id: str
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    straggler_spread: float | None = None
    slow_step_share: float | None = None
    faults: dict[str, int] = field(default_factory=dict)
    # The analysis's findings whose owner is not the training code (network, rack, straggler,
    # GPU, storage, host), by diagnosis: what fleetlens itself diagnosed in the run.
    findings: dict[str, int] = field(default_factory=dict)
    quality: dict[str, float] = field(default_factory=dict)  # metric -> value at matched steps
    goodput: float | None = None  # the job's goodput, as its run page has it
    # What its latest evaluation failed: gates, and regressions against the model's baseline.
    evaluation_failures: list[str] = field(default_factory=list)
    dataset: str | None = None
    code: str | None = None

    def infra_issues(self) -> list[str]:
        issues = [f"{n} {k} event(s)" for k, n in sorted(self.faults.items()) if n]
        issues += [f"{n} {k} finding(s)" for k, n in sorted(self.findings.items()) if n]
        if self.straggler_spread is not None and self.straggler_spread > STRAGGLER_SPREAD:
            issues.append(f"slowest rank {100 * self.straggler_spread:.0f}% over the mean rank")
        if self.slow_step_share is not None and self.slow_step_share > SLOW_STEP_SHARE:
            issues.append(f"{100 * self.slow_step_share:.1f}% of steps over 2x the median")
        return issues


@dataclass(frozen=True)
class Conclusion:
    """A likely conclusion for a run against the baseline (:func:`conclude`)."""

    baseline: str
    run: str
    cause: str
    """none, configuration, infrastructure, configuration and infrastructure, data, code,
    contract or unexplained."""
    infrastructure_changed: bool
    contract_changed: bool
    configuration_changed: bool
    goodput_regressed: bool
    faults_regressed: bool
    evaluation_regressed: bool
    quality_regressed: bool
    speed_regressed: bool
    lines: list[str]


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or a == 0:
        return None
    return (b - a) / abs(a)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def conclude(
    base: RunFigures,
    other: RunFigures,
    diff: Sequence[Mapping[str, Any]],
    contract: Sequence[str] = (),
) -> Conclusion:
    """A likely conclusion for ``other`` against ``base`` (section 23 of the requirements).

    - regression, weighed in this order: goodput more than 2 points lower, more fault events
      (fatal hardware faults, failures, hangs, restarts), a failed evaluation gate or an
      evaluation regression, loss at matched steps >1% worse (the last tenth of the steps both
      runs logged), median step >5% slower
    - infrastructure changed: ``other`` has fault events, findings the analysis owns to the
      infrastructure (network, rack, stragglers, GPUs, storage, host), a straggler spread over
      5% or over 2% of its steps slower than twice its median, and ``base`` has less of it
    - configuration changed: any config key differs (derived keys alone do not count)
    - measured under a different contract (``contract``: what differs of the software and the
      topology, :func:`fleetlens.analysis.contract.differences`): said, whatever else
    Cause: configuration if only the config changed, infrastructure if only the
    infrastructure did, both if both; else data or code if those changed; else the contract
    (software or topology) if it differs; else unexplained.
    """
    lines: list[str] = []
    base_issues, other_issues = base.infra_issues(), other.infra_issues()
    infra_changed = bool(other_issues) and (
        len(other_issues) > len(base_issues)
        or (other.straggler_spread or 0) > (base.straggler_spread or 0) + 0.03
        or sum(other.faults.values()) > sum(base.faults.values())
        or any(n > base.findings.get(k, 0) for k, n in other.findings.items())
    )
    if not base_issues and not other_issues:
        lines.append("Infrastructure appears healthy.")
    elif infra_changed:
        lines.append(f"Infrastructure changed in {other.run_id}: " + "; ".join(other_issues) + ".")
    else:
        lines.append("Infrastructure shows the same issues in both runs.")
    goodput_delta = (
        other.goodput - base.goodput
        if other.goodput is not None and base.goodput is not None
        else None
    )
    goodput_regressed = goodput_delta is not None and goodput_delta < -GOODPUT_REGRESSION
    if goodput_regressed and base.goodput is not None and other.goodput is not None:
        lines.append(
            f"Goodput fell: {100 * base.goodput:.1f}% -> {100 * other.goodput:.1f}% "
            f"({100 * (goodput_delta or 0):+.1f} points)."
        )
    faults_regressed = sum(other.faults.values()) > sum(base.faults.values())
    if faults_regressed:
        lines.append(
            f"More faults in {other.run_id}: {sum(other.faults.values())} against "
            f"{sum(base.faults.values())} ("
            + ", ".join(f"{n} {k}" for k, n in sorted(other.faults.items()) if n)
            + ")."
        )
    evaluation_regressed = bool(other.evaluation_failures) and set(other.evaluation_failures) - set(
        base.evaluation_failures
    )
    if evaluation_regressed:
        lines.append(
            f"Evaluation of {other.run_id} failed: " + "; ".join(other.evaluation_failures) + "."
        )
    config_keys = [d["key"] for d in diff if not str(d["key"]).startswith("derived.")]
    if config_keys:
        shown = ", ".join(
            f"{d['key']} {_fmt(d['values'][0])} -> {_fmt(d['values'][-1])}"
            for d in diff
            if d["key"] in config_keys[:5]
        )
        lines.append(f"Training configuration changed: {shown}.")
    data_changed = base.dataset != other.dataset and (base.dataset or other.dataset)
    code_changed = base.code != other.code and (base.code or other.code)
    if data_changed:
        lines.append(f"Dataset changed: {base.dataset} -> {other.dataset}.")
    if code_changed:
        lines.append(f"Code changed: {base.code} -> {other.code}.")
    if contract:
        lines.append(f"Measured under a different contract: {'; '.join(contract)}.")

    quality_metric, quality_delta = None, None
    for m in QUALITY_METRICS:
        d = _rel(base.quality.get(m), other.quality.get(m))
        if d is not None:
            quality_metric, quality_delta = m, d
            break
    quality_regressed = quality_delta is not None and quality_delta > QUALITY_REGRESSION
    speed_delta = _rel(base.step_time_s, other.step_time_s)
    speed_regressed = speed_delta is not None and speed_delta > SPEED_REGRESSION
    if quality_regressed and quality_metric is not None:
        lines.append(
            f"{quality_metric} regressed: {base.quality[quality_metric]:.4g} -> "
            f"{other.quality[quality_metric]:.4g} ({100 * (quality_delta or 0):+.1f}%) over "
            "the last tenth of the steps both runs logged."
        )
    if speed_regressed:
        lines.append(
            f"Step time regressed: {base.step_time_s:.4g} s -> {other.step_time_s:.4g} s "
            f"({100 * (speed_delta or 0):+.1f}%)."
        )
    regressed = bool(
        goodput_regressed
        or faults_regressed
        or evaluation_regressed
        or quality_regressed
        or speed_regressed
    )
    what = (
        "Goodput loss"
        if goodput_regressed
        else "Reliability regression"
        if faults_regressed
        else "Evaluation regression"
        if evaluation_regressed
        else "Validation regression"
        if quality_regressed
        else "Slowdown"
    )
    if not regressed:
        cause = "none"
        lines.append(f"No regression of {other.run_id} against {base.run_id}.")
    elif config_keys and not infra_changed:
        cause = "configuration"
        lines.append(f"{what} is correlated with the {', '.join(config_keys[:3])} change.")
    elif infra_changed and not config_keys:
        cause = "infrastructure"
        lines.append(f"{what} is likely a systems issue: the configuration did not change.")
    elif infra_changed and config_keys:
        cause = "configuration and infrastructure"
        lines.append(f"{what}: both the configuration and the infrastructure changed.")
    elif data_changed or code_changed:
        cause = "data" if data_changed else "code"
        lines.append(f"{what} is correlated with the {cause} change.")
    elif contract:
        cause = "contract"
        lines.append(f"{what} is correlated with the software or topology change.")
    else:
        cause = "unexplained"
        lines.append(f"{what} with no change in configuration, data, code or infrastructure.")
    return Conclusion(
        baseline=base.run_id,
        run=other.run_id,
        cause=cause,
        infrastructure_changed=infra_changed,
        contract_changed=bool(contract),
        configuration_changed=bool(config_keys),
        goodput_regressed=goodput_regressed,
        faults_regressed=faults_regressed,
        evaluation_regressed=bool(evaluation_regressed),
        quality_regressed=quality_regressed,
        speed_regressed=speed_regressed,
        lines=lines,
    )
