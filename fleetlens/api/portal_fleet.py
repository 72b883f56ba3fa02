"""The fleet-wide pages' JSON: on-call (degraded jobs, implicated nodes, drains, alerts and
remediation actions; for the ``oncall`` role every tenant's nodes and nothing of their runs) and
capacity (utilization against goodput, losses by cause, cost)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Query, Request

from ..alerts.silences import SilenceStore
from ..alerts.store import AlertView, queue_order
from ..errors import NotFound
from ..lifecycle import LIVE
from ..services.capacity import FleetSeries, JobTally, held, pool_runs
from ..services.goodput import GoodputQueries, program_spec
from ..services.portal import PortalQueries
from ..store.findings import FindingsStore
from ..store.scope import Scope
from .alert_models import AlertOut, IncidentDetailOut, SilenceOut
from .auth import ERROR_RESPONSES, require_any
from .fleet_models import PoolGoodputOut
from .portal import DRAIN_KINDS, FAULT_KINDS, NODE_FAULTS, PENDING_STATES, Reader, _pending
from .portal_fleet_models import (
    CapacityBucketOut,
    CapacityJobsOut,
    NodeEventOut,
    OnCallOut,
    PortalCapacityOut,
    RunSpreadOut,
)
from .portal_models import PortalEventOut
from .runs import run_json

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["portal"], responses=ERROR_RESPONSES)
# Infrastructure on-call (read:infra) gets the on-call page's infrastructure view, every tenant's.
OnCallReader = Annotated[Scope, Depends(require_any("read", "read:infra"))]


@router.get(
    "/portal/oncall",
    summary="Degraded jobs, implicated nodes, drains, alerts; for on-call, every tenant's nodes",
    response_model=OnCallOut,
    response_model_exclude_unset=True,
)
async def oncall(
    request: Request,
    scope: OnCallReader,
    window_s: Annotated[
        float, Query(alias="windowSeconds", gt=0, le=1e9, allow_inf_nan=False)
    ] = 86_400.0,
) -> dict[str, Any]:
    """``view`` says which document it is. ``tenant`` (roles that read): the tenant's jobs by
    goodput with their per-rank spread, its nodes with faults, drains and firing alerts.
    ``infra`` (role oncall, ``read:infra``): the nodes, drains, remediation actions and
    infrastructure alerts of every tenant, each with its tenant, and nothing of the runs but
    their ids: no jobs, goodput, spread or configs."""
    svc = request.app.state.services
    view = _infra_oncall if scope.cross_tenant_infra else _tenant_oncall
    return await anyio.to_thread.run_sync(view, svc, scope, window_s)


"""Statuses of a job that is still running (or hung): the on-call page lists only these."""


def _alert_nodes(
    nodes: dict[str, dict[str, Any]], alerts: list[dict[str, Any]], placed: dict[str, list[str]]
) -> None:
    """Add to ``nodes`` the nodes named by firing hardware alerts (a node whose fault raised an
    alert is listed even when no fault event of the window names it), and to every node the live
    jobs placed on it (``jobs``, from ``placed``: node -> live runs), the jobs it is hurting."""
    for a in alerts:
        severity = NODE_FAULTS.get(a["alertname"])
        node = a["labels"].get("node")
        if severity is None or not node:
            continue
        n = nodes.get(node)
        if n is None:
            n = nodes[node] = {
                "node": node,
                "fatal": 0,
                "recoverable": 0,
                "events": [],
                "fromAlerts": True,
            }
        if n.get("fromAlerts"):  # else its fault events have counted it already
            n[severity] += 1
            if len(n["events"]) < 5:
                n["events"].append(
                    {
                        "time": a["startsAt"],
                        "kind": a["alertname"],
                        "message": a["annotations"].get("summary", ""),
                    }
                )
    for n in nodes.values():
        n["jobs"] = placed.get(n["node"], [])


def _tenant_oncall(svc: Any, scope: Scope, window_s: float) -> dict[str, Any]:
    now = time.time()
    runs = [r for r in svc.metadata.list_runs(scope, None, 200, 0) if r.status in LIVE][:50]
    live = {r.run_id for r in runs}
    threshold = svc.monitor.policy.rule("GoodputLow").threshold or 0.8
    gq = GoodputQueries(svc.telemetry, scope)
    pq = PortalQueries(svc.telemetry, scope)
    jobs = []
    since = now - window_s
    for r in runs:
        _bd, f, _ = gq.run_goodput(r.run_id, program_spec(r.config or {}))
        spread = pq.recent_spread(r.run_id)
        jobs.append(
            {
                **run_json(r),
                "goodput": f.runtime * f.program,
                "runtimeGoodput": f.runtime,
                "threshold": threshold,
                "below": f.runtime * f.program < threshold,
                "spread": None if spread is None else RunSpreadOut.of(spread),
            }
        )
        since = min(since, r.first_seen)
    faults = pq.events(FAULT_KINDS, since)
    nodes: dict[str, dict[str, Any]] = {}
    for e in faults:
        if not e.node:
            continue
        n = nodes.setdefault(e.node, {"node": e.node, "fatal": 0, "recoverable": 0, "events": []})
        fatal = e.kind == "failure" or "fatal" in (e.message or "").lower()
        n["fatal" if fatal else "recoverable"] += 1
        if len(n["events"]) < 5:
            n["events"].append(PortalEventOut.of(e))
    firing = sorted(svc.alert_store.list(scope, "firing", None, 200), key=queue_order)
    alerts = [AlertOut.doc(a) for a in firing]
    for a in alerts:
        a["live"] = a["runId"] in live
    _alert_nodes(nodes, alerts, pq.nodes_of(sorted(live)))
    incidents = []
    for iid in sorted({a["incidentId"] for a in alerts if a.get("incidentId")}):
        incidents.append(IncidentDetailOut.summary_doc(svc.alert_store.incident(scope, iid)))
    return {
        "generatedAt": now,
        "view": "tenant",
        "jobs": sorted(jobs, key=lambda j: j["goodput"]),
        "nodes": sorted(nodes.values(), key=lambda n: (-n["fatal"], -n["recoverable"])),
        "drains": [PortalEventOut.of(e) for e in pq.events(DRAIN_KINDS, since)],
        # an action a person could still approve only while its job runs; one under way stays
        "remediations": [
            a
            for a in _pending(svc, scope, now - window_s)
            if a["runId"] in live or a["state"] not in PENDING_STATES
        ],
        "alerts": alerts,
        "incidents": incidents,
        "silences": [SilenceOut.doc(s) for s in SilenceStore(svc.metadata, svc.access).list(scope)],
    }


def _infra_alert(a: AlertView) -> dict[str, Any]:
    """What on-call sees of an alert: the node it names, not the run's labels (rank, project)."""
    labels = a.labels
    return {
        "id": a.id,
        "alertname": a.alertname,
        "severity": a.severity,
        "tenant": a.tenant,
        "runId": a.run_id,
        "node": labels.get("node") or None,
        "gpu": labels.get("gpu") or None,
        "rack": labels.get("rack") or None,
        "summary": a.annotations.get("summary", ""),
        "startsAt": a.starts_at,
        "incidentId": a.incident_id,
        "ackedBy": a.acked_by,
        "silencedBy": a.silenced_by,
        "ackedAt": a.acked_at,
        "runbookUrl": a.annotations.get("runbook_url"),
    }


