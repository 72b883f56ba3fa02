"""The JSON of the run page's documents (``/overview``, ``/heatmap``, ``/ranks/{rank}/detail``,
``/failure``) and the pieces the fleet pages share with them (alerts, remediation actions,
events), beside :mod:`fleetlens.api.models`, whose conventions these follow: camelCase on the
wire, unknown keys refused, a key a document leaves out in some answers has a default.

The overview and the heatmap are sent by :mod:`.portal_json` (msgspec), not through these
models: they document those answers, and the portal tests validate real answers with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from .alert_models import AlertOut
from .goodput_models import AdviceOut, BreakdownOut, FactorsOut, ProgramOut
from .models import (
    ApiModel,
    CompletionOut,
    FindingOut,
    LayoutOut,
    MfuOut,
    RankOut,
    RunOut,
    StepWindowOut,
    TimelineItem,
    attrs_doc,
)
from .remediation_models import ActionOut

if TYPE_CHECKING:
    from ..services.portal_costs import Cost, RankedFinding
    from ..services.portal_types import (
        GpuSample,
        Heatmap,
        HeatmapRows,
        PhaseBucket,
        Placement,
        PortalEvent,
        StepBucket,
    )
    from ..services.runs_types import RunSummary
    from ..services.series import SeriesPoint

__all__ = [
    "CauseOut",
    "FailurePageOut",
    "FindingCostOut",
    "FindingSinceOut",
    "GpuSampleOut",
    "HeatmapOut",
    "HeatmapRowsOut",
    "HotRowOut",
    "OverviewGoodputOut",
    "OverviewOut",
    "OverviewRunOut",
    "OverviewWindowOut",
    "PhaseBucketOut",
    "PlacementOut",
    "PortalEventOut",
    "RankDetailOut",
    "RankedFindingOut",
    "RunSummaryOut",
    "ScalarPointOut",
    "StepBucketOut",
]

Num = float | str | None
"""A chart value: a number, or ``"nan"``/``"inf"``/``"-inf"`` when not finite (a signal)."""


# ---- shared with the fleet pages ----------------------------------------------------------
class PortalEventOut(ApiModel):
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

    @classmethod
    def of(cls, e: PortalEvent) -> PortalEventOut:
        return cls(
            time=e.time,
            run_id=e.run_id,
            job_id=e.job_id,
            step=e.step,
            rank=e.rank,
            kind=e.kind,
            node=e.node,
            gpu=e.gpu,
            message=e.message,
        )


class StepBucketOut(ApiModel):
    """A bucket of steps: the job's step time (median, min, max of the slowest rank's), the
    slowest and the mean rank's compute, tokens and tokens/s (seconds; null: not finite)."""

    step: int = Field(description="the bucket's first step")
    steps: int
    t: float | None = Field(description="the bucket's first start (UNIX seconds)")
    p50: float | None
    max: float | None
    min: float | None
    compute_max: float | None
    compute_mean: float | None
    tokens: int
    tokens_per_second: float | None

    @classmethod
    def of(cls, b: StepBucket) -> StepBucketOut:
        return cls.model_validate(cls.doc(b))

    @staticmethod
    def doc(b: StepBucket) -> dict[str, Any]:
        """``b`` as the overview's JSON (sent by msgspec, not validated: the portal's speed)."""
        return {
            "step": b.step,
            "steps": b.steps,
            "t": b.t,
            "p50": b.p50,
            "max": b.max,
            "min": b.min,
            "computeMax": b.compute_max,
            "computeMean": b.compute_mean,
            "tokens": b.tokens,
            "tokensPerSecond": b.tokens_per_second,
        }


class ScalarPointOut(ApiModel):
    """A bucket of a scalar series: the lowest rank's first, min, max and mean value."""

    step: int
    value: Num
    min: Num
    max: Num
    mean: Num
    non_finite: int = Field(description="values that were not finite")

    @classmethod
    def of(cls, p: SeriesPoint) -> ScalarPointOut:
        return cls(
            step=p.step,
            value=p.value,
            min=p.min,
            max=p.max,
            mean=p.mean,
            non_finite=p.non_finite,
        )

    @staticmethod
    def doc(p: SeriesPoint) -> dict[str, Any]:
        """``p`` as the overview's JSON (sent by msgspec, not validated: the portal's speed)."""
        return {
            "step": p.step,
            "value": p.value,
            "min": p.min,
            "max": p.max,
            "mean": p.mean,
            "nonFinite": p.non_finite,
        }


# ---- /overview ----------------------------------------------------------------------------
class OverviewRunOut(RunOut):
    """The run as the runs list shows it, with its config."""

    config: dict[str, Any]


