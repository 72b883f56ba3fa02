"""JSON the web portal's pages fetch: one call per page, each shaped and downsampled for it.

``/v1/runs/{run_id}/overview`` is everything the run page draws on first paint (a page on a
1,024-rank run must not make a dozen round trips); ``/heatmap?slowest=8``, below the fold, is
fetched after it and redraws any window; ``/failure``, ``/v1/portal/oncall`` and
``/v1/portal/capacity`` serve the other three pages. Everything is read through the caller's
scope, as in the rest of the API; the on-call document is the one an ``oncall`` token reads
too, and gets every tenant's nodes, drains and infrastructure alerts without their runs. The
remediation controller's actions (one indexed read of the metadata store) ride along: the run's
own on the overview, those pending or under way on the on-call page.

The run page's two documents are encoded here (msgspec, gzip when the client accepts it) and
carry a ``Server-Timing`` header with the cost of each part: a 100,000-step run's overview is
~175 kB of JSON, which FastAPI's generic encoder takes ~30 ms to walk (msgspec: under 1 ms) and
sends uncompressed (gzip: ~27 kB).
"""

from __future__ import annotations

import gzip
import time
from typing import Annotated, Any

import anyio
import msgspec
import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import Response

from ..remediation.controller import ACTIVE
from ..store.findings import FindingsStore
from ..store.goodput_queries import GoodputQueries, program_spec
from ..store.portal_queries import HEATMAP_ROWS_BUDGET, PortalQueries, run_summary, step_buckets
from ..store.run_queries import RunQueries
from ..store.scope import Scope
from ..store.series_queries import SeriesQueries
from .auth import ERROR_RESPONSES, require, require_any
from .goodput import advice
from .runs import _run_json

__all__ = ["router"]

TIMELINE_STEPS = 5_000

