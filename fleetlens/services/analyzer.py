"""The server-side analysis loop body: find runs with new data, analyse the new windows, store
the findings.

``analyze_once`` is cheap when nothing is new (one indexed query on the metadata store) and
bounded when much is: at most ``max_runs`` runs and ``max_rank_steps`` rank-steps per run per
pass; a run with work left over is marked so the next pass continues it. State carried between
passes (per-rank CUSUM, baselines, how far each attempt was analysed) lives in the run's
analysis cursor, so the loop survives restarts and holds no module state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from ..analysis.baseline import (
    Baseline,
    localize,
    outlier_groups,
    shift_threshold,
    steady_prefix,
    workload_signature,
)
from ..analysis.collectives import transfer_times
from ..analysis.ends import diagnose_ends
from ..analysis.hangs import RECENT_STEPS
from ..analysis.layout import ParallelLayout, layout_of, peer_normalize
from ..analysis.nanstats import nanmedian
from ..analysis.ranks import RankState, RankStateDoc, scan_stragglers
from ..analysis.rootcause import (
    Diagnosis,
    diagnose_events,
    diagnose_slow_checkpoints,
)
from ..analysis.stages import (
    StageTally,
    batch_imbalance,
    fold_tp_groups,
    stage_imbalance,
    tally_stages,
)
from ..analysis.timeline import Event, save_pauses
from ..analysis.topology import tp_split
from ..config import AnalyzerConfig
from ..lifecycle import STOPS
from ..store.detect_queries import DetectQueries, JobSpan, Placement, StepMatrix
from ..store.findings import FindingsStore, RunToAnalyze
from ..store.models import Finding
from ..store.telemetry import TelemetryStore
from .cursor import (
    AttemptState,
    CursorCorruptError,
    CursorState,
    CursorVersionError,
    ScalarWatch,
    SlowCollectives,
    as_json,
    migrate,
    stored,
)
from .data_stalls import data_stall
from .devices import device_window, hardware, late_hardware, placed_until
from .hang_findings import find_hangs
from .instability import instability, late_scalars
from .memory import memory_climbs, with_oom_climbs
from .shifts import (
    fold_into_racks,
    network_diagnosis,
    shift_diagnosis,
    throttled_racks,
)
from .straggler_findings import straggler_findings

__all__ = ["LoopCounts", "analyze_once", "analyze_run"]

log = logging.getLogger("fleetlens.analyzer")

DEFAULTS = AnalyzerConfig()


@dataclass
class LoopCounts:
    """What the loop's passes met that a server's operator should see (its ``/metrics``)."""

    cursor_resets: int = 0
    """Runs whose analysis cursor was corrupt: analysed again from their first step."""


def analyze_once(
    telemetry: TelemetryStore,
    store: FindingsStore,
    now: float,
    config: AnalyzerConfig = DEFAULTS,
    counts: LoopCounts | None = None,
) -> list[Finding]:
    """One pass of the loop over every run with new data; returns the findings it wrote."""
    out: list[Finding] = []
    for run in store.runs_with_new_data(config.max_runs):
        try:
            state = migrate(run.state)
        except CursorVersionError as exc:  # a newer server's state: left as it is, not reset
            log.warning("run %s not analysed: %s", run.run_id, exc)
            continue
        except CursorCorruptError as exc:  # this run only starts over; the others go on
            log.error("run %s analysed again from its first step: %s", run.run_id, exc)
            if counts is not None:
                counts.cursor_resets += 1
            state = CursorState.fresh()
        try:
            found, stragglers, pending = analyze_run(telemetry, store, run, now, config, state)
        except Exception:  # one bad run must not stop the loop; the next pass retries it
            log.exception("analysis of run %s failed", run.run_id)
            continue
        out += store.upsert(run.tenant, run.run_id, found)
        out += store.upsert(run.tenant, run.run_id, stragglers, replace_kind="straggler")
        seen = -1.0 if pending else run.last_seen
        store.save_cursor(run.tenant, run.run_id, seen, stored(state), run.arrivals)
    return out


@dataclass
class _Ctx:
    q: DetectQueries
    run: RunToAnalyze
    cfg: AnalyzerConfig
    now: float
    found: list[Diagnosis] = field(default_factory=list)
    signature: str = ""
    coll: SlowCollectives = field(default_factory=SlowCollectives)
    layout: ParallelLayout | None = None  # the job's parallel layout, when its config names one

    def peers(self, compute: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """``compute`` with each pipeline stage scaled to the job's median: ranks judged
        against their own stage (the same ``compute`` when the job has one stage)."""
        if self.layout is None or self.layout.pp < 2:
            return compute
        return peer_normalize(compute, self.layout.stages(compute.shape[1]))  # type: ignore[no-any-return]


def analyze_run(
    telemetry: TelemetryStore,
    store: FindingsStore,
    run: RunToAnalyze,
    now: float,
    cfg: AnalyzerConfig = DEFAULTS,
    state: CursorState | None = None,
) -> tuple[list[Diagnosis], list[Diagnosis], bool]:
    """Analyse a run's new windows: (findings, the run's straggler findings, pending).
    ``state`` (the run's cursor, read from ``run.state`` when not given) is carried forward."""
    q = DetectQueries(telemetry, run.tenant)
    ctx = _Ctx(q, run, cfg, now)
    state = migrate(run.state) if state is None else state
    jobs = q.jobs(run.run_id)
    if not jobs:
        return [], [], False
    events = q.events(run.run_id)
    world = max(j.world for j in jobs)
    ctx.signature = workload_signature(run.config, world)
    ctx.layout = layout_of(run.config, world)
    bl = {
        "compute": Baseline.from_json(
            state.bl_compute or store.baseline(run.tenant, ctx.signature, "compute")
        ),
        "transfer": Baseline.from_json(
            state.bl_transfer or store.baseline(run.tenant, ctx.signature, "transfer")
        ),
    }
    ctx.coll = state.collectives
    pending = watch = False
    for i, job in enumerate(jobs):
        js = state.attempt(job)
        if job.last_step <= js.done:
            if i + 1 == len(jobs):  # no new step: is the newest attempt hung by its own clock?
                lo = max(job.first_step, job.last_step - RECENT_STEPS)
                m = q.step_matrix(run.run_id, job.job_id, lo, job.last_step, job.world)
                place = q.placement(run.run_id, job.job_id, m.world)
                ctx.found += find_hangs(ctx.q, ctx.run, cfg, now, job, m, place, events, None)
            nxt = jobs[i + 1].start if i + 1 < len(jobs) else None
            late, watching = late_hardware(q, run.run_id, now, job, events, nxt, cfg.device_lag_s)
            ctx.found += late
            ctx.found += late_scalars(q, run, job, js, i + 1 == len(jobs))
            watch = watching or watch
            continue
        lo = js.done + 1
        per = min(cfg.max_steps, max(1, cfg.max_rank_steps // max(job.world, 1)))
        hi = min(job.last_step, lo + per - 1)
        _read_windows(q, run.run_id, job, js, lo, hi, per, max(job.world, run.world))
        m = q.step_matrix(run.run_id, job.job_id, lo, hi, max(job.world, run.world))
        if not len(m.steps) and hi < job.last_step:
            # A gap of steps (a stray step number far ahead): jump to the next step stored
            # instead of walking the gap one window per pass.
            ahead = q.next_step(run.run_id, job.job_id, hi)
            js.done = (ahead - 1) if ahead is not None else job.last_step
            pending = True
            break
        place = q.placement(run.run_id, job.job_id, m.world)
        ctx.found += tp_split(
            ctx.run.config,
            job.job_id,
            (job.first_step, job.last_step),
            job.start,
            place.node,
            place.nvlink_domain,
            m.world,
        )
        nxt = jobs[i + 1].start if i + 1 < len(jobs) else None
        ctx.found += hardware(
            q,
            run.run_id,
            job,
            m,
            place,
            last=hi == job.last_step,
            next_start=placed_until(events, job, nxt, cfg.device_lag_s),
        )
        # A NaN logged after the run's last step row (a step whose time was not finite, or
        # that never completed) still belongs to the last job.
        ctx.found += instability(
            q, run.run_id, job, lo, hi if i + 1 < len(jobs) or hi < job.last_step else 2**62
        )[0]
        if hi == job.last_step:
            js.scalars = ScalarWatch(-1, 0)  # its scalars may still come: late_scalars
            ctx.found += find_hangs(ctx.q, ctx.run, cfg, now, job, m, place, events, nxt)
            watch = watch or device_window(now, job, events, nxt, cfg.device_lag_s) is not None
        js.done = hi
        if len(m.steps):
            js.times = (float(m.start.min()), float(m.end.max()))
        js.steps = (job.first_step, hi)
        pending = pending or hi < job.last_step
        if pending:
            break
    tails: dict[str, RankState] = {}
    for i, job in enumerate(jobs):
        over = i + 1 < len(jobs)
        width = max(job.world, run.world)
        js = state.attempt(job)
        left = _advance_stragglers(ctx, job, js, width, over, tails)
        ended = over or any(e["job_id"] == job.job_id and e["kind"] in STOPS for e in events)
        if left | _advance_blocks(ctx, job, js, width, ended, bl):
            pending = True
            break
    ctx.found += with_oom_climbs(q.r, run.run_id, diagnose_events(events))
    ctx.found += memory_climbs(q.r, run.run_id, cfg, jobs[-1].last_step)
    newest = jobs[-1]
    lost, ending = diagnose_ends(
        events, newest.job_id, max(newest.world, run.world), run.last_seen, now, newest.last_step
    )
    ctx.found += lost
    pending = pending or ending
    ends = (Event.from_row(e) for e in events if e["kind"] == "checkpoint_end")
    ctx.found += diagnose_slow_checkpoints(*save_pauses(ends))
    state.collectives = ctx.coll
    hot = [list(h) for js in state.attempts.values() for h in js.hot]
    attempts = as_json(state.attempts)  # the straggler pass reads them as stored
    stragglers = fold_tp_groups(
        fold_into_racks(
            straggler_findings(ctx.q, run, jobs, attempts, tails), hot, cfg.block_steps
        ),
        ctx.layout,
    )
    state.bl_compute, state.bl_transfer = bl["compute"].to_json(), bl["transfer"].to_json()
    for metric, b in bl.items():
        if b.ready:
            store.save_baseline(run.tenant, ctx.signature, metric, b.to_json())
    return ctx.found, stragglers, pending or watch


def _read_windows(
    q: DetectQueries,
    run_id: str,
    job: JobSpan,
    js: AttemptState,
    lo: int,
    hi: int,
    per: int,
    world: int,
) -> None:
    """One read for the attempt's windows of this pass (the new steps ``lo..hi``, the straggler
    scan's from ``sealed``, the blocks' from ``blocked``), when they are near each other: each
    is then cut from it (:meth:`DetectQueries.step_matrix`)."""
    sealed = job.first_step - 1 if js.sealed is None else js.sealed
    first = min(lo, sealed + 1, js.blocked + 1)
    top = max(hi, min(job.last_step, sealed + per))
    if top - first < 2 * per:
        q.step_matrix(run_id, job.job_id, first, top, world)


def _advance_stragglers(
    ctx: _Ctx,
    job: JobSpan,
    js: AttemptState,
    expected: int,
    superseded: bool,
    tails: dict[str, RankState],
) -> bool:
    """Carry one attempt's straggler state over its *complete* steps, in step order.

    The state is committed only through the last step every rank of the world has reported
    (``sealed``), so what it holds is a function of the data, not of when a pass ran or how the
    rows were batched. The steps after it are scanned from a copy each pass (``tails``), so the
    findings still show them. An incomplete step is committed as it is only when the attempt
    was superseded or it is a whole window (``per`` steps) behind the attempt's newest step:
    its missing rows are lost, or later than the analysis waits. Returns whether work is left.
    """
    sealed = job.first_step - 1 if js.sealed is None else js.sealed  # nothing committed yet
    if sealed >= job.last_step:
        return False
    cfg, q = ctx.cfg, ctx.q
    per = min(cfg.max_steps, max(1, cfg.max_rank_steps // max(job.world, 1)))
    lo = sealed + 1
    hi = min(job.last_step, lo + per - 1)
    m = q.step_matrix(ctx.run.run_id, job.job_id, lo, hi, max(job.world, expected))
    rs = RankState.from_doc(js.stragglers or RankStateDoc(), m.world)
    if not len(m.steps):
        ahead = q.next_step(ctx.run.run_id, job.job_id, hi) if hi < job.last_step else None
        js.sealed = (ahead - 1) if ahead is not None else hi
        js.stragglers = rs.to_doc()
        return hi < job.last_step
    complete = np.isfinite(m.compute).sum(axis=1) >= expected
    overdue = m.steps <= job.last_step - per
    ok = complete | overdue | superseded
    k = len(ok) if ok.all() else int(np.argmin(ok))
    compute = ctx.peers(m.compute)
    if k:
        scan_stragglers(m.steps[:k], compute[:k], rs)
    js.stragglers = rs.to_doc()
    js.sealed = (hi if k == len(ok) else int(m.steps[k]) - 1) if k else sealed
    if k == len(ok):
        return hi < job.last_step
    # The incomplete tail, from a copy of the committed state. Rows that complete it may be
    # older than the run's newest data; their arrival brings the run back to the loop.
    tails[job.job_id] = scan_stragglers(
        m.steps[k:], compute[k:], RankState.from_doc(js.stragglers, m.world)
    )
    return hi < job.last_step


def _advance_blocks(
    ctx: _Ctx,
    job: JobSpan,
    js: AttemptState,
    width: int,
    ended: bool,
    bl: dict[str, Baseline],
) -> bool:
    """The absolute checks (:func:`_blocks`) over whole blocks of committed steps, blocks keyed
    by step number (``first_step + j * block_steps``), so they are the same whatever the passes;
    the last, partial block once the attempt is over. Returns whether work is left."""
    b = ctx.cfg.block_steps
    blocked = js.blocked
    sealed = job.first_step - 1 if js.sealed is None else js.sealed
    if ended and sealed >= job.last_step:
        top = job.last_step
    else:
        top = job.first_step + (sealed - job.first_step + 1) // b * b - 1
    if top <= blocked:
        return False
    per = min(ctx.cfg.max_steps, max(1, ctx.cfg.max_rank_steps // max(width, 1)))
    hi = min(top, blocked + max(b, per // b * b))
    m = ctx.q.step_matrix(ctx.run.run_id, job.job_id, blocked + 1, hi, width)
    if len(m.steps):
        place = ctx.q.placement(ctx.run.run_id, job.job_id, m.world)
        _blocks(ctx, job, m, place, bl, js)
    js.blocked = hi
    return hi < top


def _topology(place: Placement) -> dict[str, list[str]]:
    return {
        "rack": place.rack,
        "switch": place.switch,
        "nvlink_domain": place.nvlink_domain,
        "node": place.node,
    }


def _blocks(
    ctx: _Ctx,
    job: JobSpan,
    m: StepMatrix,
    place: Placement,
    bl: dict[str, Baseline],
    js: AttemptState,
) -> None:
    """Absolute (baseline) checks of compute and transfer, and data stalls, per block of steps."""
    cfg = ctx.cfg
    n = len(m.steps)
    b = cfg.block_steps
    with np.errstate(all="ignore"):
        med = nanmedian(m.compute, axis=1)
        transfer = transfer_times(m.comm)
    step_time = m.end - m.start
    peers = ctx.peers(m.compute)  # a rank against its own pipeline stage
    ids = (m.steps - job.first_step) // b  # blocks by step number, not by row of the window
    cut = [0, *(np.flatnonzero(np.diff(ids)) + 1).tolist(), n]
    for a, z in pairwise(cut):
        if z - a < min(10, n):
            continue
        s0, s1 = int(m.steps[a]), int(m.steps[z - 1])
        t0, t1 = float(m.start[a]), float(m.end[z - 1])
        with np.errstate(all="ignore"):
            rank_vals = nanmedian(peers[a:z], axis=0)
        learning = not bl["compute"].ready
        shifts = localize(rank_vals, bl["compute"], _topology(place), cfg.compute_min_shift)
        peer = not shifts and len(set(place.rack)) > 1
        if peer:  # a hot rack the baseline cannot see: not learned yet, or most of the job
            shifts = outlier_groups(rank_vals, place.rack, cfg.rack_peer_shift)
        hot = []  # while the baseline is learned: racks throttling for heat, not learned
        if learning and not shifts:
            hot = throttled_racks(ctx.q, ctx.signature, job, place, s0, s1, t0, t1, rank_vals)
        for d in hot:
            ctx.found.append(d)
            js.note_hot(d.rack, d.start_step, d.end_step, list(d.ranks))
        for sh in shifts:
            for d in shift_diagnosis(
                ctx.q,
                ctx.signature,
                job,
                sh,
                place,
                bl["compute"],
                s0,
                s1,
                t0,
                t1,
                rank_vals,
                peer=peer,
            ):
                ctx.found.append(d)
                if d.diagnosis == "rack_cooling":
                    js.note_hot(d.rack, d.start_step, d.end_step, list(d.ranks))
        tb = bl["transfer"]
        tr = float(nanmedian(transfer[a:z]))
        slow_transfer = tb.ready and tr / tb.median - 1.0 >= shift_threshold(
            tb, cfg.network_min_shift
        )
        if slow_transfer:
            ctx.found.append(
                network_diagnosis(
                    ctx.q, job, place, tr, tb, s0, s1, t0, t1, _episode(ctx, job, s0, s1)
                )
            )
        stalls = data_stall(
            ctx.q, ctx.run.run_id, job, m, place, a, z, float(nanmedian(step_time[a:z]))
        )
        ctx.found += stalls
        # Each baseline learns from the blocks healthy for its own metric: the transfer (the
        # last arrival's wait) does not move with a slow rank, a hot rack or a late input, nor
        # compute with a slow transfer, so a stall in the first block does not leave the
        # transfer unlearned (and the next blocks, a network fault's, learned as healthy).
        # A block learns up to where its values step up for good (a fault that began in it).
        if not shifts and not stalls and not hot:
            bl["compute"].add(med[a : a + steady_prefix(med[a:z], cfg.compute_min_shift)])
        if not slow_transfer:
            bl["transfer"].add(
                transfer[a : a + steady_prefix(transfer[a:z], cfg.network_min_shift)]
            )

    lay = ctx.layout
    if lay is not None and lay.pp > 1:  # the stages against each other, over the same steps
        tally = tally_stages(
            StageTally.from_json(js.stages),
            m.steps,
            m.compute,
            step_time,
            m.start,
            lay.stages(m.compute.shape[1]),
            lay.pp,
            lay.replicas(m.compute.shape[1]),
            ids,
        )
        js.stages = tally.to_json()
        ctx.found += stage_imbalance(tally, lay, job.job_id, cfg.stage_min_excess)
        ctx.found += batch_imbalance(tally, lay, job.job_id, cfg.batch_min_spread)


def _episode(ctx: _Ctx, job: JobSpan, s0: int, s1: int) -> str:
    """The key of a slow-collective block's episode (:class:`SlowCollectives`), the block
    added to the run's last one."""
    ctx.coll = ctx.coll.after(job, s0, s1)
    return ctx.coll.key
