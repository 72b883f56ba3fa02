"""What :class:`fleetlens.services.runs.RunQueries` answers of a run's ranks and timeline, as
typed values (snake_case; the API makes their JSON). None stands for "not measured"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["MetricChangeItem", "RankFigures", "RankHardware", "TimelineEvent", "TimelineItem"]


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
