"""The run read API: list runs, one run's summary, its ranks over a window, its timeline.

The JSON of each route is its ``response_model`` (:mod:`fleetlens.api.models`), built here from
the services' results."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request

from ..analysis.layout import layout_of
from ..errors import ConfigError
from ..services.contract import run_contract
from ..services.frontier import frontier
from ..services.goodput import summary_mfu
from ..services.runs import MAX_TIMELINE_STEPS, RunQueries, completion, declared_world
from ..services.runs_types import RunSummary
from ..store.metadata import RunInfo
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .models import (
    CompletionOut,
    ContractOut,
    FrontierOut,
    FrontierRunOut,
    MfuOut,
    RankOut,
    RankSort,
    RanksOut,
    RunDetailOut,
    RunListOut,
    RunOut,
    TimelineOut,
    timeline_out,
)
from .portal_models import RunSummaryOut

__all__ = ["router", "run_json", "summary_mfu_out"]

router = APIRouter(prefix="/v1", tags=["runs"], responses=ERROR_RESPONSES)

Reader = Annotated[Scope, Depends(require("read"))]


def _services(request: Request) -> Any:
    return request.app.state.services


def run_json(info: RunInfo) -> dict[str, Any]:
    """A run as the runs list shows it, as a JSON-ready dict (the portal's documents embed it)."""
    return RunOut.from_info(info).model_dump(by_alias=True)


def summary_mfu_out(config: dict[str, Any], summary: RunSummary) -> MfuOut:
    """MFU over the summary's window (tokens/s or step time), or why there is none."""
    value, spec = summary_mfu(config, summary)
    missing = spec.missing
    if value is None and missing is None:
        missing = "no steps with tokens or step time yet"
    devices = spec.devices or summary.world_size or None
    return MfuOut(
        value=value,
        hfu=value * spec.hardware_ratio if value is not None and spec.hardware_ratio else None,
        accelerator=spec.accelerator,
        dtype=spec.dtype,
        peak_flops_per_device=spec.peak_flops,
        devices=int(devices) if devices else None,
        flops_per_token=spec.flops_per_token,
        flops_per_step=spec.flops_per_step,
        missing=missing,
    )


@router.get(
    "/runs",
    summary="List runs, most recently active first",
    response_model=RunListOut,
    response_model_exclude_unset=True,
)
async def list_runs(
    request: Request,
    scope: Reader,
    project: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> RunListOut:
    svc = _services(request)
    runs = await anyio.to_thread.run_sync(
        lambda: svc.metadata.list_runs(scope, project, limit, offset)
    )
    return RunListOut(runs=[RunOut.from_info(r) for r in runs], limit=limit, offset=offset)


@router.get(
    "/runs/{run_id}",
    summary="One run: status, progress, speed and latest metrics",
    response_model=RunDetailOut,
    response_model_exclude_unset=True,
)
async def get_run(request: Request, run_id: str, scope: Reader) -> RunDetailOut:
    svc = _services(request)

    def work() -> RunDetailOut:
        info = svc.metadata.get_run(scope, run_id)
        jobs = svc.metadata.jobs(scope, run_id)
        job_ids = [j.job_id for j in jobs]
        # the metadata's world size before any step
        summary = declared_world(RunQueries(svc.telemetry, scope).summary(run_id), jobs)
        mfu = summary_mfu_out(info.config or {}, summary)
        eta = completion(info.config or {}, summary, info.status)
        lay = layout_of(info.config or {}, int(summary.world_size or info.world_size or 0))
        contract = ContractOut.of(run_contract(svc.metadata, svc.telemetry, scope, info))
        return RunDetailOut.model_validate(
            {
                **run_json(info),
                "config": info.config,
                "jobIds": job_ids,
                **RunSummaryOut.doc(summary),
                "mfu": mfu,
                "completion": None if eta is None else CompletionOut.of(eta),
                "contract": contract,
                "layout": lay.to_json() if lay else None,
            }
        )

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/runs/{run_id}/ranks",
    summary="Per-rank step timing over a step window",
    response_model=RanksOut,
    response_model_exclude_unset=True,
    description="In a synchronous job every rank's step lasts as long as the slowest's; the "
    "slow rank shows as the longest compute and the shortest wait (comm). Sort by compute "
    "(default) to find it.",
)
async def get_ranks(
    request: Request,
    run_id: str,
    scope: Reader,
    sort: RankSort = "compute",
    order: Literal["asc", "desc"] = "desc",
    from_step: Annotated[int | None, Query(alias="fromStep", ge=0, le=2**62)] = None,
    to_step: Annotated[int | None, Query(alias="toStep", ge=0, le=2**62)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 100,
) -> RanksOut:
    svc = _services(request)
    if from_step is not None and to_step is not None and from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")

    def work() -> RanksOut:
        svc.metadata.get_run(scope, run_id)
        q = RunQueries(svc.telemetry, scope)
        window = q.step_window(run_id, from_step, to_step)
        if window is None:
            return RanksOut(run_id=run_id, from_step=None, to_step=None, ranks=[])
        ranks = q.ranks(run_id, window[0], window[1], sort, order == "desc", limit)
        return RanksOut(
            run_id=run_id,
            from_step=window[0],
            to_step=window[1],
            sort=sort,
            order=order,
            ranks=[RankOut.of(r) for r in ranks],
        )

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/runs/{run_id}/timeline",
    summary="Events and metric changes in a step window",
    response_model=TimelineOut,
    response_model_exclude_unset=True,
)
async def get_timeline(
    request: Request,
    run_id: str,
    scope: Reader,
    from_step: Annotated[int | None, Query(alias="fromStep", ge=0, le=2**62)] = None,
    to_step: Annotated[int | None, Query(alias="toStep", ge=0, le=2**62)] = None,
) -> TimelineOut:
    svc = _services(request)
    if from_step is not None and to_step is not None and from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")

    def work() -> TimelineOut:
        svc.metadata.get_run(scope, run_id)
        q = RunQueries(svc.telemetry, scope)
        window = q.step_window(run_id, from_step, to_step, default=1_000)
        if window is None:
            return TimelineOut(run_id=run_id, from_step=from_step, to_step=to_step, items=[])
        if window[1] - window[0] >= MAX_TIMELINE_STEPS:  # the caller's range, not the store
            raise ConfigError(
                f"fromStep {window[0]} to toStep {window[1]} is over {MAX_TIMELINE_STEPS} "
                "steps; ask for a shorter window"
            )
        return TimelineOut(
            run_id=run_id,
            from_step=window[0],
            to_step=window[1],
            items=[timeline_out(i) for i in q.timeline(run_id, window[0], window[1])],
        )

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/projects/{project}/frontier",
    summary="Time to result across a project's runs, and their efficiency frontier",
    response_model=FrontierOut,
    description="Each run's wall-clock time from its first record to a fixed target (a step: "
    "targetSteps, else the runs' most common config target; or a quality: targetLoss, the first "
    "logged loss at or under it), its GPU-hours to get there, and whether it is on the "
    "frontier: no other run reached the target both sooner and for fewer GPU-hours. A running "
    "run short of a step target is estimated at its recent pace; a loss target is never "
    "extrapolated.",
)
async def get_frontier(
    request: Request,
    project: str,
    scope: Reader,
    target_steps: Annotated[int | None, Query(alias="targetSteps", ge=1)] = None,
    target_loss: Annotated[float | None, Query(alias="targetLoss")] = None,
) -> FrontierOut:
    if target_steps is not None and target_loss is not None:
        raise HTTPException(400, "give targetSteps or targetLoss, not both")
    svc = _services(request)

    def work() -> FrontierOut:
        f = frontier(svc.metadata, svc.telemetry, scope, project, target_steps, target_loss)
        return FrontierOut(
            project=f.project,
            target_steps=f.target_steps,
            target_loss=f.target_loss,
            runs=[
                FrontierRunOut(
                    run_id=r.run_id,
                    status=r.status,
                    devices=r.devices,
                    started=r.started,
                    reached_at=r.reached_at,
                    reached_step=r.reached_step,
                    estimated=r.estimated,
                    seconds=r.seconds,
                    gpu_hours=r.gpu_hours,
                    on_frontier=r.on_frontier,
                )
                for r in f.runs
            ],
        )

    return await anyio.to_thread.run_sync(work)
