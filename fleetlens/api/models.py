"""The JSON the read API answers, as pydantic models: one place that owns the wire shapes.

Python names are snake_case; the JSON is camelCase, made here and only here by the base
model's alias generator (FastAPI serializes a route's ``response_model`` by alias). The models
forbid keys they do not declare, so a service that grows a key fails the contract tests until
the key is declared here (and documented in ``/openapi.json``).

A key that a route leaves out in some answers (a run with no steps has no ``window``; a rank
whose node sent no telemetry has no ``hardware``) has a default here and the routes answer with
``response_model_exclude_unset``: the JSON carries exactly the keys the route set.

Non-finite floats: the timeline's metric values keep their ``"nan"``/``"inf"`` strings (the
value that changed *is* the NaN); other figures are finite or null.

A client decodes an answer with ``Model.model_validate(doc, extra="ignore")``, so that it also
reads a newer server's answer with keys it does not know yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

if TYPE_CHECKING:  # the client decodes with these models and needs only pydantic
    from ..analysis.breakdown import Breakdown
    from ..analysis.goodput import Factors, LossShares
    from ..store.metadata import RunInfo

__all__ = [
    "AdviceOut",
    "ApiModel",
    "BreakdownLineOut",
    "BreakdownOut",
    "CeilingGainOut",
    "CheckpointAdviceOut",
    "CompletionOut",
    "DiagnosisOut",
    "FactorsOut",
    "FindingOut",
    "LossSharesOut",
    "MfuOut",
    "PoolSchedulingOut",
    "ProgramOut",
    "RankHardwareOut",
    "RankOut",
    "RankSort",
    "RanksOut",
    "RunDetailOut",
    "RunEndOut",
    "RunGoodputOut",
    "RunListOut",
    "RunOut",
    "RunSchedulingOut",
    "RuntimeModelOut",
    "RuntimeTermsOut",
    "StepWindowOut",
    "StragglersOut",
    "TimeWindowOut",
    "TimelineEventOut",
    "TimelineItem",
    "TimelineMetricOut",
    "TimelineOut",
    "WhatIfFactorsOut",
    "WhatIfOut",
]


class ApiModel(BaseModel):
    """snake_case in Python, camelCase on the wire; unknown keys refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


# ---- runs ---------------------------------------------------------------------------------
class RunEndOut(ApiModel):
    """How the run's newest job attempt ended, judged from its ranks' last words."""

    status: str = Field(description="FINISHED, FAILED or STOPPED")
    ranks: list[int] = Field(description="the ranks that failed (or went silent); empty if none")
    step: int = Field(description="the step it ended at (-1: unknown)")
    reason: str


class RunOut(ApiModel):
    """A run as the runs list shows it."""

    run_id: str
    project: str
    experiment_id: str
    status: str
    first_seen: float
    last_seen: float
    last_step: int
    world_size: int
    jobs: int = Field(description="job attempts seen (a restart is a new job)")
    ended: RunEndOut | None = Field(
        default=None, description="how the newest attempt ended; null while it runs"
    )

    @classmethod
    def from_info(cls, info: RunInfo) -> RunOut:
        e = info.ended
        return cls(
            ended=None
            if e is None
            else RunEndOut(status=e.status, ranks=list(e.ranks), step=e.step, reason=e.reason),
            run_id=info.run_id,
            project=info.project,
            experiment_id=info.experiment_id,
            status=info.status,
            first_seen=info.first_seen,
            last_seen=info.last_seen,
            last_step=info.last_step,
            world_size=info.world_size,
            jobs=info.jobs,
        )


class RunListOut(ApiModel):
    runs: list[RunOut]
    limit: int
    offset: int


class StepWindowOut(ApiModel):
    """The recent steps the speed figures are computed over."""

    from_step: int
    to_step: int
    steps: int


class MfuOut(ApiModel):
    """Model FLOPs utilization over the run summary's window, with what it was computed from."""

    value: float | None = Field(description="null when it cannot be computed: see `missing`")
    hfu: float | None = Field(description="hardware FLOPs utilization (with recomputation)")
    accelerator: str | None = Field(description="the table entry the config's name resolved to")
    dtype: str | None
    peak_flops_per_device: float | None
    devices: int | None
    flops_per_token: float | None
    flops_per_step: float | None
    missing: str | None = Field(description="why MFU is not computed; null when it is")


class CompletionOut(ApiModel):
    """Time to result: the steps left to the config's target at the recent wall-clock pace."""

    total_steps: int
    target_key: str = Field(description="the config key the target came from")
    steps_left: int
    seconds_per_step: float
    seconds: float
    finish_at: float = Field(description="UNIX time")


