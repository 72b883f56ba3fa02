"""The goodput read API: one run's breakdown, factors and advice; a pool's scheduling goodput."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from ..analysis.advisors import (
    ceiling_gains,
    chargeback_per_useful_hour,
    checkpoint_waste,
    cost_per_useful_hour,
    marginal_values,
    predicted_terms,
    runtime_model,
    what_if,
    young_daly,
)
from ..analysis.breakdown import Breakdown
from ..analysis.goodput import Factors
from ..services.contract import run_contract
from ..services.goodput import GoodputQueries, ProgramFigures, ProgramSpec, program_spec
from ..services.scheduler import run_scheduling_factor
from ..store.scope import Scope
from .auth import ERROR_RESPONSES, UNKNOWN_NAME_RESPONSE, require
from .fleet_models import FleetGoodputOut, PoolGoodputOut
from .goodput_models import (
    AdviceOut,
    BreakdownOut,
    CeilingGainOut,
    CheckpointAdviceOut,
    FactorsOut,
    ProgramOut,
    RunGoodputOut,
    RuntimeModelOut,
    RuntimeTermsOut,
    TimeWindowOut,
    WhatIfFactorsOut,
    WhatIfOut,
)
from .models import ContractOut
from .scheduler_models import scheduling_out

__all__ = ["WhatIfBody", "advice", "advice_model", "router", "runtime_terms"]

router = APIRouter(prefix="/v1", tags=["goodput"], responses=ERROR_RESPONSES)

Reader = Annotated[Scope, Depends(require("read"))]


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


FACTORS = ("scheduling", "runtime", "program")
Factor = Literal["scheduling", "runtime", "program"]
Term = Literal["startup", "data_stall", "checkpoint", "recovery", "preemption", "other"]


def runtime_terms(bd: Breakdown) -> RuntimeTermsOut:
    """Equation 4 measured on the timeline beside the owners' models fed by the same record."""
    measured = bd.measured_terms()
    model = runtime_model(bd)
    if model is None:
        return RuntimeTermsOut(measured=measured, predicted=None, residual=None, model=None)
    predicted = predicted_terms(model)
    residual = {k: measured[k] - v for k, v in predicted.items()}
    residual["total"] = sum(residual.values())
    return RuntimeTermsOut(
        measured=measured,
        predicted=predicted,
        residual=residual,
        model=RuntimeModelOut(
            held_seconds=model.held_s,
            startup_seconds=model.startup_s,
            data_stall_ratio=model.data_stall_ratio,
            checkpoint_write_seconds=model.checkpoint_write_s,
            checkpoint_interval_seconds=model.checkpoint_interval_s or 0.0,
            mtbf_seconds=_finite(model.mtbf_s),
            recovery_seconds=model.recovery_s,
            preemptions_per_second=model.preemptions_per_s,
            preemption_tax_seconds=model.preemption_tax_s,
        ),
    )


def _ceilings(text: str | None) -> dict[str, float]:
    """``program=0.65,runtime=0.98``; a factor not named has its ceiling at 1."""
    out = dict.fromkeys(FACTORS, 1.0)
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, _, value = part.partition("=")
        name = name.strip()
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if name not in out or not 0.0 < v <= 1.0:
            raise HTTPException(
                400,
                f"ceiling {part.strip()!r}: give FACTOR=VALUE with FACTOR one of "
                f"{', '.join(FACTORS)} and 0 < VALUE <= 1",
            )
        out[name] = v
    return out


def advice_model(
    bd: Breakdown, f: Factors, price: float | None, ceilings: dict[str, float] | None = None
) -> AdviceOut:
    """Young-Daly from the run's own checkpoint and interruption record, lever values, cost,
    and the MPG each lever reaches at its ceiling."""
    out = AdviceOut(marginal_values=marginal_values(f))
    if ceilings is not None:
        out.ceiling_gains = {
            k: CeilingGainOut(
                ceiling=v["ceiling"], mpg=_finite(v["mpg"]) or 0.0, gain=_finite(v["gain"])
            )
            for k, v in ceiling_gains(f, ceilings).items()
        }
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


def _window(from_: float | None, to: float | None) -> tuple[float, float] | None:
    if (from_ is None) != (to is None):
        raise HTTPException(400, "give both `from` and `to`, or neither (the whole run)")
    if from_ is not None and to is not None and from_ > to:
        raise HTTPException(400, f"from {from_} is after to {to}")
    return (from_, to) if from_ is not None and to is not None else None


def _measure(
    svc: Any,
    scope: Scope,
    run_id: str,
    window: tuple[float, float] | None,
    scheduling: float,
    accelerator: str | None,
    dtype: str | None,
) -> tuple[Breakdown, Factors, ProgramFigures, ProgramSpec]:
    """The run's breakdown and factors. An accelerator or dtype named in the request must be
    known (a 422 listing the known ones otherwise), and so must the config's accelerator that a
    requested dtype applies to; an unknown name in the stored config alone leaves MFU out and
    says why (``ProgramSpec.missing``)."""
    info = svc.metadata.get_run(scope, run_id)
    spec = program_spec(
        info.config or {},
        accelerator_name=accelerator,
        dtype=dtype,
        strict=accelerator is not None or dtype is not None,
    )
    bd, f, meta = GoodputQueries(svc.telemetry, scope).run_goodput(
        run_id, spec, window=window, scheduling=scheduling
    )
    return bd, f, meta, spec


_ACCELERATOR_Q = Query(
    max_length=200,
    description="overrides the run config's: a forgiving name ('h100', 'NVIDIA H100 80GB HBM3'); "
    "an unknown one is a 422 listing the known names",
)


