"""The three goodput factors, their products and the loss shares (equations 1 and 2 of 003).

Each factor divides what crossed its boundary by what reached it, so the denominators telescope:

    scheduling = complete-allocation GPU-time / in-service GPU-time        (pool)
    runtime    = retained productive step time / held (all-allocated) time  (job)
    program    = ideal time of retained steps / their productive time       (job; = MFU there)

    MPG = scheduling x runtime x program = ideal-rate time / in-service capacity-time

The timeline breakdown (:mod:`fleetlens.analysis.breakdown`) feeds the runtime and program
factors; :mod:`fleetlens.analysis.scheduling` feeds the scheduling factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from .breakdown import Breakdown

__all__ = [
    "Factors",
    "LossShares",
    "factors_from_breakdown",
    "loss_shares",
    "telescoped",
]


_EPS = 1e-9  # sums of float seconds land a few ulps outside [0, 1]


def _unit(name: str, v: float) -> float:
    if math.isnan(v) or not (-_EPS <= v <= 1.0 + _EPS):
        raise ConfigError(f"{name} goodput is {v}; a goodput factor lies in [0, 1]")
    return min(1.0, max(0.0, v))


@dataclass(frozen=True)
class LossShares:
    """Equation 2: the gap 1 - SRP split at the boundary where each lost hour stopped."""

    scheduling: float
    runtime: float
    program: float
    useful: float


def loss_shares(scheduling: float, runtime: float, program: float) -> LossShares:
    """(1-S) + S(1-R) + SR(1-P) + SRP = 1, in the order a job meets the boundaries."""
    s, r, p = _unit("scheduling", scheduling), _unit("runtime", runtime), _unit("program", program)
    return LossShares(1.0 - s, s * (1.0 - r), s * r * (1.0 - p), s * r * p)


@dataclass(frozen=True)
class Factors:
    """One job's factors on one pool. ``scheduling`` is 1.0 on a dedicated cluster."""

    runtime: float
    program: float
    scheduling: float = 1.0
    hfu: float | None = None
    mbu: float | None = None

    def __post_init__(self) -> None:
        _unit("scheduling", self.scheduling)
        _unit("runtime", self.runtime)
        _unit("program", self.program)

    @property
    def job_product(self) -> float:
        """Runtime x program: what the job's team controls; the chargeback divisor."""
        return self.runtime * self.program

    @property
    def mpg(self) -> float:
        """The pool product (ML productivity goodput): share of in-service capacity made useful."""
        return self.scheduling * self.runtime * self.program

    @property
    def shares(self) -> LossShares:
        return loss_shares(self.scheduling, self.runtime, self.program)


def telescoped(ideal_s: float, productive_s: float, held_s: float, in_service_s: float) -> float:
    """MPG as one ratio: ideal-rate time over offered capacity-time (the product's value).

    Each argument is a GPU-time (or a time for one job's fixed gang); the product of the three
    factors equals this ratio exactly when no interval is charged twice or dropped.
    """
    if in_service_s <= 0:
        raise ConfigError("in-service capacity-time must be positive")
    if not ideal_s <= productive_s <= held_s <= in_service_s:
        raise ConfigError(
            "the boundaries must nest: ideal <= productive <= held <= in-service, got "
            f"{ideal_s}, {productive_s}, {held_s}, {in_service_s}"
        )
    return ideal_s / in_service_s


def factors_from_breakdown(
    bd: Breakdown,
    *,
    flops: float | None = None,
    devices: int | None = None,
    peak_flops: float | None = None,
    hardware_flops: float | None = None,
    scheduling: float = 1.0,
) -> Factors:
    """Runtime and program goodput of one run from its breakdown and the retained steps' FLOPs.

    ``flops`` is the model FLOPs of the retained steps only (replayed steps count once, the
    reworked executions not at all), so program goodput is MFU over retained steps, never a
    run-averaged MFU. Without FLOPs, program goodput falls back to its straggler-only bound
    (productive / (productive + straggler)), which is an upper bound on MFU.
    """
    runtime = bd.runtime_goodput
    step_time = bd.retained_step_s
    hfu = None
    if flops is not None and devices and peak_flops and step_time > 0:
        program = min(1.0, flops / (step_time * devices * peak_flops))
        if hardware_flops is not None:
            hfu = min(1.0, hardware_flops / (step_time * devices * peak_flops))
    else:
        program = max(0.0, bd.productive_s / step_time) if step_time > 0 else 0.0
    return Factors(runtime=runtime, program=program, scheduling=scheduling, hfu=hfu)