class RunDetailOut(RunOut):
    """One run: the list's fields, its config and jobs, progress, speed and latest scalars."""

    config: dict[str, Any]
    job_ids: list[str]
    ranks_reporting: int | None = Field(
        default=None,
        description="ranks with steps in the newest step; fewer than worldSize: some ranks of "
        "the job do not report (or an imported log's one rank stands for the job)",
    )
    steps: int
    step: int | None = Field(description="the last step; null before the first")
    tokens_processed: int
    window: StepWindowOut | None = Field(default=None, description="absent before the first step")
    metrics: dict[str, float | None] = Field(
        description="latest value of every scalar by name, and stepTimeMs, meanRankStepTimeMs "
        "and tokensPerSecond over the window; null where not finite"
    )
    mfu: MfuOut | None = Field(default=None, description="MFU over the window's steps")
    wall_seconds_per_step: float | None = Field(
        default=None,
        description="wall-clock seconds per step over the window, step end to step end (what "
        "happens between steps counts)",
    )
    completion: CompletionOut | None = Field(
        default=None,
        description="when a RUNNING run reaches the target step its config names (total_steps, "
        "max_steps, train_iters, max_iters...); null otherwise",
    )


# ---- ranks --------------------------------------------------------------------------------
RankSort = Literal["compute", "step_time", "max_step_time", "data_wait", "comm", "rank"]


class RankHardwareOut(ApiModel):
    """A rank's GPU and host evidence over the window's time span."""

    gpu_temp_max: float | None
    sm_clock_ratio_min: float | None
    throttle_reasons: int | None
    power_max_w: float | None
    ecc_correctable: float | None
    ecc_uncorrectable: float | None
    xids: list[int]
    nvlink_crc_errors: float | None
    pcie_replays: float | None
    host_cpu_max: float | None
    nic_errors_per_s: float | None
    tcp_retransmits_per_s: float | None
    ib_errors_per_s: float | None = Field(None, description="InfiniBand port errors per second")
    rdma_retries_per_s: float | None = Field(None, description="RDMA retries per second")


class RankOut(ApiModel):
    rank: int
    node: str | None
    gpu: int | None
    gpu_uuid: str | None
    rack: str | None
    job_id: str | None
    steps: int
    step_time_ms: float | None
    max_step_time_ms: float | None
    data_wait_ms: float | None
    comm_ms: float | None
    compute_ms: float | None
    slowdown: float | None = Field(description="step time over the median rank's")
    compute_slowdown: float | None = Field(description="compute over the median rank's")
    hardware: RankHardwareOut | None = Field(
        default=None, description="absent when no rank of the answer has a known node"
    )


class RanksOut(ApiModel):
    run_id: str
    from_step: int | None
    to_step: int | None
    sort: RankSort | None = Field(default=None, description="absent when the run has no steps")
    order: Literal["asc", "desc"] | None = Field(default=None, description="absent when no steps")
    ranks: list[RankOut]


# ---- timeline -----------------------------------------------------------------------------
class TimelineEventOut(ApiModel):
    """An event a rank, an agent or the scheduler sent."""

    step: int | None
    time: float
    source: Literal["event"]
    kind: str
    rank: int | None
    node: str | None
    gpu: int | None
    message: str
    attrs: dict[str, Any]


class TimelineMetricOut(ApiModel):
    """A change found in a scalar series: an LR move, a schedule, a spike, a non-finite value."""

    step: int
    end_step: int | None = Field(
        default=None, description="a schedule's last step (kind schedule; step is its first)"
    )
    time: float
    source: Literal["metric"]
    kind: str
    metric: str
    value: float | str = Field(description='the value; "nan", "inf" or "-inf" when not finite')
    previous: float | str
    message: str


TimelineItem = Annotated[TimelineEventOut | TimelineMetricOut, Field(discriminator="source")]


class TimelineOut(ApiModel):
    run_id: str
    from_step: int | None
    to_step: int | None
    items: list[TimelineItem]


# ---- findings -----------------------------------------------------------------------------
class FindingOut(ApiModel):
    """A finding of the analysis loop: what, where, who owns it, how sure, and the evidence."""

    key: str
    kind: str
    diagnosis: str
    owner: str
    confidence: float
    summary: str
    step: int
    start_step: int
    end_step: int | None = Field(description="null while ongoing")
    time: float | None
    job_id: str | None
    ranks: list[int]
    nodes: list[str]
    gpus: list[str]
    rack: str | None
    evidence: list[dict[str, Any]]
    first_seen: float
    updated_at: float


class StragglersOut(ApiModel):
    run_id: str
    stragglers: list[FindingOut]


class DiagnosisOut(ApiModel):
    run_id: str
    findings: list[FindingOut]
    owners: dict[str, int] = Field(description="findings per owner")


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
    pools: list[PoolSchedulingOut] = []
    jobs: list[str] = []


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
