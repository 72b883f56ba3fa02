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

from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

if TYPE_CHECKING:  # the client decodes with these models and needs only pydantic
    from ..analysis.contract import Contract
    from ..services.runs_types import Completion, RankFigures, RankHardware
    from ..services.runs_types import TimelineItem as TimelineItemValue
    from ..store.metadata import RunInfo

__all__ = [
    "ApiModel",
    "CompletionOut",
    "ContractOut",
    "DiagnosisOut",
    "FindingOut",
    "MfuOut",
    "RankHardwareOut",
    "RankOut",
    "RankSort",
    "RanksOut",
    "RunDetailOut",
    "RunEndOut",
    "RunListOut",
    "RunOut",
    "StepWindowOut",
    "StragglersOut",
    "TimelineEventOut",
    "TimelineItem",
    "TimelineMetricOut",
    "TimelineOut",
    "attrs_doc",
    "timeline_doc",
    "timeline_out",
]


class ApiModel(BaseModel):
    """snake_case in Python, camelCase on the wire; unknown keys refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


@cache
def _fields(model: type[ApiModel]) -> tuple[tuple[str, str], ...]:
    return tuple((name, f.alias or name) for name, f in model.model_fields.items())


def attrs_doc(model: type[ApiModel], value: object, skip: str = "") -> dict[str, Any]:
    """``value``'s attributes named as ``model``'s fields (but ``skip``), keyed and ordered as
    ``model``'s JSON: what a document sent without validation (msgspec) holds of ``value``."""
    return {alias: getattr(value, name) for name, alias in _fields(model) if name != skip}


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


class FrontierRunOut(ApiModel):
    """One run's time to the project's target and what it cost."""

    run_id: str
    status: str
    devices: int
    started: float = Field(description="UNIX seconds: the run's first record")
    reached_at: float | None = Field(description="when it reached the target (UNIX seconds)")
    reached_step: int | None
    estimated: bool = Field(description="not there yet: at its recent wall-clock pace")
    seconds: float | None = Field(description="time to result: reached_at - started")
    gpu_hours: float | None = Field(description="devices x time to result")
    on_frontier: bool = Field(
        description="no other run reached the target both sooner and for fewer GPU-hours"
    )


class FrontierOut(ApiModel):
    """Time to result across a project's runs and its efficiency frontier (seed 003 s9.9.4)."""

    project: str
    target_steps: int | None = Field(
        description="the step target (the runs' most common config target unless given)"
    )
    target_loss: float | None = Field(description="the quality target: a loss at or under it")
    runs: list[FrontierRunOut] = Field(description="fastest first; not reached last")


class TopologyOut(ApiModel):
    nodes: int
    gpus_per_node: int = Field(description="the most ranks placed on one node")
    devices: int
    interconnect: str | None = Field(description="NVLink domains, where the placement names them")
    gpus: bool = Field(description="false: the ranks were placed on no GPU (a CPU job)")


class TrialsOut(ApiModel):
    """The project's runs of the same workload (config keys that set the step time, world size),
    this one included."""

    runs: list[str]
    step_time_median_s: list[float] = Field(description="each trial's median step time")
    spread: float | None = Field(description="their standard deviation over their mean")


class ContractOut(ApiModel):
    """What a speed answer was measured on (seed 003 s9.3.1): compare two only when alike."""

    software: dict[str, str] = Field(
        description="image (FLEETLENS_IMAGE), torch, cuda, nccl, nvidia_driver, python, compiler: "
        "as the ranks reported them at their start (the most common value where they differ)"
    )
    mixed: dict[str, list[str]] = Field(description="keys whose ranks reported different values")
    topology: TopologyOut | None
    trials: TrialsOut | None = Field(description="null: no other run of the same workload")
    text: str = Field(description="the contract in a line")

    @classmethod
    def of(cls, c: Contract | None) -> ContractOut | None:
        if c is None:
            return None
        t, tr = c.topology, c.trials
        return cls(
            software=c.software,
            mixed=c.mixed,
            topology=None
            if t is None
            else TopologyOut(
                nodes=t.nodes,
                gpus_per_node=t.gpus_per_node,
                devices=t.devices,
                interconnect=t.interconnect,
                gpus=t.gpus,
            ),
            trials=None
            if tr is None
            else TrialsOut(
                runs=tr.runs, step_time_median_s=tr.step_time_median_s, spread=tr.spread
            ),
            text=c.text(),
        )


