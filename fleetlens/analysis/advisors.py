"""Advisors over the goodput factors: checkpoint cadence, lever values, trade-offs and cost.

* Young-Daly: the checkpoint interval that minimizes write pauses plus expected rework,
  tau* = sqrt(2 delta M), with preemptions counted as interruptions (they discard the same
  post-checkpoint work), and the waste delta/tau + tau/(2M) at any interval (003 eq. 7.7, 7.8).
* Equation 4 predicted from models: startup/held + data stall ratio + waste(tau) + R/M +
  preemption rate x tax, to set beside the terms measured from the timeline.
* Marginal value of one point of a factor = the product of the other two; gain at each lever's
  ceiling = ceiling / current; a change is judged by the product of its after/before ratios
  (a what-if: factors or equation-4 terms moved from a run's measured values).
* Cost of one ideal-rate accelerator-hour = price / MPG; the chargeback view = price / job
  product (billing held hours leaves the scheduling loss unbilled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .breakdown import Breakdown
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
    "runtime_model",
    "scaled_runtime",
    "what_if",
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


def runtime_model(bd: Breakdown) -> RuntimeModel | None:
    """Equation 4's model inputs read off a run's own record, or None without held time.

    Mean synchronous write per checkpoint, held time per checkpoint as the interval, held time
    per failure as the MTBF, recovery (with hangs) per failure, preemptions and planned drains
    per held second, and their cost (pause plus lost work) per event. The model then predicts
    the checkpoint term as Young-Daly's delta/tau + tau/(2M), whose second part is the
    *expected* rework of a failure landing uniformly between checkpoints: where the run's
    failures struck later or earlier than that, the checkpoint residual shows it.
    """
    held = bd.held_s
    if held <= 0:
        return None
    hs = {k: v - bd.unheld.get(k, 0.0) for k, v in bd.seconds.items()}
    failures = bd.interruptions.get("recovery", 0)
    planned = bd.interruptions.get("preemption", 0) + bd.interruptions.get("maintenance", 0)
    rw = bd.rework_by_cause
    tax = hs["preemption"] + hs["maintenance"] + rw.get("preemption", 0) + rw.get("maintenance", 0)
    return RuntimeModel(
        held_s=held,
        startup_s=hs["startup"],
        data_stall_ratio=hs["data_stall"] / held,
        checkpoint_write_s=hs["checkpoint"] / bd.checkpoints if bd.checkpoints else 0.0,
        # without checkpoints a failure loses the work since the start: one interval = the run
        checkpoint_interval_s=held / bd.checkpoints if bd.checkpoints else held,
        mtbf_s=held / failures if failures else math.inf,
        recovery_s=(hs["recovery"] + hs["hang"]) / failures if failures else 0.0,
        preemptions_per_s=planned / held,
        preemption_tax_s=tax / planned if planned else 0.0,
    )


def scaled_runtime(runtime: float, measured: dict[str, float], after: dict[str, float]) -> float:
    """Runtime goodput after equation-4 terms move from ``measured`` to ``after`` (shares of the
    held time before): the retained step time stays, the held time shrinks or grows by the
    difference, so R' = R / (1 - sum(measured - after))."""
    delta = 0.0
    for term, share in after.items():
        if term not in measured:
            raise ConfigError(f"no equation-4 term {term!r}; the terms are {', '.join(measured)}")
        if share < 0:
            raise ConfigError(f"term {term} after the change is {share}; a share is >= 0")
        delta += measured[term] - share
    if delta >= 1.0:
        raise ConfigError("the terms after the change leave no held time")
    return runtime / (1.0 - delta)


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


_FACTORS = ("scheduling", "runtime", "program")


def what_if(
    before: Factors,
    measured_terms: dict[str, float],
    *,
    after: dict[str, float] | None = None,
    ratios: dict[str, float] | None = None,
    terms: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A proposed change applied to a run's measured factors and judged by :func:`judge_change`.

    Each factor is given at most once: its value ``after`` the change, or its after/before
    ratio; or ``terms`` move equation-4 terms (shares of the held time before), which set the
    runtime factor through :func:`scaled_runtime`. Returns the factors after, the ratios, their
    product (MPG after / before), the job's own product ratio (runtime x program), whether the
    change improves the fleet, the break-even ratio of each factor (where the product would be
    1 with the other ratios as proposed) and the terms after when terms were given.
    """
    after, ratios, terms = after or {}, ratios or {}, terms or {}
    for name in (*after, *ratios):
        if name not in _FACTORS:
            raise ConfigError(f"no goodput factor {name!r}; the factors are {', '.join(_FACTORS)}")
    both = set(after) & set(ratios)
    if both:
        raise ConfigError(f"{', '.join(sorted(both))}: give a factor as a value after or a ratio")
    if terms and ("runtime" in after or "runtime" in ratios):
        raise ConfigError("the terms set the runtime factor; do not give runtime too")
    if not (after or ratios or terms):
        raise ConfigError("name a change: a factor's value after, a ratio, or terms")
    values = {k: float(getattr(before, k)) for k in _FACTORS}
    for name in _FACTORS:  # every ratio is taken, changed or not
        if values[name] <= 0:
            raise ConfigError(f"the run's {name} goodput is 0; a ratio of it is undefined")
    terms_after = None
    if terms:
        values["runtime"] = scaled_runtime(values["runtime"], measured_terms, terms)
        terms_after = {**measured_terms, **terms}
    values.update(after)
    for name, ratio in ratios.items():
        values[name] *= ratio
    for name, v in values.items():
        if not 0.0 <= v <= 1.0 + 1e-9:
            raise ConfigError(f"{name} goodput after the change is {v:.4g}; a factor is in [0, 1]")
    new = Factors(
        runtime=min(values["runtime"], 1.0),
        program=min(values["program"], 1.0),
        scheduling=min(values["scheduling"], 1.0),
    )
    verdict = judge_change(before, new)
    r = {k: float(verdict[k]) for k in _FACTORS}
    product = float(verdict["product"])
    return {
        "after": new,
        "ratios": r,
        "product": product,
        "job_product_ratio": r["runtime"] * r["program"],
        "improves": bool(verdict["improves"]),
        # a product that underflowed to 0 (ratios of ~1e-300) has no break-even to show
        "break_even": {
            k: r[k] / product for k in _FACTORS if product > 0 and r[k] / product < math.inf
        },
        "terms_after": terms_after,
    }


def cost_per_useful_hour(price_per_hour: float, f: Factors) -> float:
    """What the pool pays for one accelerator-hour of ideal-rate progress: price / MPG."""
    return price_per_hour / f.mpg if f.mpg > 0 else math.inf


def chargeback_per_useful_hour(price_per_hour: float, f: Factors) -> float:
    """Billing held hours: price / job product (the scheduling loss is billed to no one)."""
    return price_per_hour / f.job_product if f.job_product > 0 else math.inf