@router.get(
    "/runs/{run_id}/goodput",
    summary="Where a run's time went, its goodput factors, equation 4 and ceiling gains",
    response_model=RunGoodputOut,
    response_model_exclude_unset=True,
    responses=UNKNOWN_NAME_RESPONSE,
)
async def get_run_goodput(
    request: Request,
    run_id: str,
    scope: Reader,
    from_: Annotated[float | None, Query(alias="from", ge=0, le=1e12, allow_inf_nan=False)] = None,
    to: Annotated[float | None, Query(ge=0, le=1e12, allow_inf_nan=False)] = None,
    scheduling: Annotated[float | None, Query(ge=0.0, le=1.0)] = None,
    price: Annotated[float | None, Query(gt=0, le=1e9, allow_inf_nan=False)] = None,
    accelerator: Annotated[str | None, _ACCELERATOR_Q] = None,
    dtype: Annotated[str | None, Query(max_length=40)] = None,
    ceilings: Annotated[
        str | None,
        Query(max_length=200, description="FACTOR=VALUE,...; a factor not named has ceiling 1"),
    ] = None,
) -> RunGoodputOut:
    svc = request.app.state.services
    window = _window(from_, to)
    caps = _ceilings(ceilings)

    def work() -> RunGoodputOut:
        info = svc.metadata.get_run(scope, run_id)  # 404 unless the caller may see it
        sched = run_scheduling_factor(svc.telemetry, scope, run_id, scheduling)
        bd, f, meta, spec = _measure(svc, scope, run_id, window, sched.factor, accelerator, dtype)
        is_mfu = meta.program_basis == "mfu_retained_steps"
        program = ProgramOut(
            devices=meta.devices,
            retained_flops=meta.retained_flops,
            program_basis=meta.program_basis,
            mfu=f.program if is_mfu else None,
            hfu=f.hfu,
            mbu=f.mbu,
            accelerator=spec.accelerator,
            dtype=spec.dtype,
            peak_flops_per_device=spec.peak_flops,
            missing=None if is_mfu else (spec.missing or "no retained steps"),
        )
        return RunGoodputOut(
            run_id=run_id,
            breakdown=BreakdownOut.of(bd),
            factors=FactorsOut.of(f),
            program=program,
            runtime_terms=runtime_terms(bd),
            advice=advice_model(bd, f, price, caps),
            scheduling=scheduling_out(sched),
            contract=ContractOut.of(run_contract(svc.metadata, svc.telemetry, scope, info)),
        )

    return await anyio.to_thread.run_sync(work)


class WhatIfBody(BaseModel):
    """A proposed change: each factor at most once, as a value after or as a ratio, or through
    the equation-4 terms it moves (which set the runtime factor)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    after: dict[Factor, Annotated[float, Field(gt=0.0, le=1.0)]] = Field(
        default_factory=dict, description="a factor's value after the change"
    )
    ratios: dict[Factor, Annotated[float, Field(gt=0.0, le=1e6, allow_inf_nan=False)]] = Field(
        default_factory=dict, description="a factor's after/before ratio"
    )
    terms: dict[Term, Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=dict,
        description="an equation-4 term's share of the (before) held time after the change",
    )
    scheduling: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="the pool's scheduling goodput (default: from the run's scheduler records, "
        "else 1)",
    )
    start: float | None = Field(None, alias="from", ge=0, le=1e12, allow_inf_nan=False)
    to: float | None = Field(None, ge=0, le=1e12, allow_inf_nan=False)
    accelerator: str | None = Field(None, max_length=200)
    dtype: str | None = Field(None, max_length=40)


def _factors_out(f: Factors) -> WhatIfFactorsOut:
    return WhatIfFactorsOut(
        scheduling=f.scheduling,
        runtime=f.runtime,
        program=f.program,
        job_product=f.job_product,
        mpg=f.mpg,
    )


def judge(bd: Breakdown, before: Factors, body: WhatIfBody) -> dict[str, Any]:
    """The change in ``body`` applied to the measured factors, judged by the product rule."""
    w = what_if(
        before,
        bd.measured_terms(),
        after={str(k): v for k, v in body.after.items()},
        ratios={str(k): v for k, v in body.ratios.items()},
        terms={str(k): float(v) for k, v in body.terms.items()},
    )
    return {**w, "before": _factors_out(before), "after": _factors_out(w["after"])}


@router.post(
    "/runs/{run_id}/whatif",
    summary="Judge a proposed change by the product of its ratios, against the run's factors",
    response_model=WhatIfOut,
    response_model_exclude_none=True,
    responses=UNKNOWN_NAME_RESPONSE,
    description="The baseline is the run's measured factors over the window (program goodput "
    "is MFU when the config gives FLOPs and an accelerator, else its straggler bound). A "
    "change improves the fleet only when the product of its after/before ratios exceeds 1 "
    "(seed 003 s9.9.1). Computes only; writes nothing.",
)
async def post_run_whatif(
    request: Request, run_id: str, body: WhatIfBody, scope: Reader
) -> WhatIfOut:
    svc = request.app.state.services
    window = _window(body.start, body.to)

    def work() -> WhatIfOut:
        bd, f, meta, _spec = _measure(
            svc,
            scope,
            run_id,
            window,
            run_scheduling_factor(svc.telemetry, scope, run_id, body.scheduling).factor,
            body.accelerator,
            body.dtype,
        )
        return WhatIfOut.model_validate(
            {
                "run_id": run_id,
                "window": TimeWindowOut.of(bd.t0, bd.t1),
                "program_basis": meta.program_basis,
                **judge(bd, f, body),
            }
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
