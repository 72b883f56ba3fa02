"""What :class:`fleetlens.services.runs.RunQueries` answers of a run's summary, ranks and
timeline, and when it will finish (:func:`fleetlens.services.runs.completion`), as typed values
(snake_case; the API makes their JSON). None stands for "not measured"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Completion",
    "MetricChangeItem",
    "RankFigures",
    "RankHardware",
    "RunSummary",
    "SummaryWindow",
    "TimelineEvent",
    "TimelineItem",
]


@dataclass(frozen=True, slots=True)
class SummaryWindow:
    """The recent steps a summary's speed figures are computed over."""

    from_step: int
    to_step: int
    steps: int


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A run's progress and speed (:func:`fleetlens.services.runs.summarize`): its step count,
    last step and tokens; with steps (``window`` not None), each scalar's latest value
    (``scalars``), and over the recent steps the median step time (slowest rank, ms), the mean
    rank's, tokens/s, the wall-clock seconds per step (step end to step end) and the world size
    at the last step; ``ranks_reporting`` (set by
    :func:`~fleetlens.services.runs.declared_world`): the ranks that report steps, where the
    world size is the job's declared one."""

    steps: int
    step: int | None
    tokens_processed: int
    scalars: dict[str, float | None]
    window: SummaryWindow | None = None
    step_time_ms: float | None = None
    mean_rank_step_time_ms: float | None = None
    tokens_per_second: float | None = None
    wall_seconds_per_step: float | None = None
    world_size: int | None = None
    ranks_reporting: int | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """When a live run reaches its target step (:func:`fleetlens.services.runs.completion`):
    the steps left at the recent wall-clock pace; ``finish_at`` is UNIX time; ``tokens_left``
    where the target is a token budget (None otherwise)."""

    total_steps: int
    target_key: str
    steps_left: int
    seconds_per_step: float
    seconds: float
    finish_at: float
    tokens_left: int | None = None


@dataclass(frozen=True, slots=True)
class RankHardware:
    """A rank's GPU and host evidence over a window's time span."""

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
    ib_errors_per_s: float | None
    rdma_retries_per_s: float | None


@dataclass(frozen=True, slots=True)
class RankFigures:
    """One rank over a step window: where it ran, its step time and phases (milliseconds), and
    its slowdowns against the median rank. ``hardware_read``: the window's hardware evidence was
    looked up (``hardware`` is then the rank's, None when its node and GPU sent none)."""

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
    slowdown: float | None
    compute_slowdown: float | None
    hardware: RankHardware | None = None
    hardware_read: bool = False


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """An event a rank, an agent or the scheduler sent."""

    step: int | None
    time: float
    kind: str
    rank: int | None
    node: str | None
    gpu: int | None
    message: str
    attrs: dict[str, Any]  # the event's own JSON
    source: Literal["event"] = "event"


@dataclass(frozen=True, slots=True)
class MetricChangeItem:
    """A change found in a scalar series: an LR move, a schedule, a spike, a non-finite value;
    ``value`` and ``previous`` are "nan", "inf" or "-inf" when not finite."""

    step: int
    end_step: int | None
    time: float
    kind: str
    metric: str
    value: float | str
    previous: float | str
    message: str
    source: Literal["metric"] = "metric"


TimelineItem = TimelineEvent | MetricChangeItem
