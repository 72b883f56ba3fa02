"""JSON the web portal's pages fetch: one call per page, each shaped and downsampled for it.

``/v1/runs/{run_id}/overview`` is everything the run page draws on first paint (a page on a
1,024-rank run must not make a dozen round trips), its findings ranked by their cost
(:mod:`fleetlens.services.portal_costs`); ``/heatmap?slowest=8``, below the fold, is fetched
after it and redraws any window; ``/ranks/{rank}/detail`` serves the rank page (the heatmap's
click-through); ``/failure`` serves the failure page (the on-call and capacity pages' documents
are :mod:`.portal_fleet`'s). Everything is read through the caller's scope, as in the rest of
the API. The remediation controller's actions (one indexed read of the metadata store) ride
along on the overview. The run page's two documents are sent by :mod:`.portal_json` (msgspec,
gzip, ``Server-Timing``).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import Response

from ..analysis.layout import layout_of
from ..analysis.ranks import CusumParams
from ..remediation.controller import ACTIVE
from ..services.portal import HEATMAP_ROWS_BUDGET, PortalQueries, run_overview
from ..services.portal_rank import RankQueries
from ..services.portal_types import RunOverview
from ..services.runs import RunQueries
from ..services.series import SeriesQueries
from ..store.findings import FindingsStore
from ..store.scope import Scope
from .alert_models import AlertOut
from .auth import ERROR_RESPONSES, require
from .findings import finding_json
from .goodput import advice
from .goodput_models import BreakdownOut, FactorsOut, ProgramOut
from .models import CompletionOut, RankOut, timeline_doc, timeline_out
from .portal_json import Clock, json_response
from .portal_models import (
    FailurePageOut,
    FindingCostOut,
    HeatmapOut,
    HeatmapRowsOut,
    OverviewOut,
    PhaseBucketOut,
    PlacementOut,
    PortalEventOut,
    RankDetailOut,
    RankedFindingOut,
    RunSummaryOut,
    ScalarPointOut,
    StepBucketOut,
)
from .remediation import action_views
from .runs import run_json, summary_mfu_out

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["portal"], responses=ERROR_RESPONSES)
Reader = Annotated[Scope, Depends(require("read"))]

SCALARS = ("loss", "lr", "grad_norm")
FAILURE_KINDS = ("failure", "hardware_fault", "nan", "oom", "exception", "hang", "restart")
FAULT_KINDS = ("hardware_fault", "failure")
DRAIN_KINDS = ("drain", "drain_start", "drain_end", "maintenance")
ON_CALL_STATES = ("recommended", "awaiting_approval", *ACTIVE)
"""Remediation states the on-call page lists: waiting for a person to approve (a recommendation
is approved the same way), or taking a node out."""
PENDING_STATES = ("recommended", "awaiting_approval")
"""Actions a person may approve."""
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
    "memory_climb": "Find what the loop keeps from step to step (outputs or losses kept as "
    "tensors, a growing cache); the run will run out of memory at this pace.",
    "hang": "Collect stack traces of every rank (py-spy) and the NCCL flight recorder.",
    "program_regression": "Compare with the baseline runs the finding names (fleetlens compare); "
    "roll the image or driver that changed back on a canary and measure again.",
    "startup_regression": "Look at what the attempt does before its first step (compilation, "
    "loading, the rendezvous) on the software that changed.",
    "mfu_regression": "Compare the kernels of a traced step with a baseline run's "
    "(fleetlens traces capture) on the software that changed.",
    "token_regression": "Compare a traced step with a baseline run's (fleetlens traces capture) "
    "on the software that changed; the run logs tokens but names no FLOPs for an MFU.",
    "scaling_regression": "Hold the rollout: the software that changed costs more as the job "
    "grows; compare the collectives of a traced step at both sizes.",
    "recovery_regression": "Time each part of the restart (detection, requeue, rendezvous, "
    "checkpoint load) on the software or automation that changed.",
    "checkpoint_regression": "Check the storage tier and the checkpoint writer that changed.",
    "allocation_regression": "Check the pool's scheduler policy and job template changes; "
    "capacity may be stranded in incomplete gangs.",
    "checkpoint": "Move to asynchronous checkpointing or a faster storage tier.",
    "preemption": "Checkpoint on the preemption notice; ask for a non-preemptible quota.",
    "stage_imbalance": "Rebalance the pipeline: move layers off the slow stage (or count the "
    "loss and embeddings in the split); no node is at fault.",
    "batch_imbalance": "Balance the tokens per replica (sequence packing, length-grouped "
    "sampling); no node is at fault.",
}


IMPLICATED = 1.0 + CusumParams().min_slowdown
"""The compute slowdown from which the failure page names a rank beside the failing one."""


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
    found = [a for st in states for a in ctl.actions(scope, run_id, st, REMEDIATIONS_LIMIT)]
    rows = action_views(ctl, scope, found)
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


def _overview_doc(ov: RunOverview, generated: float) -> dict[str, Any]:
    """The overview's JSON up to its findings (sent by msgspec, not validated: the portal's
    speed; :class:`OverviewOut` documents it)."""
    info, summary = ov.info, ov.summary
    out: dict[str, Any] = {"run": run_json(info), "generatedAt": generated}
    out["run"]["config"] = info.config
    out["summary"] = RunSummaryOut.doc(summary)
    out["layout"] = ov.layout.to_json() if ov.layout else None
    # MFU as GET /v1/runs/{id} has it (or why there is none)
    out["mfu"] = summary_mfu_out(info.config or {}, summary).model_dump(by_alias=True)
    st = ov.steps
    if st is None:
        return out
    w = st.window
    out["window"] = {
        "fromStep": w.from_step,
        "toStep": w.to_step,
        "runFromStep": w.run_from_step,
        "runToStep": w.run_to_step,
    }
    out["stepSeries"] = [StepBucketOut.doc(b) for b in st.step_series]
    out["scalars"] = {
        name: [ScalarPointOut.doc(p) for p in series] for name, series in st.scalars.items()
    }
    out["goodput"] = {
        "breakdown": BreakdownOut.of(st.breakdown).model_dump(by_alias=True),
        "factors": FactorsOut.of(st.factors).model_dump(by_alias=True),
        "program": ProgramOut.doc(st.program),
        "advice": advice(st.breakdown, st.factors, None),
    }
    out["timeline"] = [timeline_doc(i) for i in st.timeline]
    return out


@router.get(
    "/runs/{run_id}/overview",
    summary="What the run page draws on first paint, downsampled to the pixels shown",
    response_model=OverviewOut,  # documents it: sent by portal_json (msgspec), not validated
)
async def overview(
    request: Request,
    run_id: str,
    scope: Reader,
    points: Annotated[int, Query(ge=10, le=2000)] = 400,
    from_step: Annotated[int | None, Query(alias="fromStep", ge=0, le=2**62)] = None,
    to_step: Annotated[int | None, Query(alias="toStep", ge=0, le=2**62)] = None,
) -> Response:
    """Status, summary, goodput, the step-time and scalar series and the recent timeline. The
    heatmap and the slowest ranks, below the fold, come from ``/heatmap?slowest=``. With
    ``fromStep``/``toStep`` (the page's zoomed range) the series and the timeline cover that
    window, at ``points`` buckets; the summary, goodput and findings stay the whole run's."""
    svc = request.app.state.services
    if from_step is not None and to_step is not None and from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")

    def work() -> Response:
        clock = Clock()
        generated = time.time()
        ov = run_overview(
            svc.metadata, svc.telemetry, scope, run_id, points, from_step, to_step, clock.mark
        )
        out = _overview_doc(ov, generated)
        st = ov.steps
        if st is None:
            return json_response(request, out, clock)
        clock.mark("document")
        out["findings"] = [
            RankedFindingOut.doc(r, finding_json(r.finding), _recommend(r.finding.diagnosis))
            for r in st.findings
        ]
        out["goodput"]["unattributed"] = FindingCostOut.doc(st.unattributed)
        out["alerts"] = [AlertOut.doc(a) for a in svc.alert_store.list(scope, None, run_id, 50)]
        clock.mark("findings")
        out["remediations"] = _remediations(svc, scope, run_id)
        clock.mark("remediation")
        eta = st.completion
        out["completion"] = (
            None
            if eta is None
            else CompletionOut.of(eta).model_dump(by_alias=True, exclude_unset=True)
        )
        return json_response(request, out, clock)

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/runs/{run_id}/heatmap",
    summary="Rank x step heatmap of compute time: rank buckets x step buckets, max per cell",
    response_model=HeatmapOut,  # documents it: sent by portal_json (msgspec), not validated
)
async def heatmap(
    request: Request,
    run_id: str,
    scope: Reader,
    from_step: Annotated[int | None, Query(alias="fromStep", ge=0, le=2**62)] = None,
    to_step: Annotated[int | None, Query(alias="toStep", ge=0, le=2**62)] = None,
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
        clock = Clock()
        svc.metadata.get_run(scope, run_id)
        pq = PortalQueries(svc.telemetry, scope)
        rng = pq.step_range(run_id)
        clock.mark("run")
        if rng is None:
            return json_response(request, {"runId": run_id, "cells": [], "hot": None}, clock)
        lo, hi = _window(rng, rng[2], None)
        lo = from_step if from_step is not None else lo
        hi = to_step if to_step is not None else hi
        if hi - lo + 1 > 1_000_000:
            raise HTTPException(400, "a heatmap window covers at most 1,000,000 steps")
        heat = pq.heatmap(run_id, lo, hi, rng[2], ranks, steps)
        out = HeatmapOut.doc(run_id, heat)
        clock.mark("heatmap")
        # Per row, the rank its click opens and where that rank ran (the hover names them).
        rows = RankQueries(svc.telemetry, scope).rows(run_id, heat.row_rank)
        out["rowRanks"] = HeatmapRowsOut.doc(rows)
        clock.mark("rows")
        if slowest:
            out["slowestRanks"] = [
                RankOut.doc(r)
                for r in RunQueries(svc.telemetry, scope).ranks(
                    run_id, lo, hi, "compute", True, slowest
                )
            ]
            clock.mark("ranks")
        return json_response(request, out, clock)

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/runs/{run_id}/ranks/{rank}/detail",
    summary="One rank: its phase timings over steps and its GPU's samples, per placement",
    response_model=RankDetailOut,
    response_model_exclude_unset=True,
)
async def rank_detail(
    request: Request,
    run_id: str,
    rank: Annotated[int, Path(ge=0, le=2**31 - 1)],
    scope: Reader,
    from_step: Annotated[int | None, Query(alias="fromStep", ge=0, le=2**62)] = None,
    to_step: Annotated[int | None, Query(alias="toStep", ge=0, le=2**62)] = None,
    points: Annotated[int, Query(ge=10, le=2000)] = 300,
) -> RankDetailOut:
    """The heatmap's click-through (the run's whole step range unless a window is given): the
    rank's mean phase timings per step bucket next to the mean rank's compute, for each job
    attempt that placed it, its node and GPU with the GPU's samples while it ran there, and
    where it sits in the run's parallel layout (``coords``: pipeline stage, data-parallel
    replica, context and tensor-parallel rank) when the run has one."""
    svc = request.app.state.services
    if from_step is not None and to_step is not None and from_step > to_step:
        raise HTTPException(400, f"fromStep {from_step} is after toStep {to_step}")

    def work() -> RankDetailOut:
        info = svc.metadata.get_run(scope, run_id)
        rng = PortalQueries(svc.telemetry, scope).step_range(run_id)
        out: dict[str, Any] = {"runId": run_id, "rank": rank, "phases": [], "placements": []}
        lay = layout_of(info.config or {}, info.world_size)
        if lay is not None and rank < lay.world:  # where the rank sits in the parallel layout
            out["layout"], out["coords"] = lay.to_json(), lay.coords(rank)
        if rng is None:
            return RankDetailOut.model_validate(out)
        lo = rng[0] if from_step is None else from_step
        hi = rng[1] if to_step is None else to_step
        rq = RankQueries(svc.telemetry, scope)
        phases = [PhaseBucketOut.of(b) for b in rq.phases(run_id, rank, lo, hi, points)]
        out.update(fromStep=lo, toStep=hi, phases=phases)
        span = rq.time_span(run_id, lo, hi)
        places = rq.placements(run_id, rank)
        ends = [p.time for p in places[1:]] + [math.inf] * bool(places)
        placed = []
        for p, end in zip(places, ends, strict=True):
            a, b = (max(p.time, span[0] - 60), min(end, span[1] + 60)) if span else (0, -1)
            samples = rq.gpu_samples(p.node, p.gpu, a, b, points) if a < b else []
            placed.append(PlacementOut.of(p, samples))
        out["placements"] = placed
        return RankDetailOut.model_validate(out)

    return await anyio.to_thread.run_sync(work)


