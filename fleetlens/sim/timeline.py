"""The attempt loop: launch, steps and checkpoints, then a terminating fault or the end.

Bookkeeping of lost work: the steps of a chunk are "pending" until a checkpoint that covers them
is valid (sync: at once; async: when its background write ends). A failure turns every pending
chunk, plus the partial step, into ``rework``; everything else keeps its own category.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .engine import _GAP, _XID, Engine
from .faults import Injected, checkpoint_factor
from .steps import StepChunk

__all__ = ["run_timeline"]


class _Book:
    def __init__(self) -> None:
        # (end step, loss seconds by category, seconds the faults added by category)
        self.pending: list[tuple[int, dict[str, float], dict[str, float]]] = []
        self.async_ckpt: tuple[int, float] | None = None  # (step, valid at)
        self.resume = 0

    def add(self, end: int, c: StepChunk) -> None:
        losses = {"productive": c.productive, "straggler": c.straggler, "data_stall": c.data_stall}
        added = {
            "straggler": c.injected_straggler,
            "data_stall": c.injected_data_stall,
            "stage_imbalance": c.injected_stage,
            "batch_imbalance": c.injected_batch,
        }
        self.pending.append((end, losses, added))

    def commit(self, e: Engine, upto: int) -> None:
        keep = []
        for item in self.pending:
            end, cats, added = item
            if end <= upto:
                for k, v in cats.items():
                    e.loss[k] += v
                for k, v in added.items():
                    e.injected[k] += v
            else:
                keep.append(item)
        self.pending = keep
        self.resume = max(self.resume, upto)

    def poll(self, e: Engine, now: float) -> None:
        if self.async_ckpt and now >= self.async_ckpt[1]:
            self.commit(e, self.async_ckpt[0])
            self.async_ckpt = None

    def lose(self, e: Engine) -> None:
        e.loss["rework"] += sum(sum(c.values()) for _, c, _ in self.pending)
        self.pending = []
        self.async_ckpt = None


def _launch(e: Engine, attempt: int, resume: int, category: str, submit: float) -> None:
    job = e.job
    e.job_ids.append(f"{job.run_id}-a{attempt}")
    e.batcher.add(e.ctx, "placement", *e.place.records(e.t))
    gang = e.t + job.gang_s
    layout: dict[str, Any] = {"config": {"tp": job.tp, "pp": job.pp}} if job.pp > 1 else {}
    # a pipeline job announces its layout, as the SDK's job_start carries the run's config
    e.event(e.t, "job_start", resume, msg=f"attempt {attempt} launched", attempt=attempt, **layout)
    e.event(gang, "gang_complete", resume, world_size=e.world)
    if attempt:
        e.event(e.t, "restart", resume, msg=f"restart from step {resume}", attempt=attempt)
        e.event(
            gang + 1.0, "checkpoint_load", resume, resume_step=resume, duration=job.startup_s / 2
        )
        for f in e.faults:
            if f.kind == "instability" and f.fired and f.job_ids and f.job_ids[-1] != e.job_ids[-1]:
                e.event(e.t, "config_change", resume, key="lr", old=3e-4 * 10, new=3e-4)
    e.sched(submit, e.t, gang, float("nan"), "RUNNING")
    first = e.t + job.startup_s
    e.loss[category] += first - submit
    e.t = first
    e.event(first, "first_step", resume)


def _checkpoint(e: Engine, b: _Book, step: int, force_sync: bool = False) -> None:
    """Save after ``step``. A synchronous save's pause is ``checkpoint`` whatever asked for it
    (a maintenance drain forces one), as the breakdown charges ``checkpoint_begin..end``."""
    job = e.job
    write = job.checkpoint_write_s * checkpoint_factor(e.faults, step - 1)
    sync = not job.checkpoint_async or force_sync
    pause = write if sync else write * job.async_stall_fraction
    ckpt = f"{job.run_id}-step{step}"
    size = int(job.model_params * 14)
    e.event(e.t, "checkpoint_begin", step, checkpoint_id=ckpt, sync=sync)
    e.event(
        e.t + write,
        "checkpoint_end",
        step,
        checkpoint_id=ckpt,
        size_bytes=size,
        sync=sync,
        ok=True,
        duration_s=write,
    )
    for f in e.faults:
        if f.info.mode == "checkpoint" and f.start <= step - 1 < f.end:
            if e.job_ids[-1] not in f.job_ids:
                f.job_ids.append(e.job_ids[-1])
            f.start_time = e.t if f.start_time is None else f.start_time
            f.end_time = e.t + write
    e.loss["checkpoint"] += pause
    if sync:
        e.t += pause
        b.commit(e, step)
    else:
        b.async_ckpt = (step, e.t + write)
        e.t += pause


def _fail(e: Engine, b: _Book, f: Injected, step: int) -> str:
    """The attempt ends during ``step``; returns the category of the gap that follows."""
    job, mode = e.job, f.info.mode
    f.fired = True
    if e.job_ids[-1] not in f.job_ids:
        f.job_ids.append(e.job_ids[-1])
    ranks = [r for r in f.ranks if r < e.world] or [-1]
    rank = ranks[0] if f.kind not in ("network_down", "preemption") else -1
    if f.kind in ("fatal_xid", "ecc_xid", "host_failure", "network_down", "maintenance"):
        live = [e.place.rank_of_gpu(g) for g in f.gpus]
        live = [r for r in live if r >= 0]
        rank = live[0] if live else -1
    node = e.place.name(f.nodes[0]) if f.nodes else ""
    gpu = rank % e.place.gpn if rank >= 0 and f.kind != "host_failure" else -1
    if mode == "drain":
        e.event(e.t, "drain", step, rank, f"drain {node} for maintenance", node, planned=True)
        e.event(e.t, "maintenance", step, msg=f"maintenance on {node}", node=node)
        _checkpoint(e, b, step, force_sync=True)
        f.start_time = f.end_time = e.t
        e.sched_end("COMPLETED")
        e.place.replace(f.nodes[0])
        e.loss["maintenance"] += job.maintenance_s
        e.t += job.maintenance_s
        return "maintenance"
    if mode == "hang":
        c = e.chunk_probe(step)
        stuck = rank if rank >= 0 else 0
        arrive = np.delete(c.arrive[0], stuck)
        t_fail = e.t + float(arrive.max()) + job.hang_timeout_s
        enter = c.arrive[:1].copy()
        leave = np.full_like(enter, t_fail - e.t)
        keep = np.array([r for r in range(e.world) if r != stuck])
        e.collectives(np.array([step]), np.array([e.t]), enter[:, keep], leave[:, keep], keep)
        # Every process stays alive until the watchdog: the stuck rank idle after step - 1, the
        # others inside the collective of step.
        hb_steps = np.full(e.world, step)
        hb_steps[stuck] = step - 1
        phases = ["comm"] * e.world
        phases[stuck] = "idle"
        e.heartbeats(e.t, t_fail, hb_steps, phases, e.t + c.arrive[0])
        e.loss["hang"] += t_fail - e.t
        b.poll(e, e.t)
        b.lose(e)
        e.event(
            t_fail,
            "hang",
            step,
            -1,
            f"NCCL watchdog: all_reduce seq {step} timed out after {job.hang_timeout_s:.0f}s",
            timeout_s=job.hang_timeout_s,
        )
        detect = 0.0
    else:
        t_fail = e.t + float(f.params.get("at_fraction", 0.5)) * job.step_time
        b.poll(e, t_fail)
        b.lose(e)
        e.loss["rework"] += t_fail - e.t
        _fault_events(e, f, step, rank, node, gpu, t_fail)
        detect = job.detect_s if mode == "fatal" else 0.0
    f.start_time = t_fail if f.start_time is None else f.start_time
    f.end_time = t_fail
    e.event(
        t_fail + detect,
        "failure",
        step,
        rank,
        f"attempt {e.job_ids[-1]} failed: {f.kind}",
        node,
        gpu,
        cause=f.info.diagnosis,
    )
    e.t = t_fail
    e.flush_events()
    e.sched_end("PREEMPTED" if mode == "preempt" else "FAILED")
    if f.kind in ("fatal_xid", "ecc_xid", "host_failure", "network_down") and f.nodes:
        spare = e.place.replace(f.nodes[0])
        if spare is not None:
            # unplanned: a consequence of the failure, not maintenance (the seed's "planned drains")
            e.event(
                t_fail + detect,
                "drain",
                step,
                -1,
                f"{node} drained after {f.kind}",
                node,
                planned=False,
            )
    gap_cat = _GAP[mode]
    gap = detect + job.restart_s + (job.preempt_wait_s if mode == "preempt" else 0.0)
    e.loss[gap_cat] += gap
    e.t += gap
    return gap_cat


def _fault_events(
    e: Engine, f: Injected, step: int, rank: int, node: str, gpu: int, t: float
) -> None:
    kind = f.info.event
    if f.kind in _XID or f.kind == "fatal_xid":
        xid = int(f.params.get("xid", _XID.get(f.kind, 79)))
        e.event(
            t,
            "hardware_fault",
            step,
            rank,
            f"NVRM: Xid {xid} on {node} GPU {gpu}",
            node,
            gpu,
            xid=xid,
        )
        e.xid_sample(t, rank, xid)
    elif kind == "nan":
        e.event(t, "nan", step, 0, "loss is NaN", loss=float("nan"))
        e.scalar(t, step, "loss", float("nan"))
    elif kind == "oom":
        e.scalar(t, step, "seq_len", float(f.params.get("seq_len", 32768)), rank)
        e.event(t, "oom", step, rank, "CUDA out of memory", node, gpu, seq_len=32768)
    elif kind == "exception":
        e.event(t, "exception", step, rank, "RuntimeError in training loop", node, gpu)
    elif kind == "preemption":
        e.event(t, "preemption", step, -1, "preempted by a higher-priority job")
    elif f.kind == "host_failure":
        e.event(t, "hardware_fault", step, -1, f"{node} unreachable", node, component="host")
    else:
        e.event(t, "hardware_fault", step, -1, f"link down on {node}", node, component="nic")


def run_timeline(e: Engine) -> None:
    job = e.job
    total = job.steps
    b = _Book()
    step, attempt, cat = 0, 0, "startup"
    max_k = max(1, e.scn.emission.batch_rows // e.world)
    if e.speed > 0:
        max_k = min(max_k, max(1, int(2.0 * e.speed / job.step_time)))
    while step < total:
        _launch(e, attempt, step, cat, e.t)
        term = _next_terminator(e.faults, step)
        stop = min(total, term.trigger) if term else total
        while step < stop:
            boundary = (step // job.checkpoint_every + 1) * job.checkpoint_every
            end = min(stop, boundary, step + max_k)
            b.add(end, e.chunk(step, end))
            step = end
            if step in (boundary, total):
                _checkpoint(e, b, step)
            b.poll(e, e.t)
            e.pace()
        if term is None or step >= total:
            b.poll(e, float("inf"))
            b.commit(e, total)
            e.event(e.t, "finish", total, msg="training finished")
            e.flush_events()
            e.sched_end("COMPLETED")
            break
        cat = _fail(e, b, term, step)
        step = b.resume
        attempt += 1
        e.pace()
    e.flush_events()
    e.batcher.flush()


def _next_terminator(faults: list[Injected], step: int) -> Injected | None:
    cands = [f for f in faults if f.trigger >= step and not f.fired]
    return min(cands, key=lambda f: f.trigger) if cands else None