def _infra_oncall(svc: Any, scope: Scope, window_s: float) -> dict[str, Any]:
    now = time.time()
    firing = sorted(svc.alert_store.list_infra(scope, "firing", 500), key=queue_order)
    alerts = [_infra_alert(a) for a in firing]
    nodes: dict[str, dict[str, Any]] = {}
    for a in sorted(alerts, key=lambda a: a["startsAt"], reverse=True):
        severity = NODE_FAULTS.get(a["alertname"])
        if severity is None or not a["node"]:
            continue
        n = nodes.setdefault(
            a["node"], {"node": a["node"], "fatal": 0, "recoverable": 0, "runs": [], "events": []}
        )
        n[severity] += 1
        run = {"tenant": a["tenant"], "runId": a["runId"]}
        if run not in n["runs"]:
            n["runs"].append(run)
        if len(n["events"]) < 5:
            n["events"].append(
                {
                    "time": a["startsAt"],
                    "kind": a["alertname"],
                    "gpu": a["gpu"],
                    "message": a["summary"],
                }
            )
    incidents: dict[int, dict[str, Any]] = {}
    for a in alerts:
        if a["incidentId"]:
            inc = incidents.setdefault(
                a["incidentId"],
                {"id": a["incidentId"], "tenant": a["tenant"], "runId": a["runId"], "alerts": []},
            )
            inc["alerts"].append(f"{a['alertname']} on {a['node'] or 'the run'}")
    actions = _pending(svc, scope, now - window_s)
    return {
        "generatedAt": now,
        "view": "infra",
        "nodes": sorted(nodes.values(), key=lambda n: (-n["fatal"], -n["recoverable"])),
        "drains": [
            NodeEventOut.of(e)
            for e in PortalQueries(svc.telemetry, scope).node_events(DRAIN_KINDS, now - window_s)
        ],
        "remediations": actions,  # trimmed for on-call (api.remediation.INFRA_KEYS)
        "alerts": alerts,
        "incidents": [incidents[i] for i in sorted(incidents)],
        "silences": [SilenceOut.doc(s) for s in SilenceStore(svc.metadata, svc.access).list(scope)],
    }


