"""The JSON of a run against its workload's fleet baseline (:mod:`fleetlens.api.regression`),
built from :mod:`fleetlens.services.regressions`'s values."""

from __future__ import annotations

from pydantic import Field

from ..analysis.regression import TIERS, Verdict
from ..services.regressions import MIN_STEPS, RunRegression
from .models import ApiModel

__all__ = ["FiguresOut", "RegressionOut", "VerdictOut"]


class FiguresOut(ApiModel):
    """What the run is judged on."""

    step_s: float | None = Field(description="median step time of its steps, seconds")
    startup_s: float | None = Field(description="newest attempt's job start to first step")
    steps: int
    software: dict[str, str] = Field(description="image, torch, CUDA, NCCL, driver... it ran")
    world_size: int
    mfu: float | None = Field(description="MFU of retained steps; null: no FLOPs or peak")
    gpu_rate: float | None = Field(description="tokens (else steps) a second per rank")
    gpu_s_per_token: float | None = Field(description="ranks over tokens a second")
    recovery_s: float | None = Field(description="median last step to next attempt's first")
    checkpoint_s: float | None = Field(description="median checkpoint commit pause")
    allocation_s: float | None = Field(description="first allocation's submit to gang complete")
    pool: str | None = Field(description="the scheduler pool of that allocation")


class VerdictOut(ApiModel):
    tier: str = Field(
        description="program (step time), mfu, token (GPU-seconds a token), scaling "
        "(canaries), startup, recovery, "
        "checkpoint or allocation"
    )
    higher_is_better: bool = Field(description="mfu and scaling: worse below the bound")
    value: float
    baseline: float = Field(description="the baseline runs' median")
    bound: float = Field(description="past it the run is worse: tolerance and 3 MADs")
    ratio: float | None = Field(description="value over baseline; null on a baseline of 0")
    worse: bool
    runs: list[str] = Field(
        description="the baseline's runs (allocation: scheduler jobs), oldest first"
    )
    software: dict[str, str] = Field(description="the baseline's software")
    changes: list[str] = Field(description="what differs from the baseline's software")

    @classmethod
    def of(cls, v: Verdict) -> VerdictOut:
        return cls(
            tier=v.tier,
            higher_is_better=TIERS[v.tier].higher_is_better,
            value=v.value,
            baseline=v.baseline,
            bound=v.bound,
            ratio=v.ratio,
            worse=v.worse,
            runs=v.runs,
            software=v.software,
            changes=v.changes,
        )


class RegressionOut(ApiModel):
    run_id: str
    workload: str | None = Field(description="null: the config names no model keys")
    architecture: str | None = Field(description="the workload at any scale")
    figures: FiguresOut | None = Field(description=f"null before {MIN_STEPS} steps")
    verdicts: list[VerdictOut] = Field(description="one per tier with a baseline of 2+ runs")

    @classmethod
    def of(cls, run_id: str, r: RunRegression) -> RegressionOut:
        f = r.run
        figures = None
        if f is not None:
            figures = FiguresOut(
                step_s=f.step_s,
                startup_s=f.startup_s,
                steps=f.steps,
                software=f.software,
                world_size=f.world_size,
                mfu=f.mfu,
                gpu_rate=f.gpu_rate,
                gpu_s_per_token=f.gpu_s_per_token,
                recovery_s=f.recovery_s,
                checkpoint_s=f.checkpoint_s,
                allocation_s=f.alloc_s,
                pool=f.pool,
            )
        verdicts = [VerdictOut.of(v) for v in r.verdicts]
        arch = f.architecture if f is not None else None
        return cls(
            run_id=run_id,
            workload=r.workload,
            architecture=arch,
            figures=figures,
            verdicts=verdicts,
        )