router = APIRouter(prefix="/v1", tags=["portal"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]
# Infrastructure on-call (read:infra) gets the on-call page's infrastructure view, every tenant's.
OnCallReader = Annotated[Scope, Depends(require_any("read", "read:infra"))]

SCALARS = ("loss", "lr", "grad_norm")
FAILURE_KINDS = ("failure", "hardware_fault", "nan", "oom", "exception", "hang", "restart")
FAULT_KINDS = ("hardware_fault", "failure")
DRAIN_KINDS = ("drain", "drain_start", "drain_end", "maintenance")
TOTAL_KEYS = ("total_steps", "max_steps", "train_steps", "steps")
ON_CALL_STATES = ("recommended", "awaiting_approval", *ACTIVE)
"""Remediation states the on-call page lists: waiting for a person to approve (a recommendation
is approved the same way), or taking a node out."""
NODE_FAULTS = {"FatalHardwareFault": "fatal", "RecoverableHardwareFault": "recoverable"}
REMEDIATIONS_LIMIT = 50  # newest actions per list (per state on the on-call page)

RECOMMEND = {
    "straggler": "Cordon the slow rank's node and restart from the last checkpoint on a spare.",
    "thermal": "Check cooling of the node and rack; cordon the GPU until it holds its clock.",
    "fatal_xid": "The node is drained; resume from the last checkpoint on a spare node.",
    "ecc": "Replace the GPU (uncorrectable memory errors); resume from the last checkpoint.",
    "nvlink": "Reseat or replace the NVLink path; run the node's fabric diagnostics.",
    "network": "Inspect the NIC and switch port of the node; check the fabric counters.",
    "data_stall": "Inspect the input pipeline: loader workers, storage throughput, prefetch.",
    "nan": "Inspect the LR scheduler and the data at the failing step; resume from a checkpoint "
    "before the spike with a lower learning rate.",
    "instability": "Inspect the LR scheduler and gradient clipping; resume from an earlier "
    "checkpoint.",
    "oom": "Reduce the micro-batch or enable activation checkpointing.",
    "hang": "Collect stack traces of every rank (py-spy) and the NCCL flight recorder.",
    "checkpoint": "Move to asynchronous checkpointing or a faster storage tier.",
    "preemption": "Checkpoint on the preemption notice; ask for a non-preemptible quota.",
}


GZIP_MIN_BYTES = 1024


def _plain(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__} as JSON")


_ENCODER = msgspec.json.Encoder(enc_hook=_plain)


class _Clock:
    """Milliseconds spent on each part of a document, for its ``Server-Timing`` header."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, float]] = []
        self._t = time.perf_counter()

    def mark(self, part: str) -> None:
        now = time.perf_counter()
        self.parts.append((part, (now - self._t) * 1000.0))
        self._t = now

    def header(self) -> str:
        return ", ".join(f"{name};dur={ms:.1f}" for name, ms in self.parts)


def _accepts_gzip(request: Request) -> bool:
    for item in request.headers.get("accept-encoding", "").split(","):
        name, _, params = item.partition(";")
        if name.strip().lower() in ("gzip", "*"):
            q = params.strip()
            if not q.startswith("q="):
                return True
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
    return False


def _json(request: Request, doc: dict[str, Any], clock: _Clock) -> Response:
    body = _ENCODER.encode(doc)
    headers = {"Vary": "Accept-Encoding"}
    if len(body) >= GZIP_MIN_BYTES and _accepts_gzip(request):
        body = gzip.compress(body, compresslevel=5, mtime=0)
        headers["Content-Encoding"] = "gzip"
    clock.mark("encode")
    headers["Server-Timing"] = clock.header()
    return Response(body, media_type="application/json", headers=headers)


def _recommend(diagnosis: str) -> str:
    for key, text in RECOMMEND.items():
        if key in diagnosis:
            return text
    return "Open the run page's timeline around the failing step and the owner's runbook."


def _remediations(
    svc: Any, scope: Scope, run_id: str | None, states: tuple[str | None, ...] = (None,)
) -> list[dict[str, Any]]:
    """The controller's actions, newest first; none where remediation is not running."""
    ctl = svc.monitor.remediation
    if ctl is None:
        return []
    rows = [a for st in states for a in ctl.actions(scope, run_id, st, REMEDIATIONS_LIMIT)]
    return sorted(rows, key=lambda a: a["decidedAt"], reverse=True)


def _pending(svc: Any, scope: Scope, since: float) -> list[dict[str, Any]]:
    """The actions the on-call page lists: all those awaiting approval or under way, and the
    recommendations made since ``since`` (nothing closes a recommendation nobody acted on)."""
    rows = _remediations(svc, scope, None, ON_CALL_STATES)
    return [a for a in rows if a["state"] != "recommended" or a["decidedAt"] >= since]


def _window(hi_lo: tuple[int, int, int], world: int, heat_steps: int | None) -> tuple[int, int]:
    lo, hi, _ = hi_lo
    span = heat_steps or max(50, HEATMAP_ROWS_BUDGET // max(1, world))
    return max(lo, hi - span + 1), hi


def _total_steps(config: dict[str, Any]) -> int | None:
    for k in TOTAL_KEYS:
        v = config.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


@router.get(
    "/runs/{run_id}/overview",
    summary="What the run page draws on first paint, downsampled to the pixels shown",
    response_class=Response,
    responses={200: {"content": {"application/json": {"schema": {"type": "object"}}}}},
)
async def overview(
    request: Request,
    run_id: str,
    scope: Reader,
    points: Annotated[int, Query(ge=10, le=2000)] = 400,
) -> Response:
    """Status, summary, goodput, the step-time and scalar series and the recent timeline. The
    heatmap and the slowest ranks, below the fold, come from ``/heatmap?slowest=``."""
    svc = request.app.state.services

    def work() -> Response:
        clock = _Clock()
        info = svc.metadata.get_run(scope, run_id)
        pq = PortalQueries(svc.telemetry, scope)
        out: dict[str, Any] = {"run": _run_json(info), "generatedAt": time.time()}
        out["run"]["config"] = info.config
        clock.mark("run")
        # One read of the rollup serves the summary, the step series and the goodput.
        executions = pq.executions(run_id)
        per_step = executions.latest()
        clock.mark("steps")
        latest = pq.latest_scalars(run_id)
        summary = run_summary(per_step, latest)
        out["summary"] = summary
        clock.mark("summary")
        if not len(per_step):
            return _json(request, out, clock)
        lo, hi = int(per_step.step[0]), int(per_step.step[-1])
        out["stepSeries"] = step_buckets(per_step, lo, hi, points)
        clock.mark("stepSeries")
        names = [n for n in latest if n in SCALARS or len(latest) < 6]
        out["scalars"] = pq.scalar_series(run_id, names, lo, hi, points)
        clock.mark("scalars")
        bd, f, meta = pq.run_goodput(run_id, executions, program_spec(info.config or {}))
        out["goodput"] = {
            "breakdown": bd.as_dict(),
            "factors": f.as_dict(),
            "program": meta,
            "advice": advice(bd, f, None),
        }
        clock.mark("goodput")
        # The recent part on first paint; the page asks /timeline for any other window.
        rq = RunQueries(svc.telemetry, scope)
        out["timeline"] = [
            i for i in rq.timeline(run_id, max(lo, hi - TIMELINE_STEPS + 1), hi) if i["source"]
        ][:2000]
        clock.mark("timeline")
        out["findings"] = FindingsStore(svc.metadata).list(scope, run_id, None)
        out["alerts"] = svc.alert_store.list(scope, None, run_id, 50)
        clock.mark("findings")
        out["remediations"] = _remediations(svc, scope, run_id)
        clock.mark("remediation")
        total = _total_steps(info.config or {})
        step_s = summary["metrics"].get("stepTimeMs")
        eta = None
        if total and step_s and summary.get("step") is not None:
            left = max(0, total - 1 - int(summary["step"]))
            eta = {"totalSteps": total, "stepsLeft": left, "seconds": left * step_s / 1000.0}
        out["completion"] = eta
        return _json(request, out, clock)

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/runs/{run_id}/heatmap",
    summary="Rank x step heatmap of compute time: rank buckets x step buckets, max per cell",
    response_class=Response,
    responses={200: {"content": {"application/json": {"schema": {"type": "object"}}}}},
)
async def heatmap(
    request: Request,
    run_id: str,
    scope: Reader,
    from_step: Annotated[int | None, Query(alias="fromStep", ge=0)] = None,
    to_step: Annotated[int | None, Query(alias="toStep", ge=0)] = None,
    ranks: Annotated[int, Query(ge=1, le=1024)] = 128,
    steps: Annotated[int, Query(ge=1, le=1024)] = 160,
    slowest: Annotated[
        int, Query(ge=0, le=1000, description="also list this many slowest ranks of the window")
    ] = 0,
) -> Response:
    """The default window is the last ``HEATMAP_ROWS_BUDGET // world`` steps."""
    svc = request.app.state.services
    if from_step is not None and to_step is not None and from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")

    def work() -> Response:
        clock = _Clock()
        svc.metadata.get_run(scope, run_id)
        pq = PortalQueries(svc.telemetry, scope)
        rng = pq.step_range(run_id)
        clock.mark("run")
        if rng is None:
            return _json(request, {"runId": run_id, "cells": [], "hot": None}, clock)
        lo, hi = _window(rng, rng[2], None)
        lo = from_step if from_step is not None else lo
        hi = to_step if to_step is not None else hi
        if hi - lo + 1 > 1_000_000:
            raise HTTPException(400, "a heatmap window covers at most 1,000,000 steps")
        out = {"runId": run_id, **pq.heatmap(run_id, lo, hi, rng[2], ranks, steps)}
        clock.mark("heatmap")
        if slowest:
            out["slowestRanks"] = RunQueries(svc.telemetry, scope).ranks(
                run_id, lo, hi, "compute", True, slowest
            )
            clock.mark("ranks")
        return _json(request, out, clock)

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/runs/{run_id}/failure",
    summary="A failed or degraded run: what failed, signals before it, likely cause, advice",
)
async def failure(request: Request, run_id: str, scope: Reader) -> dict[str, Any]:
    svc = request.app.state.services

    def work() -> dict[str, Any]:
        info = svc.metadata.get_run(scope, run_id)
        rq = RunQueries(svc.telemetry, scope)
        pq = PortalQueries(svc.telemetry, scope)
        findings = FindingsStore(svc.metadata).list(scope, run_id, None)
        events = pq.events(FAILURE_KINDS, 0.0, run_id, 50)
        failed = next((e for e in events if e["kind"] != "restart"), None)
        rng = pq.step_range(run_id)
        top = max(findings, key=lambda f: (f["kind"] == "failure", f["confidence"]), default=None)
        at = (failed or {}).get("step") or (top or {}).get("step")
        out: dict[str, Any] = {"run": _run_json(info), "failure": failed, "cause": None}
        if rng is None:
            return out
        at = int(at) if at is not None else rng[1]
        lo = max(rng[0], at - 200)
        sq = SeriesQueries(svc.telemetry, scope)
        out["training"] = {
            n["name"]: sq.series(run_id, n["name"], lo, at, 5)
            for n in sq.names(run_id)
            if n["name"] in SCALARS
        }
        out["stepTime"] = pq.step_series(run_id, lo, at, 5)
        ranks = rq.ranks(run_id, lo, at, "compute", True, 3)
        if failed and failed.get("rank") is not None:
            mine = [r for r in rq.ranks(run_id, lo, at, "rank", False, 100_000)
                    if r["rank"] == failed["rank"]]  # fmt: skip
            if mine and failed.get("node"):
                # Placement answers with the rank's latest home (a spare after the restart);
                # the failure happened where the event says.
                mine[0].update(node=failed["node"], gpu=failed.get("gpu"), rack=None)
                rq._hardware(run_id, mine, lo, at)
            ranks = mine + [r for r in ranks if r["rank"] != failed["rank"]]
        out["infrastructure"] = ranks[:4]
        if top is not None:
            out["cause"] = {
                "diagnosis": top["diagnosis"],
                "owner": top["owner"],
                "confidence": top["confidence"],
                "summary": top["summary"],
                "evidence": top["evidence"],
                "recommendation": _recommend(top["diagnosis"]),
            }
        out["findings"] = findings
        out["related"] = rq.timeline(run_id, max(rng[0], at - 100), min(rng[1], at + 100))[:200]
        out["atStep"] = at
        return out

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/portal/oncall",
    summary="Degraded jobs, implicated nodes, drains, alerts; for on-call, every tenant's nodes",
)
async def oncall(
    request: Request,
    scope: OnCallReader,
    window_s: Annotated[float, Query(alias="windowSeconds", gt=0)] = 86_400.0,
) -> dict[str, Any]:
    """``view`` says which document it is. ``tenant`` (roles that read): the tenant's jobs by
    goodput with their per-rank spread, its nodes with faults, drains and firing alerts.
    ``infra`` (role oncall, ``read:infra``): the nodes, drains, remediation actions and
    infrastructure alerts of every tenant, each with its tenant, and nothing of the runs but
    their ids: no jobs, goodput, spread or configs."""
    svc = request.app.state.services
    view = _infra_oncall if scope.cross_tenant_infra else _tenant_oncall
    return await anyio.to_thread.run_sync(view, svc, scope, window_s)


