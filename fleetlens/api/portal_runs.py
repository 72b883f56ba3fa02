"""The runs list's document for triage: each run with its goodput (as its run page has it), step
time, findings, firing alerts and duration, searched, filtered, sorted and paged on the server.

Everything but goodput comes from three reads for all the runs at once (the metadata store's runs,
one aggregate over the ``steps_by_step`` rollup, the findings and alerts by run); goodput is the
run page's computation, run by run, so it is worked out for the page shown, or, when the list is
sorted by it, for the first ``GOODPUT_SORT_MAX`` matching runs (most recently active first), which
the answer then says (``sortedWithin``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Query, Request

from ..services.compare import CompareQueries
from ..services.compare_types import RunSpeed
from ..services.goodput import GoodputQueries, program_spec
from ..store.findings import FindingsStore
from .auth import ERROR_RESPONSES
from .portal import Reader
from .portal_fleet_models import PortalRunSort, PortalRunsOut
from .runs import run_json

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["portal"], responses=ERROR_RESPONSES)

RUNS_MAX = 1000  # the most recently active runs a list is drawn from
GOODPUT_SORT_MAX = 200
Sort = PortalRunSort


_FIELD = {"stepTime": "stepTimeMs", "findings": "findingsCount", "alerts": "alertsFiring",
          "duration": "durationSeconds"}  # fmt: skip


def _key(row: dict[str, Any], sort: str) -> tuple[bool, Any]:
    v = row.get(_FIELD.get(sort, sort))
    return (v is None, v)  # unknowns last, whichever the order


@router.get(
    "/portal/runs",
    summary="Runs for triage: goodput, step time, findings, alerts, duration",
    response_model=PortalRunsOut,
)
async def runs_list(
    request: Request,
    scope: Reader,
    q: Annotated[str, Query(max_length=256, description="part of the run id or project")] = "",
    status: Annotated[
        str,
        Query(
            max_length=64,
            description="comma-separated: RUNNING,HUNG,STALLED,FINISHED,FAILED,STOPPED,RECORDED",
        ),
    ] = "",
    sort: Sort = "lastSeen",
    order: Literal["asc", "desc"] = "desc",
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=RUNS_MAX)] = 0,
) -> dict[str, Any]:
    svc = request.app.state.services
    wanted = {s.strip().upper() for s in status.split(",") if s.strip()}
    needle = q.strip().lower()

    def work() -> dict[str, Any]:
        runs = [
            r
            for r in svc.metadata.list_runs(scope, None, RUNS_MAX, 0)
            if (not wanted or r.status in wanted)
            and (not needle or needle in r.run_id.lower() or needle in r.project.lower())
        ]
        ids = [r.run_id for r in runs]
        speed = CompareQueries(svc.telemetry, scope).speed(ids) if ids else {}
        findings = FindingsStore(svc.metadata).diagnoses(scope, ids)
        alerts: dict[str, int] = {}
        for a in svc.alert_store.list(scope, "firing", None, 10_000):
            alerts[a.run_id] = alerts.get(a.run_id, 0) + 1
        rows = []
        for r in runs:
            sp = speed.get(r.run_id) or RunSpeed()
            median = sp.median_step_s
            rows.append(
                {
                    **run_json(r),
                    "goodput": None,
                    "stepTimeMs": None if median is None else median * 1000.0,
                    "tokensPerSecond": sp.tokens_per_s,
                    "findings": findings.get(r.run_id, {}),
                    "findingsCount": sum(findings.get(r.run_id, {}).values()),
                    "alertsFiring": alerts.get(r.run_id, 0),
                    "durationSeconds": max(0.0, r.last_seen - r.first_seen),
                    "_config": r.config or {},
                }
            )
        gq = GoodputQueries(svc.telemetry, scope)

        def fill_goodput(some: list[dict[str, Any]]) -> None:
            for row in some:
                if row["goodput"] is None and row["lastStep"] is not None:
                    _, f, _ = gq.run_goodput(row["runId"], program_spec(row["_config"]))
                    row["goodput"] = f.job_product

        within = None
        if sort == "goodput":
            within = min(len(rows), GOODPUT_SORT_MAX)
            fill_goodput(rows[:within])
            rows = rows[:within]
        rows.sort(key=lambda row: _key(row, sort), reverse=order == "desc")
        if order == "desc":  # unknowns last in both orders
            rows.sort(key=lambda row: _key(row, sort)[0])
        page = rows[offset : offset + limit]
        fill_goodput(page)
        for row in page:
            del row["_config"]
        return {
            "runs": page,
            "total": len(rows),
            "offset": offset,
            "limit": limit,
            "sort": sort,
            "order": order,
            "sortedWithin": within,
        }

    return await anyio.to_thread.run_sync(work)
