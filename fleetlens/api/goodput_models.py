"""The JSON of a run's goodput (``GET /v1/runs/{id}/goodput``, the what-if, the scheduler's
records of it), beside :mod:`fleetlens.api.models`, whose conventions these follow: camelCase on
the wire, unknown keys refused, a key a route leaves out has a default."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from .models import ApiModel, ContractOut

if TYPE_CHECKING:
    from ..analysis.breakdown import Breakdown
    from ..analysis.goodput import Factors, LossShares
    from ..services.goodput import ProgramFigures

__all__ = [
    "AdviceOut",
    "BreakdownLineOut",
    "BreakdownOut",
    "CeilingGainOut",
    "CheckpointAdviceOut",
    "FactorsOut",
    "LossSharesOut",
    "PoolSchedulingOut",
    "ProgramOut",
    "RunGoodputOut",
    "RunSchedulingOut",
    "RuntimeModelOut",
    "RuntimeTermsOut",
    "TimeWindowOut",
    "WhatIfFactorsOut",
    "WhatIfOut",
]


# ---- goodput ------------------------------------------------------------------------------
class TimeWindowOut(ApiModel):
    """A span of UNIX seconds; ``from`` is a Python keyword, hence ``start``."""

    start: float = Field(alias="from")
    to: float

    @classmethod
    def of(cls, t0: float, t1: float) -> TimeWindowOut:
        return cls.model_validate({"from": t0, "to": t1})


class BreakdownLineOut(ApiModel):
    category: str
    seconds: float
    share: float = Field(description="of the wall-clock")
    unheld_seconds: float
    factor: str = Field(description="the goodput factor the line belongs to")


class BreakdownOut(ApiModel):
    """Where the wall-clock went: one line per category; the lines sum to ``wallSeconds``."""

    window: TimeWindowOut
    wall_seconds: float
    held_seconds: float
    lines: list[BreakdownLineOut]
    rework_by_cause: dict[str, float]
    retained_steps: float
    reworked_executions: int
    attempts: int
    interruptions: dict[str, int]
    checkpoints: int
    runtime_goodput: float
    unaccounted_share: float
    instrumentation_hole: bool
    measured_terms: dict[str, float]

    @classmethod
    def of(cls, bd: Breakdown) -> BreakdownOut:
        from ..analysis.breakdown import CATEGORIES, FACTOR_OF

        wall = bd.wall_s
        return cls(
            window=TimeWindowOut.of(bd.t0, bd.t1),
            wall_seconds=wall,
            held_seconds=bd.held_s,
            lines=[
                BreakdownLineOut(
                    category=c,
                    seconds=bd.seconds[c],
                    share=bd.seconds[c] / wall if wall > 0 else 0.0,
                    unheld_seconds=bd.unheld.get(c, 0.0),
                    factor=FACTOR_OF[c].split(" ")[0],
                )
                for c in CATEGORIES
            ],
            rework_by_cause=bd.rework_by_cause,
            retained_steps=bd.retained_steps,
            reworked_executions=bd.reworked_executions,
            attempts=bd.attempts,
            interruptions=bd.interruptions,
            checkpoints=bd.checkpoints,
            runtime_goodput=bd.runtime_goodput,
            unaccounted_share=bd.seconds["unaccounted"] / wall if wall else 0.0,
            instrumentation_hole=bd.instrumentation_hole,
            measured_terms=bd.measured_terms(),
        )


class LossSharesOut(ApiModel):
    scheduling: float
    runtime: float
    program: float
    useful: float

    @classmethod
    def of(cls, s: LossShares) -> LossSharesOut:
        return cls(scheduling=s.scheduling, runtime=s.runtime, program=s.program, useful=s.useful)


class FactorsOut(ApiModel):
    scheduling: float
    runtime: float
    program: float
    hfu: float | None
    mbu: float | None
    job_product: float
    mpg: float
    loss_shares: LossSharesOut

    @classmethod
    def of(cls, f: Factors) -> FactorsOut:
        return cls(
            scheduling=f.scheduling,
            runtime=f.runtime,
            program=f.program,
            hfu=f.hfu,
            mbu=f.mbu,
            job_product=f.job_product,
            mpg=f.mpg,
            loss_shares=LossSharesOut.of(f.shares),
        )


class ProgramOut(ApiModel):
    devices: int | None
    retained_flops: float | None
    program_basis: str
    mfu: float | None = Field(
        default=None, description="program goodput when it is MFU over the retained steps"
    )
    hfu: float | None = Field(default=None, description="with recomputation (config recompute)")
    mbu: float | None = Field(default=None, description="with config bytes_per_step")
    accelerator: str | None = Field(default=None, description="the table entry used")
    dtype: str | None = None
    peak_flops_per_device: float | None = None
    missing: str | None = Field(default=None, description="why MFU is not computed")

    @staticmethod
    def doc(p: ProgramFigures) -> dict[str, Any]:
        """``p`` as the run page's overview has it (sent by msgspec, not validated)."""
        return {
            "devices": p.devices,
            "retainedFlops": p.retained_flops,
            "programBasis": p.program_basis,
        }