def _tenant_oncall(svc: Any, scope: Scope, window_s: float) -> dict[str, Any]:
    now = time.time()
    runs = svc.metadata.list_runs(scope, None, 50, 0)
    threshold = svc.monitor.policy.rule("GoodputLow").threshold or 0.8
    gq = GoodputQueries(svc.telemetry, scope)
    pq = PortalQueries(svc.telemetry, scope)
    jobs = []
    since = now - window_s
    for r in runs:
        _bd, f, _ = gq.run_goodput(r.run_id, program_spec(r.config or {}))
        jobs.append(
            {
                **_run_json(r),
                "goodput": f.runtime * f.program,
                "runtimeGoodput": f.runtime,
                "threshold": threshold,
                "below": f.runtime * f.program < threshold,
                "spread": pq.recent_spread(r.run_id),
            }
        )
        since = min(since, r.first_seen)
    faults = pq.events(FAULT_KINDS, since)
    nodes: dict[str, dict[str, Any]] = {}
    for e in faults:
        if not e["node"]:
            continue
        n = nodes.setdefault(
            e["node"], {"node": e["node"], "fatal": 0, "recoverable": 0, "events": []}
        )
        fatal = e["kind"] == "failure" or "fatal" in (e["message"] or "").lower()
        n["fatal" if fatal else "recoverable"] += 1
        if len(n["events"]) < 5:
            n["events"].append(e)
    alerts = svc.alert_store.list(scope, "firing", None, 200)
    incidents = []
    for iid in sorted({a["incidentId"] for a in alerts if a.get("incidentId")}):
        inc = svc.alert_store.incident(scope, iid)
        incidents.append({k: v for k, v in inc.items() if k != "alerts"})
    return {
        "generatedAt": now,
        "view": "tenant",
        "jobs": sorted(jobs, key=lambda j: j["goodput"]),
        "nodes": sorted(nodes.values(), key=lambda n: (-n["fatal"], -n["recoverable"])),
        "drains": pq.events(DRAIN_KINDS, since),
        "remediations": _pending(svc, scope, now - window_s),
        "alerts": alerts,
        "incidents": incidents,
    }


