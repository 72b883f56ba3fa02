"""Advisors over the goodput factors: checkpoint cadence, lever values, trade-offs and cost.

* Young-Daly: the checkpoint interval that minimizes write pauses plus expected rework,
  tau* = sqrt(2 delta M), with preemptions counted as interruptions (they discard the same
  post-checkpoint work), and the waste delta/tau + tau/(2M) at any interval (003 eq. 7.7, 7.8).
* Equation 4 predicted from models: startup/held + data stall ratio + waste(tau) + R/M +
  preemption rate x tax, to set beside the terms measured from the timeline.
* Marginal value of one point of a factor = the product of the other two; gain at each lever's
  ceiling = ceiling / current; a change is judged by the product of its after/before ratios.
* Cost of one ideal-rate accelerator-hour = price / MPG; the chargeback view = price / job
  product (billing held hours leaves the scheduling loss unbilled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from .goodput import Factors

__all__ = [
    "RuntimeModel",
    "ceiling_gains",
    "chargeback_per_useful_hour",
    "checkpoint_waste",
    "cost_per_useful_hour",
    "judge_change",
    "marginal_values",
    "predicted_terms",
    "young_daly",
]


def young_daly(
    write_s: float, mtbf_s: float, preemptions_per_s: float = 0.0
) -> tuple[float, float]:
    """(optimal checkpoint interval in seconds, the combined mean time between interruptions).

    ``mtbf_s`` is the job's mean time between failures; preemptions add their rate.
    """
    if write_s <= 0 or mtbf_s <= 0 or preemptions_per_s < 0:
        raise ConfigError("young_daly needs a positive write time and MTBF, preemptions >= 0")
    rate = 1.0 / mtbf_s + preemptions_per_s
    m = 1.0 / rate
    return math.sqrt(2.0 * write_s * m), m


def checkpoint_waste(interval_s: float, write_s: float, mtbi_s: float) -> float:
    """Share of time lost to synchronous writes plus expected rework: delta/tau + tau/(2M)."""
    if interval_s <= 0 or mtbi_s <= 0:
        raise ConfigError("checkpoint interval and MTBI must be positive")
    return write_s / interval_s + interval_s / (2.0 * mtbi_s)


@dataclass(frozen=True)
class RuntimeModel:
    """The inputs of equation 4's five owners' models."""

    held_s: float
    startup_s: float
    data_stall_ratio: float
    checkpoint_write_s: float
    checkpoint_interval_s: float | None
    mtbf_s: float
    recovery_s: float
    preemptions_per_s: float
    preemption_tax_s: float


def predicted_terms(m: RuntimeModel) -> dict[str, float]:
    """Equation 4, term by term, as shares of held time (a first-order sum)."""
    tau = m.checkpoint_interval_s or young_daly(m.checkpoint_write_s, m.mtbf_s)[0]
    return {
        "startup": m.startup_s / m.held_s,
        "data_stall": m.data_stall_ratio,
        "checkpoint": checkpoint_waste(tau, m.checkpoint_write_s, m.mtbf_s),
        "recovery": m.recovery_s / m.mtbf_s,
        "preemption": m.preemptions_per_s * m.preemption_tax_s,
    }


def marginal_values(f: Factors) -> dict[str, float]:
    """MPG gained per unit of each factor: the product of the other two."""
    return {
        "scheduling": f.runtime * f.program,
        "runtime": f.scheduling * f.program,
        "program": f.scheduling * f.runtime,
    }


def ceiling_gains(f: Factors, ceilings: dict[str, float]) -> dict[str, dict[str, float]]:
    """For each lever with a reachable ceiling: the MPG it reaches and its relative gain."""
    out = {}
    for name, ceiling in ceilings.items():
        current = getattr(f, name)
        ratio = ceiling / current if current > 0 else math.inf
        out[name] = {"ceiling": ceiling, "mpg": f.mpg * ratio, "gain": ratio - 1.0}
    return out


def judge_change(before: Factors, after: Factors) -> dict[str, float | bool]:
    """A change multiplies MPG by the product of its per-factor after/before ratios."""
    ratios = {
        name: getattr(after, name) / getattr(before, name)
        for name in ("scheduling", "runtime", "program")
    }
    product = ratios["scheduling"] * ratios["runtime"] * ratios["program"]
    return {**ratios, "product": product, "improves": product > 1.0}


def cost_per_useful_hour(price_per_hour: float, f: Factors) -> float:
    """What the pool pays for one accelerator-hour of ideal-rate progress: price / MPG."""
    return price_per_hour / f.mpg if f.mpg > 0 else math.inf


def chargeback_per_useful_hour(price_per_hour: float, f: Factors) -> float:
    """Billing held hours: price / job product (the scheduling loss is billed to no one)."""
    return price_per_hour / f.job_product if f.job_product > 0 else math.inf
