"""The goodput read API: one run's breakdown, factors and advice; a pool's scheduling goodput."""

from __future__ import annotations

import math
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request

from ..analysis.advisors import (
    chargeback_per_useful_hour,
    checkpoint_waste,
    cost_per_useful_hour,
    marginal_values,
    young_daly,
)
from ..analysis.breakdown import Breakdown
from ..analysis.goodput import Factors
from ..services.goodput import GoodputQueries, program_spec
from ..services.scheduler import scheduling_factor
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .models import (
    AdviceOut,
    BreakdownOut,
    CheckpointAdviceOut,
    FactorsOut,
    FleetGoodputOut,
    PoolGoodputOut,
    ProgramOut,
    RunGoodputOut,
    RunSchedulingOut,
)

__all__ = ["advice", "advice_model", "router"]

router = APIRouter(prefix="/v1", tags=["goodput"], responses=ERROR_RESPONSES)

Reader = Annotated[Scope, Depends(require("read"))]


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def advice_model(bd: Breakdown, f: Factors, price: float | None) -> AdviceOut:
    """Young-Daly from the run's own checkpoint and interruption record, lever values, cost."""
    out = AdviceOut(marginal_values=marginal_values(f))
    interruptions = sum(bd.interruptions.values())
    if bd.checkpoints and bd.seconds["checkpoint"] > 0 and interruptions:
        write = bd.seconds["checkpoint"] / bd.checkpoints
        mtbi = bd.held_s / interruptions
        current = bd.held_s / bd.checkpoints
        optimal, _ = young_daly(write, mtbi)
        out.checkpoint = CheckpointAdviceOut(
            write_seconds=write,
            mean_time_between_interruptions=mtbi,
            current_interval_seconds=current,
            optimal_interval_seconds=optimal,
            waste_at_current=checkpoint_waste(current, write, mtbi),
            waste_at_optimal=checkpoint_waste(optimal, write, mtbi),
        )
    if price is not None:
        out.cost_per_useful_hour = _finite(cost_per_useful_hour(price, f))
        out.chargeback_per_useful_hour = _finite(chargeback_per_useful_hour(price, f))
    return out


def advice(bd: Breakdown, f: Factors, price: float | None) -> dict[str, Any]:
    """:func:`advice_model` as the JSON-ready dict the portal's run document embeds."""
    return advice_model(bd, f, price).model_dump(by_alias=True, exclude_unset=True)


@router.get(
    "/runs/{run_id}/goodput",
    summary="Where a run's time went, and its goodput factors",
    response_model=RunGoodputOut,
    response_model_exclude_unset=True,
)
async def get_run_goodput(
    request: Request,
    run_id: str,
    scope: Reader,
    from_: Annotated[float | None, Query(alias="from", ge=0, le=1e12, allow_inf_nan=False)] = None,
    to: Annotated[float | None, Query(ge=0, le=1e12, allow_inf_nan=False)] = None,
    scheduling: Annotated[float | None, Query(ge=0.0, le=1.0)] = None,
    price: Annotated[float | None, Query(gt=0, le=1e9, allow_inf_nan=False)] = None,
) -> RunGoodputOut:
    svc = request.app.state.services
    if (from_ is None) != (to is None):
        raise HTTPException(400, "give both `from` and `to`, or neither (the whole run)")
    if from_ is not None and to is not None and from_ > to:
        raise HTTPException(400, f"from {from_} is after to {to}")

    def work() -> RunGoodputOut:
        info = svc.metadata.get_run(scope, run_id)
        window = (from_, to) if from_ is not None and to is not None else None
        sched = scheduling_factor(svc.telemetry, scope, run_id, scheduling)
        bd, f, meta = GoodputQueries(svc.telemetry, scope).run_goodput(
            run_id, program_spec(info.config or {}), window=window, scheduling=sched["factor"]
        )
        return RunGoodputOut(
            run_id=run_id,
            breakdown=BreakdownOut.of(bd),
            factors=FactorsOut.of(f),
            program=ProgramOut.model_validate(meta),
            advice=advice_model(bd, f, price),
            scheduling=RunSchedulingOut.model_validate(sched),
        )

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/fleet/goodput",
    summary="Scheduling goodput and queue waits of each pool",
    response_model=FleetGoodputOut,
    response_model_exclude_unset=True,
)
async def get_fleet_goodput(
    request: Request,
    scope: Reader,
    pool: str | None = None,
    from_: Annotated[float | None, Query(alias="from", ge=0, le=1e12, allow_inf_nan=False)] = None,
    to: Annotated[float | None, Query(ge=0, le=1e12, allow_inf_nan=False)] = None,
) -> FleetGoodputOut:
    svc = request.app.state.services

    def work() -> FleetGoodputOut:
        q = GoodputQueries(svc.telemetry, scope)
        pools = [pool] if pool else q.pools()
        out = []
        for p in pools:
            span = q.time_span(p)
            if span is None:
                continue
            lo = from_ if from_ is not None else span[0]
            hi = to if to is not None else span[1]
            if hi < lo:
                raise HTTPException(400, f"to {hi} is before from {lo}")
            out.append(PoolGoodputOut.of(p, q.pool_scheduling(p, lo, hi)))
        return FleetGoodputOut(pools=out)

    return await anyio.to_thread.run_sync(work)