def _infra_alert(a: dict[str, Any]) -> dict[str, Any]:
    """What on-call sees of an alert: the node it names, not the run's labels (rank, project)."""
    labels = a["labels"]
    return {
        "id": a["id"],
        "alertname": a["alertname"],
        "severity": a["severity"],
        "tenant": a["tenant"],
        "runId": a["runId"],
        "node": labels.get("node") or None,
        "gpu": labels.get("gpu") or None,
        "rack": labels.get("rack") or None,
        "summary": a["annotations"].get("summary", ""),
        "startsAt": a["startsAt"],
        "incidentId": a["incidentId"],
    }


def _infra_oncall(svc: Any, scope: Scope, window_s: float) -> dict[str, Any]:
    now = time.time()
    alerts = [_infra_alert(a) for a in svc.alert_store.list_infra(scope, "firing", 500)]
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
                {"time": a["startsAt"], "kind": a["alertname"], "gpu": a["gpu"],
                 "message": a["summary"]}
            )  # fmt: skip
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
        "drains": PortalQueries(svc.telemetry, scope).node_events(DRAIN_KINDS, now - window_s),
        "remediations": actions,  # the controller trims them for on-call (INFRA_KEYS)
        "alerts": alerts,
        "incidents": [incidents[i] for i in sorted(incidents)],
    }


