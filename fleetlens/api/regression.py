"""A run against its workload's fleet baseline: ``GET /v1/runs/{run_id}/regression``
(:mod:`fleetlens.services.regressions`)."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, HTTPException, Request

from ..store.scope import Scope
from .auth import ERROR_RESPONSES, require
from .regression_models import RegressionOut

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["runs"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]


@router.get(
    "/runs/{run_id}/regression",
    summary="The run against the fleet's baselines: step time, MFU, scaling, startup, "
    "recovery, checkpoints, allocation",
    description="The baseline of each tier is the earlier runs of the same workload (the "
    "config's model keys and the world size; MFU and GPU-seconds a token: of the architecture at "
    "a like scale, within 1.5x) on the "
    "software the run followed; `scaling` is the run's throughput per GPU over its software's "
    "smallest runs' against the same ratio on the software it replaced (small-scale canaries); "
    "`allocation` is against its pool's earlier allocations of a like size. `changes` names "
    "the versions that differ. A tier worse than its bound is also a `<tier>_regression` "
    "finding.",
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