class RuntimeModelOut(ApiModel):
    """Equation 4's model inputs, read off the run's own record."""

    held_seconds: float
    startup_seconds: float
    data_stall_ratio: float
    checkpoint_write_seconds: float
    checkpoint_interval_seconds: float
    mtbf_seconds: float | None = Field(description="held time per failure; null without one")
    recovery_seconds: float = Field(description="recovery and hang time per failure")
    preemptions_per_second: float
    preemption_tax_seconds: float


class RuntimeTermsOut(ApiModel):
    """Equation 4's terms as shares of held time: measured on the timeline, predicted from the
    owners' models (Young-Daly for checkpoints), and measured - predicted."""

    measured: dict[str, float]
    predicted: dict[str, float] | None
    residual: dict[str, float] | None = Field(
        description="measured - predicted per term, and `total` over the five"
    )
    model: RuntimeModelOut | None


class CeilingGainOut(ApiModel):
    ceiling: float
    mpg: float = Field(description="MPG with this factor at its ceiling, the others as measured")
    gain: float | None = Field(description="relative MPG gain; null when the factor is 0")


class CheckpointAdviceOut(ApiModel):
    write_seconds: float
    mean_time_between_interruptions: float
    current_interval_seconds: float
    optimal_interval_seconds: float
    waste_at_current: float
    waste_at_optimal: float


class AdviceOut(ApiModel):
    marginal_values: dict[str, float]
    checkpoint: CheckpointAdviceOut | None = Field(
        default=None, description="Young-Daly; absent without checkpoints and interruptions"
    )
    cost_per_useful_hour: float | None = Field(default=None, description="absent without a price")
    chargeback_per_useful_hour: float | None = Field(
        default=None, description="absent without a price"
    )
    ceiling_gains: dict[str, CeilingGainOut] | None = Field(
        default=None, description="each lever at its ceiling (1 unless `ceilings` names one)"
    )


class RunGoodputOut(ApiModel):
    run_id: str
    breakdown: BreakdownOut
    factors: FactorsOut
    program: ProgramOut
    runtime_terms: RuntimeTermsOut | None = Field(default=None, description="equation 4")
    advice: AdviceOut
    scheduling: RunSchedulingOut | None = None
    contract: ContractOut | None = Field(default=None, description="what it was measured on")


# ---- scheduler records ----------------------------------------------------------------------
class PoolSchedulingOut(ApiModel):
    pool: str
    factor: float
    basis: Literal["pool", "own_allocations"]
    from_: float = Field(alias="from")
    to: float
    held_gpu_seconds: float


class RunSchedulingOut(ApiModel):
    """Where a run's scheduling factor came from: ``manual`` (the ``scheduling`` parameter),
    ``default`` (no allocation records: 1), or its own allocations (``pool``: the pool's
    scheduling goodput while the run held it; ``own_allocations``: its complete-gang share)."""

    factor: float
    basis: Literal["manual", "default", "pool", "own_allocations", "mixed"]
    pools: list[PoolSchedulingOut] = Field(default_factory=list)
    jobs: list[str] = Field(default_factory=list)


class WhatIfFactorsOut(ApiModel):
    scheduling: float
    runtime: float
    program: float
    job_product: float
    mpg: float


class WhatIfOut(ApiModel):
    """A proposed change judged by the product of its after/before ratios (003 s9.9.1)."""

    run_id: str
    window: TimeWindowOut
    program_basis: str
    before: WhatIfFactorsOut = Field(description="the run's measured factors")
    after: WhatIfFactorsOut
    ratios: dict[str, float] = Field(description="after / before per factor")
    product: float = Field(description="the product of the ratios: MPG after / MPG before")
    job_product_ratio: float = Field(description="runtime x program ratio: the job's own lever")
    improves: bool
    break_even: dict[str, float] = Field(
        description="per factor, the ratio at which the product would be exactly 1 with the "
        "other ratios as proposed (e.g. how much runtime a program gain can spend)"
    )
    terms_after: dict[str, float] | None = Field(
        default=None, description="equation-4 terms after the change, when the change names terms"
    )