class RunSummaryOut(ApiModel):
    """Progress and speed over the recent steps (services.runs.summarize)."""

    steps: int
    step: int | None
    tokens_processed: int
    metrics: dict[str, float | None] = Field(
        description="each scalar's latest value, and stepTimeMs, meanRankStepTimeMs and "
        "tokensPerSecond over the window; null where not finite"
    )
    wall_seconds_per_step: float | None = Field(default=None, description="absent before steps")
    world_size: int | None = Field(default=None, description="absent before the first step")
    ranks_reporting: int | None = Field(default=None, description="absent before the first step")
    window: StepWindowOut | None = Field(default=None, description="absent before the first step")

    @classmethod
    def of(cls, s: RunSummary) -> RunSummaryOut:
        return cls.model_validate(cls.doc(s))

    @staticmethod
    def doc(s: RunSummary) -> dict[str, Any]:
        """A run summary as JSON (:class:`RunDetailOut`'s summary keys; the overview's
        ``summary``): before the first step only its counts and empty ``metrics``; ``metrics`` are
        the scalars' latest values with the window's stepTimeMs, meanRankStepTimeMs and
        tokensPerSecond; ``ranksReporting`` where the world size is the job's declared one."""
        out: dict[str, Any] = {
            "steps": s.steps,
            "step": s.step,
            "tokensProcessed": s.tokens_processed,
        }
        w = s.window
        if w is None:
            out["metrics"] = {}
            return out
        out["wallSecondsPerStep"] = s.wall_seconds_per_step
        out["worldSize"] = s.world_size
        out["window"] = {"fromStep": w.from_step, "toStep": w.to_step, "steps": w.steps}
        out["metrics"] = {
            **s.scalars,
            "stepTimeMs": s.step_time_ms,
            "meanRankStepTimeMs": s.mean_rank_step_time_ms,
            "tokensPerSecond": s.tokens_per_second,
        }
        if s.ranks_reporting is not None:
            out["ranksReporting"] = s.ranks_reporting
        return out


class OverviewWindowOut(ApiModel):
    """The steps the series and the timeline cover, and the run's whole range."""

    from_step: int
    to_step: int
    run_from_step: int
    run_to_step: int


class FindingCostOut(ApiModel):
    """What a finding (or what no finding explains) cost of the goodput breakdown's loss lines."""

    seconds: dict[str, float] = Field(description="per loss line")
    total_seconds: float
    gpu_hours: float
    goodput_points: float

    @staticmethod
    def doc(c: Cost) -> dict[str, Any]:
        """``c`` as the overview's JSON (sent by msgspec, not validated: the portal's speed)."""
        return {
            "seconds": c.seconds,
            "totalSeconds": c.total_seconds,
            "gpuHours": c.gpu_hours,
            "goodputPoints": c.goodput_points,
        }


class FindingSinceOut(ApiModel):
    step: int
    time: float | None = Field(description="when the step first started (UNIX seconds)")


class RankedFindingOut(FindingOut):
    """A finding with what it cost, most costly first, and the action recommended."""

    cost: FindingCostOut
    since: FindingSinceOut
    rank: int = Field(description="1: the most costly")
    action: str

    @staticmethod
    def doc(r: RankedFinding, finding: dict[str, Any], action: str) -> dict[str, Any]:
        """``finding`` (the finding's JSON, :class:`FindingOut`'s) with ``r``'s cost, since
        and rank and ``action``, as the overview's JSON (sent by msgspec, not validated)."""
        finding["cost"] = FindingCostOut.doc(r.cost)
        finding["since"] = {"step": r.since_step, "time": r.since_time}
        finding["rank"] = r.rank
        finding["action"] = action
        return finding


class OverviewGoodputOut(ApiModel):
    breakdown: BreakdownOut
    factors: FactorsOut
    program: ProgramOut
    advice: AdviceOut
    unattributed: FindingCostOut = Field(description="the losses no finding explains")


class OverviewOut(ApiModel):
    """What the run page draws on first paint; the keys from ``window`` on are absent before
    the run's first step."""

    run: OverviewRunOut
    generated_at: float
    summary: RunSummaryOut
    layout: LayoutOut | None
    mfu: MfuOut
    window: OverviewWindowOut | None = None
    step_series: list[StepBucketOut] | None = None
    scalars: dict[str, list[ScalarPointOut]] | None = None
    goodput: OverviewGoodputOut | None = None
    timeline: list[TimelineItem] | None = None
    findings: list[RankedFindingOut] | None = None
    alerts: list[AlertOut] | None = None
    remediations: list[ActionOut] | None = None
    completion: CompletionOut | None = None


# ---- /heatmap -----------------------------------------------------------------------------
class HotRowOut(ApiModel):
    """The row slowest against its columns' medians, and its slowest rank."""

    row: int
    rank_from: int
    rank_to: int
    ratio: float | None
    rank: int | None