@router.get("/portal/capacity", summary="Fleet utilization vs goodput, losses by cause, cost")
async def capacity(
    request: Request,
    scope: Reader,
    price: Annotated[float, Query(gt=0, description="price of one GPU-hour")] = 2.0,
) -> dict[str, Any]:
    svc = request.app.state.services

    def work() -> dict[str, Any]:
        gq = GoodputQueries(svc.telemetry, scope)
        pools = []
        for p in gq.pools():
            span = gq.time_span(p)
            if span is not None:
                pools.append({"pool": p, **gq.pool_scheduling(p, span[0], span[1]).as_dict()})
        seconds: dict[str, float] = {}
        interruptions: dict[str, int] = {}
        held = gpu_held = gpu_useful = 0.0
        runtime_lost = program_lost = 0.0
        runs = svc.metadata.list_runs(scope, None, 200, 0)
        for r in runs:
            bd, f, meta = gq.run_goodput(r.run_id, program_spec(r.config or {}))
            gpus = float(meta.get("devices") or r.world_size or 0)
            for k, v in bd.seconds.items():
                seconds[k] = seconds.get(k, 0.0) + v * gpus / 3600.0
            for k, n in bd.interruptions.items():
                interruptions[k] = interruptions.get(k, 0) + n
            h = bd.held_s * gpus / 3600.0
            held += h
            runtime_lost += h * (1 - f.runtime)
            program_lost += h * f.runtime * (1 - f.program)
            gpu_useful += h * f.runtime * f.program
            gpu_held += h
        causes: dict[str, int] = {}
        for r in runs:
            for fnd in FindingsStore(svc.metadata).list(scope, r.run_id, None):
                causes[fnd["diagnosis"]] = causes.get(fnd["diagnosis"], 0) + 1
        sched = [p["schedulingGoodput"] for p in pools if p.get("schedulingGoodput") is not None]
        sched_g = sum(sched) / len(sched) if sched else 1.0
        installed = sum(p["gpuHours"]["inService"] for p in pools) or gpu_held
        scheduling_lost = max(0.0, installed - gpu_held) if pools else installed * (1 - sched_g)
        useful = gpu_useful
        return {
            "pools": pools,
            "utilization": gpu_held / installed if installed else None,
            "goodput": useful / installed if installed else None,
            "waterfall": [
                {"step": "in service", "gpuHours": installed},
                {"step": "scheduling loss", "gpuHours": -scheduling_lost},
                {"step": "runtime loss", "gpuHours": -runtime_lost},
                {"step": "program loss", "gpuHours": -program_lost},
                {"step": "useful", "gpuHours": useful},
            ],
            "lossByCause": {k: v for k, v in seconds.items() if k != "productive"},
            "interruptions": interruptions,
            "findingsByCause": causes,
            "price": price,
            "costPerUsefulGpuHour": price * installed / useful if useful > 0 else None,
            "runs": len(runs),
        }

    return await anyio.to_thread.run_sync(work)