@router.get(
    "/runs/{run_id}/failure",
    summary="A failed or degraded run: what failed, signals before it, likely cause, advice",
    response_model=FailurePageOut,
    response_model_exclude_unset=True,
)
async def failure(request: Request, run_id: str, scope: Reader) -> dict[str, Any]:
    svc = request.app.state.services

    def work() -> dict[str, Any]:
        info = svc.metadata.get_run(scope, run_id)
        rq = RunQueries(svc.telemetry, scope)
        pq = PortalQueries(svc.telemetry, scope)
        findings = [finding_json(f) for f in FindingsStore(svc.metadata).rows(scope, run_id)]
        events = pq.events(FAILURE_KINDS, 0.0, run_id, 50)
        failed = next((e for e in events if e.kind != "restart"), None)
        rng = pq.step_range(run_id)
        top = max(findings, key=lambda f: (f["kind"] == "failure", f["confidence"]), default=None)
        at = (failed.step if failed else None) or (top or {}).get("step")
        out: dict[str, Any] = {
            "run": run_json(info),
            "failure": PortalEventOut.of(failed) if failed else None,
            "cause": None,
        }
        # Findings imported without telemetry (Flight Recorder dumps) show without steps too.
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
        if rng is None:
            return out
        at = int(at) if at is not None else rng[1]
        lo = max(rng[0], at - 200)
        sq = SeriesQueries(svc.telemetry, scope)
        out["training"] = {
            n.name: [ScalarPointOut.of(p) for p in sq.series(run_id, n.name, lo, at, 5)]
            for n in sq.names(run_id)
            if n.name in SCALARS
        }
        out["stepTime"] = [StepBucketOut.of(b) for b in pq.step_series(run_id, lo, at, 5)]
        # Implicated: the failing rank, and ranks slower than their peers by at least what
        # detection calls slow (a 1.00x rank beside the slow one implicates nobody).
        ranks = [
            r
            for r in rq.ranks(run_id, lo, at, "compute", True, 3)
            if (r.compute_slowdown or 0.0) >= IMPLICATED
        ]
        if failed and failed.rank is not None:
            mine = [
                r for r in rq.ranks(run_id, lo, at, "rank", False, 100_000) if r.rank == failed.rank
            ]
            if mine and failed.node:
                # Placement answers with the rank's latest home (a spare after the restart);
                # the failure happened where the event says.
                mine[0] = replace(mine[0], node=failed.node, gpu=failed.gpu, rack=None)
                mine = rq.hardware(run_id, mine, lo, at)
            ranks = mine + [r for r in ranks if r.rank != failed.rank]
        out["infrastructure"] = [RankOut.of(r) for r in ranks[:4]]
        related = rq.timeline(run_id, max(rng[0], at - 100), min(rng[1], at + 100))[:200]
        out["related"] = [timeline_out(i) for i in related]
        out["atStep"] = at
        return out

    return await anyio.to_thread.run_sync(work)