class HeatmapRowsOut(ApiModel):
    """Per row, the rank its click opens and where that rank ran last."""

    rank: list[int]
    node: list[str | None]
    gpu: list[int | None]

    @staticmethod
    def doc(r: HeatmapRows) -> dict[str, Any]:
        """``r`` as the heatmap's JSON (sent by msgspec, not validated: the portal's speed)."""
        return {"rank": r.rank, "node": r.node, "gpu": r.gpu}


class HeatmapOut(ApiModel):
    """Rank buckets x step buckets of the maximum compute time per cell (ms); only ``runId``,
    ``cells`` and ``hot`` before the run's first step."""

    run_id: str
    cells: list[list[float | None]]
    hot: HotRowOut | None
    from_step: int | None = None
    to_step: int | None = None
    ranks_per_row: int | None = None
    steps_per_column: int | None = None
    rows: int | None = None
    columns: int | None = None
    unit: Literal["ms"] | None = None
    signal: Literal["compute"] | None = None
    row_ranks: HeatmapRowsOut | None = None
    slowest_ranks: list[RankOut] | None = Field(default=None, description="with ?slowest=N")

    @staticmethod
    def doc(run_id: str, h: Heatmap) -> dict[str, Any]:
        """``h`` as the heatmap's JSON up to its ``rowRanks`` (sent by msgspec, not validated:
        the portal's speed)."""
        hot = h.hot
        return {
            "runId": run_id,
            "fromStep": h.from_step,
            "toStep": h.to_step,
            "ranksPerRow": h.ranks_per_row,
            "stepsPerColumn": h.steps_per_column,
            "rows": h.rows,
            "columns": h.columns,
            "unit": "ms",
            "signal": "compute",
            "cells": h.cells,
            "hot": None if hot is None else attrs_doc(HotRowOut, hot),
        }


# ---- /ranks/{rank}/detail -----------------------------------------------------------------
class PhaseBucketOut(ApiModel):
    """A bucket of steps: the rank's mean phase timings and the mean rank's compute (seconds)."""

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

    @classmethod
    def of(cls, b: PhaseBucket) -> PhaseBucketOut:
        return cls(
            step=b.step,
            t=b.t,
            forward=b.forward,
            backward=b.backward,
            optimizer=b.optimizer,
            compute=b.compute,
            comm=b.comm,
            data_wait=b.data_wait,
            duration=b.duration,
            compute_mean=b.compute_mean,
        )


class GpuSampleOut(ApiModel):
    """A bucket of time: the GPU's DCGM samples (MHz, °C, W, MiB) and its largest Xid."""

    t: float | None
    sm_clock: float | None
    sm_clock_max: float | None
    temp: float | None
    power: float | None
    fb_used: float | None
    xid: int

    @classmethod
    def of(cls, g: GpuSample) -> GpuSampleOut:
        return cls(
            t=g.t,
            sm_clock=g.sm_clock,
            sm_clock_max=g.sm_clock_max,
            temp=g.temp,
            power=g.power,
            fb_used=g.fb_used,
            xid=g.xid,
        )


class PlacementOut(ApiModel):
    """Where the rank ran in one job attempt, and its GPU's samples while it ran there."""

    job_id: str
    node: str
    gpu: int
    time: float
    samples: list[GpuSampleOut]

    @classmethod
    def of(cls, p: Placement, samples: list[GpuSample]) -> PlacementOut:
        return cls(
            job_id=p.job_id,
            node=p.node,
            gpu=p.gpu,
            time=p.time,
            samples=[GpuSampleOut.of(g) for g in samples],
        )


class RankDetailOut(ApiModel):
    """One rank: its phases over steps and its GPU's samples per placement."""

    run_id: str
    rank: int
    phases: list[PhaseBucketOut]
    placements: list[PlacementOut]
    layout: LayoutOut | None = Field(default=None, description="absent without a layout")
    coords: dict[str, int] | None = Field(
        default=None, description="pp, dp, cp, tp coordinate; absent without a layout"
    )
    from_step: int | None = Field(default=None, description="absent before the first step")
    to_step: int | None = None


# ---- /failure -----------------------------------------------------------------------------
class CauseOut(ApiModel):
    """The likely cause: the top finding (a failure first, then the most confident)."""

    diagnosis: str
    owner: str
    confidence: float
    summary: str
    evidence: list[dict[str, Any]]
    recommendation: str


class FailurePageOut(ApiModel):
    """A failed or degraded run; the keys from ``training`` on are absent without steps."""

    run: RunOut
    failure: PortalEventOut | None = Field(description="the newest failure event, if any")
    cause: CauseOut | None
    findings: list[FindingOut]
    training: dict[str, list[ScalarPointOut]] | None = Field(
        default=None, description="loss, lr, grad_norm before the failing step"
    )
    step_time: list[StepBucketOut] | None = None
    infrastructure: list[RankOut] | None = Field(
        default=None, description="the failing rank and the slow ranks beside it"
    )
    related: list[TimelineItem] | None = None
    at_step: int | None = None
