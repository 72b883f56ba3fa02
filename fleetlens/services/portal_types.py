"""What :mod:`fleetlens.services.portal` and :mod:`fleetlens.services.portal_rank` answer for
the portal's pages, as typed values (snake_case; the API makes their JSON). None stands for "not
measured" (or not finite)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..analysis.breakdown import Breakdown
    from ..analysis.goodput import Factors
    from ..analysis.layout import ParallelLayout
    from ..store.metadata import RunInfo
    from .goodput import ProgramFigures
    from .portal_costs import Cost, RankedFinding
    from .runs_types import Completion, RunSummary, TimelineItem
    from .series import SeriesPoint

__all__ = [
    "GpuSample",
    "Heatmap",
    "HeatmapRows",
    "HotRow",
    "NodeEvent",
    "OverviewSteps",
    "OverviewWindow",
    "PhaseBucket",
    "Placement",
    "PortalEvent",
    "RecentSpread",
    "RunOverview",
    "StepBucket",
]


@dataclass(frozen=True, slots=True)
class StepBucket:
    """A bucket of steps: the job's step time (median, min, max of the slowest rank's), the
    slowest and the mean rank's compute (seconds), tokens and tokens/s; ``t``: its first
    start."""

    step: int
    steps: int
    t: float | None
    p50: float | None
    max: float | None
    min: float | None
    compute_max: float | None
    compute_mean: float | None
    tokens: int
    tokens_per_second: float | None


@dataclass(frozen=True, slots=True)
class RecentSpread:
    """Per-rank spread over a run's last steps: (slowest - mean compute) / mean."""

    steps: int
    compute_max_ms: float | None
    compute_mean_ms: float | None
    spread: float | None


@dataclass(frozen=True, slots=True)
class PortalEvent:
    """An event of a run (a fault, a drain, a restart) as the portal's pages list it."""

    time: float
    run_id: str
    job_id: str
    step: int | None
    rank: int | None
    kind: str
    node: str | None
    gpu: int | None
    message: str


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """An event on a node with its tenant, for infrastructure on-call: no rank or step."""

    time: float
    tenant: str
    run_id: str
    kind: str
    node: str
    gpu: int | None
    message: str


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a rank ran in one job attempt, from ``time`` on."""

    job_id: str
    node: str
    gpu: int
    time: float


@dataclass(frozen=True, slots=True)
class PhaseBucket:
    """A bucket of steps: one rank's mean phase timings and the mean rank's compute (seconds);
    ``t``: the bucket's first start."""

    step: int
    t: float | None
    forward: float | None
    backward: float | None
    optimizer: float | None
    compute: float | None
    comm: float | None
    data_wait: float | None
    duration: float | None
    compute_mean: float | None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """A bucket of time: a GPU's mean SM clock and its maximum (MHz), temperature (°C), power
    (W), framebuffer in use (MiB) and the largest Xid (0: none)."""

    t: float | None
    sm_clock: float | None
    sm_clock_max: float | None
    temp: float | None
    power: float | None
    fb_used: float | None
    xid: int


@dataclass(frozen=True, slots=True)
class HotRow:
    """The heatmap's row slowest against its columns' medians (ranks [rank_from, rank_to]),
    its median ratio and the slowest rank inside it."""

    row: int
    rank_from: int
    rank_to: int
    ratio: float | None
    rank: int | None


@dataclass(frozen=True, slots=True)
class Heatmap:
    """Rank buckets (``ranks_per_row`` ranks) x step buckets (``steps_per_column`` steps) of
    steps [from_step, to_step]: the maximum compute time (ms) per cell (None: no steps), the
    hot row, and per row the rank slowest in most of its cells (``row_rank``)."""

    from_step: int
    to_step: int
    ranks_per_row: int
    steps_per_column: int
    rows: int
    columns: int
    cells: list[list[float | None]]
    hot: HotRow | None
    row_rank: list[int]


@dataclass(frozen=True, slots=True)
class HeatmapRows:
    """The heatmap's rows: the rank each opens, and that rank's node and GPU (its latest
    placement; None where it has none)."""

    rank: list[int]
    node: list[str | None]
    gpu: list[int | None]


@dataclass(frozen=True, slots=True)
class OverviewWindow:
    """The steps the run page's series and timeline cover, and the run's whole range."""

    from_step: int
    to_step: int
    run_from_step: int
    run_to_step: int


@dataclass(frozen=True, slots=True)
class OverviewSteps:
    """What the run page draws of a run with steps: the series over ``window``, the whole run's
    goodput (``program``: :meth:`~fleetlens.services.goodput.GoodputQueries.run_goodput`'s
    program figures), the recent timeline, the findings by cost and when it will finish
    (:func:`~fleetlens.services.runs.completion`)."""

    window: OverviewWindow
    step_series: list[StepBucket]
    scalars: dict[str, list[SeriesPoint]]
    breakdown: Breakdown
    factors: Factors
    program: ProgramFigures
    timeline: list[TimelineItem]
    findings: list[RankedFinding]
    unattributed: Cost
    completion: Completion | None


@dataclass(frozen=True, slots=True)
class RunOverview:
    """The run page's first paint (:func:`~fleetlens.services.portal.run_overview`): the run,
    its summary (:func:`~fleetlens.services.runs.summarize`'s) and parallel layout, and the
    rest once it has steps."""

    info: RunInfo
    summary: RunSummary
    layout: ParallelLayout | None
    steps: OverviewSteps | None