MAX_CAPACITY_RUNS = 2000
"""Runs a capacity document weighs (each is one goodput read); more: the newest, said so."""


def _period(
    runs: list[Any], pools: list[tuple[str, tuple[float, float]]], now: float, hours: float | None
) -> tuple[float, float]:
    """The window a capacity document covers: the last ``hours`` up to now, or (None) from the
    first record of a run or a pool to now."""
    if hours is not None:
        return now - hours * 3600.0, now
    starts = [r.first_seen for r in runs] + [span[0] for _, span in pools]
    return (min(starts) if starts else now), now


@router.get(
    "/portal/capacity",
    summary="Fleet utilization vs goodput, losses by cause, cost",
    response_model=PortalCapacityOut,
)
async def capacity(
    request: Request,
    scope: Reader,
    price: Annotated[
        float, Query(gt=0, le=1e9, allow_inf_nan=False, description="price of one GPU-hour")
    ] = 2.0,
    period_hours: Annotated[
        float | None,
        Query(
            alias="periodHours",
            gt=0,
            le=24 * 3660,
            allow_inf_nan=False,
            description="the last so many hours; absent: everything on record",
        ),
    ] = None,
    pool: Annotated[
        str | None,
        Query(
            max_length=256,
            description="one pool only: its capacity and the runs its allocations name "
            "(by run id or by a job attempt's scheduler job id); absent: every pool",
        ),
    ] = None,
) -> dict[str, Any]:
    """GPU-hours of the period: in service (the pools' capacity records), held by runs, useful.
    Figures that cannot be (runs holding more GPU-hours than the pools have in service: capacity
    records missing GPUs, or two runs reporting the same GPUs) are never shown as over 100%:
    the GPU-hours held beyond capacity are ``oversubscribedGpuHours``, shares are taken of what
    was held, and ``warnings`` says why."""
    svc = request.app.state.services

    def work() -> dict[str, Any]:
        now = time.time()
        gq = GoodputQueries(svc.telemetry, scope)
        names = gq.pools()
        if pool is not None and pool not in names:
            raise NotFound(f"pool {pool!r} has no capacity records; pools: {', '.join(names)}")
        spans = [(p, sp) for p in names if pool in (None, p) and (sp := gq.time_span(p))]
        since = None if period_hours is None else now - period_hours * 3600.0
        all_runs = svc.metadata.list_runs(scope, None, MAX_CAPACITY_RUNS + 1, 0, since=since)
        if pool is not None:
            all_runs = pool_runs(gq, svc.metadata, scope, pool, all_runs)
        t0, t1 = _period(all_runs, spans, now, period_hours)
        runs = [r for r in all_runs if r.last_seen >= t0 and r.first_seen <= t1]
        truncated = len(runs) > MAX_CAPACITY_RUNS
        runs = runs[:MAX_CAPACITY_RUNS]
        pools = []
        for p, (lo, hi) in spans:
            a, b = max(lo, t0), min(hi, t1)
            if b > a:
                result = gq.pool_scheduling(p, a, b)
                pools.append(PoolGoodputOut.of(p, result).model_dump(by_alias=True))
        seconds: dict[str, float] = {}
        interruptions: dict[str, int] = {}
        gpu_held = gpu_useful = runtime_lost = program_lost = 0.0
        series = FleetSeries(gq, spans, t0, t1)
        jobs = JobTally()
        inputs = gq.runs_inputs([r.run_id for r in runs], t0, t1)
        for r in runs:
            # The part of the period the run held its GPUs (services.capacity.held): the
            # period's wall clock outside it is not the run's (counting it made GPU-hours grow
            # with the period chosen). Its steps and events are read once, with every run's.
            window, held_only = held(r, t0, t1)
            reads = inputs[r.run_id]
            bd, f, meta = gq.run_goodput(
                r.run_id,
                program_spec(r.config or {}),
                window=window,
                held_only=held_only,
                executions=reads[0],
                events=reads[1],
            )
            gpus = float(meta.devices or r.world_size or 0)
            series.add_run(r, reads, window, held_only, gpus, f.program)
            for k, v in bd.seconds.items():
                seconds[k] = seconds.get(k, 0.0) + v * gpus / 3600.0
            for k, n in bd.interruptions.items():
                interruptions[k] = interruptions.get(k, 0) + n
            h = bd.held_s * gpus / 3600.0
            jobs.add(r, gpus, h, h * f.runtime * f.program)
            runtime_lost += h * (1 - f.runtime)
            program_lost += h * f.runtime * (1 - f.program)
            gpu_useful += h * f.runtime * f.program
            gpu_held += h
        spare = [g for b in series.buckets if (g := b.spare_gpus) is not None]
        causes: dict[str, int] = {}
        for r in runs:
            for fnd in FindingsStore(svc.metadata).rows(scope, r.run_id):
                causes[fnd.diagnosis] = causes.get(fnd.diagnosis, 0) + 1
        sched = [p["schedulingGoodput"] for p in pools if p.get("schedulingGoodput") is not None]
        sched_g = sum(sched) / len(sched) if sched else 1.0
        in_service = sum(p["gpuHours"]["inService"] for p in pools)
        over = max(0.0, gpu_held - in_service) if pools else 0.0
        warnings = []
        if over > 1e-9:
            warnings.append(
                f"runs held {gpu_held:.1f} GPU-hours, {over:.1f} more than the pools had in "
                f"service ({in_service:.1f}): the capacity records miss GPUs, or several runs "
                "report the same GPUs; shares are taken of the GPU-hours held"
            )
        if truncated:
            warnings.append(
                f"the period holds more than {MAX_CAPACITY_RUNS} runs: the "
                f"{MAX_CAPACITY_RUNS} most recently active are counted; choose a shorter period"
            )
        if not pools:
            warnings.append(
                "no capacity records (fleetlens scheduler import): the GPU-hours held by runs "
                "stand for the capacity, and the scheduling loss is estimated from no pool"
            )
        # The base everything is a share of: never less than what was held.
        base = max(in_service, gpu_held) if pools else gpu_held
        scheduling_lost = max(0.0, in_service - gpu_held) if pools else base * (1 - sched_g)
        useful = gpu_useful
        return {
            "period": {"from": t0, "to": t1, "hours": (t1 - t0) / 3600.0, "asked": period_hours},
            "pool": pool,
            "poolNames": names,
            "pools": pools,
            "utilization": gpu_held / base if base else None,
            "goodput": useful / base if base else None,
            "inServiceGpuHours": in_service if pools else None,
            "heldGpuHours": gpu_held,
            "oversubscribedGpuHours": over,
            "waterfall": [
                {"step": "in service", "gpuHours": base},
                {"step": "scheduling loss", "gpuHours": -scheduling_lost},
                {"step": "runtime loss", "gpuHours": -runtime_lost},
                {"step": "program loss", "gpuHours": -program_lost},
                {"step": "useful", "gpuHours": useful},
            ],
            "lossByCause": {k: v for k, v in seconds.items() if k != "productive"},
            "interruptions": interruptions,
            "findingsByCause": causes,
            "price": price,
            "costPerUsefulGpuHour": price * base / useful if useful > 0 else None,
            "runs": len(runs),
            "series": [CapacityBucketOut.of(b, price) for b in series.buckets],
            "spareGpusMin": min(spare) if spare else None,
            "jobs": CapacityJobsOut.of(jobs),
            "warnings": warnings,
        }

    return await anyio.to_thread.run_sync(work)
