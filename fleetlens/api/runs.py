"""The run read API: list runs, one run's summary, its ranks over a window, its timeline."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request

from ..store.metadata import RunInfo
from ..store.run_queries import RunQueries
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["runs"], responses=ERROR_RESPONSES)

Reader = Annotated[Scope, Depends(require("read"))]


def _services(request: Request) -> Any:
    return request.app.state.services


def _run_json(info: RunInfo) -> dict[str, Any]:
    d = asdict(info)
    return {
        "runId": d["run_id"],
        "project": d["project"],
        "experimentId": d["experiment_id"],
        "status": d["status"],
        "firstSeen": d["first_seen"],
        "lastSeen": d["last_seen"],
        "lastStep": d["last_step"],
        "worldSize": d["world_size"],
        "jobs": d["jobs"],
    }


@router.get("/runs", summary="List runs, most recently active first")
async def list_runs(
    request: Request,
    scope: Reader,
    project: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    svc = _services(request)
    runs = await anyio.to_thread.run_sync(
        lambda: svc.metadata.list_runs(scope, project, limit, offset)
    )
    return {"runs": [_run_json(r) for r in runs], "limit": limit, "offset": offset}


@router.get("/runs/{run_id}", summary="One run: status, progress, speed and latest metrics")
async def get_run(request: Request, run_id: str, scope: Reader) -> dict[str, Any]:
    svc = _services(request)

    def work() -> dict[str, Any]:
        info = svc.metadata.get_run(scope, run_id)
        summary = RunQueries(svc.telemetry, scope).summary(run_id)
        out = _run_json(info)
        out["config"] = info.config
        out["jobIds"] = [j["jobId"] for j in svc.metadata.jobs(scope, run_id)]
        out.update(summary)
        if summary.get("worldSize"):
            out["worldSize"] = summary["worldSize"]
        return out

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/runs/{run_id}/ranks",
    summary="Per-rank step timing over a step window",
    description="In a synchronous job every rank's step lasts as long as the slowest's; the "
    "slow rank shows as the longest compute and the shortest wait (comm). Sort by compute "
    "(default) to find it.",
)
async def get_ranks(
    request: Request,
    run_id: str,
    scope: Reader,
    sort: Literal["compute", "step_time", "max_step_time", "data_wait", "comm", "rank"] = "compute",
    order: Literal["asc", "desc"] = "desc",
    from_step: Annotated[int | None, Query(alias="fromStep", ge=0)] = None,
    to_step: Annotated[int | None, Query(alias="toStep", ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 100,
) -> dict[str, Any]:
    svc = _services(request)
    if from_step is not None and to_step is not None and from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")

    def work() -> dict[str, Any]:
        svc.metadata.get_run(scope, run_id)
        q = RunQueries(svc.telemetry, scope)
        window = q.step_window(run_id, from_step, to_step)
        if window is None:
            return {"runId": run_id, "fromStep": None, "toStep": None, "ranks": []}
        ranks = q.ranks(run_id, window[0], window[1], sort, order == "desc", limit)
        return {
            "runId": run_id,
            "fromStep": window[0],
            "toStep": window[1],
            "sort": sort,
            "order": order,
            "ranks": ranks,
        }

    return await anyio.to_thread.run_sync(work)


@router.get("/runs/{run_id}/timeline", summary="Events and metric changes in a step window")
async def get_timeline(
    request: Request,
    run_id: str,
    scope: Reader,
    from_step: Annotated[int | None, Query(alias="fromStep", ge=0)] = None,
    to_step: Annotated[int | None, Query(alias="toStep", ge=0)] = None,
) -> dict[str, Any]:
    svc = _services(request)
    if from_step is not None and to_step is not None and from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")

    def work() -> dict[str, Any]:
        svc.metadata.get_run(scope, run_id)
        q = RunQueries(svc.telemetry, scope)
        window = q.step_window(run_id, from_step, to_step, default=1_000)
        if window is None:
            return {"runId": run_id, "fromStep": from_step, "toStep": to_step, "items": []}
        return {
            "runId": run_id,
            "fromStep": window[0],
            "toStep": window[1],
            "items": q.timeline(run_id, window[0], window[1]),
        }

    return await anyio.to_thread.run_sync(work)