class StepWindowOut(ApiModel):
    """The recent steps the speed figures are computed over."""

    from_step: int
    to_step: int
    steps: int


class LayoutOut(ApiModel):
    """The job's parallel layout (fleetlens.analysis.layout): its sizes and rank order."""

    tp: int = Field(description="tensor-parallel size")
    pp: int = Field(description="pipeline-parallel stages")
    dp: int = Field(description="data-parallel replicas (what the world leaves when unsaid)")
    cp: int = Field(description="context / sequence-parallel size")
    ep: int = Field(description="expert-parallel size (over the data-parallel ranks)")
    vpp: int = Field(description="virtual pipeline stages per rank (interleaved schedule)")
    world: int
    order: list[str] = Field(description="the axes outermost first; the last varies fastest")
    source: Literal["config", "mesh"] = Field(
        description="from the config's parallel sizes, or a DeviceMesh (its order too)"
    )


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
    tokens_left: int | None = Field(
        default=None,
        description="a token budget's tokens left (the config names tokens, not steps; the "
        "steps left are them at the run's tokens per step so far)",
    )

    @classmethod
    def of(cls, c: Completion) -> CompletionOut:
        """``c``'s JSON: ``tokensLeft`` only for a token budget."""
        skip = "" if c.tokens_left is not None else "tokens_left"
        return cls.model_validate(attrs_doc(cls, c, skip=skip))


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
    contract: ContractOut | None = Field(
        default=None, description="what the step time and MFU were measured on"
    )
    layout: LayoutOut | None = Field(
        default=None,
        description="the parallel layout its config or DeviceMesh names; null for a job that "
        "names no model-parallel size (every rank is every other's peer)",
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

    @classmethod
    def doc(cls, h: RankHardware) -> dict[str, Any]:
        """``h`` as JSON (the portal's documents sent by msgspec embed it)."""
        return attrs_doc(cls, h)


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

    @classmethod
    def of(cls, r: RankFigures) -> RankOut:
        return cls.model_validate(cls.doc(r))

    @classmethod
    def doc(cls, r: RankFigures) -> dict[str, Any]:
        """``r`` as JSON (sent by msgspec in the portal's heatmap: no validation on that path);
        ``hardware`` only where it was looked up."""
        out = attrs_doc(cls, r, skip="hardware")
        if r.hardware_read:
            out["hardware"] = None if r.hardware is None else RankHardwareOut.doc(r.hardware)
        return out


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


def timeline_doc(item: TimelineItemValue) -> dict[str, Any]:
    """A timeline item as JSON (the portal's documents, sent by msgspec, embed these)."""
    return attrs_doc(TimelineEventOut if item.source == "event" else TimelineMetricOut, item)


def timeline_out(item: TimelineItemValue) -> TimelineEventOut | TimelineMetricOut:
    model: type[TimelineEventOut | TimelineMetricOut]
    model = TimelineEventOut if item.source == "event" else TimelineMetricOut
    return model.model_validate(attrs_doc(model, item))


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


class StragglerWhatIfFindingOut(ApiModel):
    """What one finding costs by the what-if: its ranks (or stage) at their peers' median."""

    key: str
    diagnosis: str
    owner: str
    ranks: list[int]
    saved_seconds: float = Field(description="seconds the window's steps would have been shorter")
    share: float = Field(description="saved_seconds over the window's measured time")
    speedup: float = Field(
        description="how much faster the window would have run: saved / (wall - saved)"
    )


class StragglerWhatIfOut(ApiModel):
    """How much faster the run's newest attempt would be with each operation type, each worker
    or stage at its peers' median (fleetlens.analysis.whatif: the synchronous step, the last
    arrival plus the transfer; a pipeline's slowest stage bounds it)."""

    run_id: str
    job_id: str
    from_step: int
    to_step: int
    steps: int
    wall_seconds: float
    saved_seconds: float = Field(description="every type at its peers' median at once")
    slowdown: float = Field(description="S: saved / (wall - saved)")
    by_type: dict[str, float] = Field(
        description="seconds saved with that type alone ideal: compute (every worker at its "
        "stage's median), stages (the slowest stage at the median stage), data (input wait), "
        "dp_comm (the data-parallel transfer at its median)"
    )
    findings: list[StragglerWhatIfFindingOut]
    layout: LayoutOut | None = None
