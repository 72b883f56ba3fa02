"""A run against its workload's fleet baseline: ``GET /v1/runs/{run_id}/regression``
(:mod:`fleetlens.services.regressions`)."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import Field

from ..analysis.regression import Verdict
from ..services.regressions import MIN_STEPS, RunRegression
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .models import ApiModel

__all__ = ["RegressionOut", "router"]

router = APIRouter(prefix="/v1", tags=["runs"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]


class FiguresOut(ApiModel):
    """What the run is judged on."""

    step_s: float | None = Field(description="median step time of its steps, seconds")
    startup_s: float | None = Field(description="newest attempt's job start to first step")
    steps: int
    software: dict[str, str] = Field(description="image, torch, CUDA, NCCL, driver... it ran")


class VerdictOut(ApiModel):
    tier: str = Field(description="program (step time) or startup")
    value: float
    baseline: float = Field(description="the baseline runs' median")
    bound: float = Field(description="over it the run is worse: tolerance and 3 MADs")
    ratio: float | None = Field(description="value over baseline; null on a baseline of 0")
    worse: bool
    runs: list[str] = Field(description="the baseline's runs, oldest first")
    software: dict[str, str] = Field(description="the baseline's software")
    changes: list[str] = Field(description="what differs from the baseline's software")

    @classmethod
    def of(cls, v: Verdict) -> VerdictOut:
        return cls(
            tier=v.tier,
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
    figures: FiguresOut | None = Field(description=f"null before {MIN_STEPS} steps")
    verdicts: list[VerdictOut] = Field(description="one per tier with a baseline of 2+ runs")

    @classmethod
    def of(cls, run_id: str, r: RunRegression) -> RegressionOut:
        f = r.run
        figures = None
        if f is not None:
            figures = FiguresOut(
                step_s=f.step_s, startup_s=f.startup_s, steps=f.steps, software=f.software
            )
        verdicts = [VerdictOut.of(v) for v in r.verdicts]
        return cls(run_id=run_id, workload=r.workload, figures=figures, verdicts=verdicts)


@router.get(
    "/runs/{run_id}/regression",
    summary="The run against its workload's fleet baseline (step time, startup)",
    description="The baseline is the earlier runs of the same workload (the config's model "
    "keys and the world size) on the software the run followed; `changes` names the versions "
    "that differ. A tier worse than its bound is also a `program_regression` or "
    "`startup_regression` finding.",
    response_model=RegressionOut,
)
async def get_regression(request: Request, run_id: str, scope: Reader) -> RegressionOut:
    svc = request.app.state.services
    regressions = svc.monitor.regressions
    if regressions is None:
        raise HTTPException(503, "regression checks are not running on this server")

    def work() -> RegressionOut:
        info = svc.metadata.get_run(scope, run_id)
        return RegressionOut.of(run_id, regressions.of(scope, info))

    return await anyio.to_thread.run_sync(work)
