"""The run timeline: attempts, steps, checkpoints, failures, restarts, and every record.

A run is a sequence of job attempts ``<run>-a<n>``. Each attempt launches (startup), runs
steps in chunks that end at checkpoint boundaries and at the next terminating fault, and ends
with the run's last step or a fault: a fatal fault loses the steps since the last valid
checkpoint (they are replayed by the next attempt, so they appear under both job ids), a hang
stops until the watchdog fires, a preemption waits for capacity, a maintenance drain checkpoints
first. Every second of wall clock is charged to exactly one loss category (see truth.py).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .devices import DeviceSampler
from .emit import Batcher, Sink
from .faults import Injected, chunk_effects
from .model import Scenario
from .placement import Placement
from .steps import PHASE_SPLIT, StepChunk, simulate_chunk
from .truth import LOSS_CATEGORIES

__all__ = ["Engine"]

Arr = np.ndarray[Any, Any]
HEARTBEAT_S = 10.0
"""The SDK's default heartbeat period (``SDKConfig.heartbeat_s``)."""
_GAP = {"fatal": "recovery", "hang": "recovery", "preempt": "preemption", "drain": "maintenance"}
_XID = {"fatal_xid": 79, "ecc_xid": 48}


class Engine:
    def __init__(
        self,
        scn: Scenario,
        faults: list[Injected],
        sink: Sink,
        *,
        seed: int,
        speed: float,
        start_time: float,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.scn, self.job, self.faults = scn, scn.job, faults
        self.world = scn.world_size
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.speed = speed
        self.t = self.t0 = start_time
        self.batcher = Batcher(sink, scn.emission.batch_rows)
        self.place = Placement(scn.cluster, self.world)
        self.devices = DeviceSampler(
            start_time, scn.emission.sample_s, self.place.n_gpus, self.place.n_nodes, seed
        )
        self.loss = dict.fromkeys(LOSS_CATEGORIES, 0.0)
        self.injected = {
            "straggler": 0.0,
            "data_stall": 0.0,
            "stage_imbalance": 0.0,
            "batch_imbalance": 0.0,
        }
        self.job_ids: list[str] = []
        self.progress = progress or (lambda msg: print(msg, file=sys.stderr))
        self.wall0 = time.monotonic()
        self.events: list[tuple[Any, ...]] = []
        offs = self.rng.standard_normal(self.world) * scn.noise.rank_offset_cov
        self.offsets = np.clip(offs, -0.5, 2.0)
        self.tokens = np.full(self.world, self.job.tokens_per_step // self.world, dtype=np.int64)
        self.tokens[0] += self.job.tokens_per_step - int(self.tokens.sum())
        self.last_progress = time.monotonic()
        self.alloc: tuple[float, float, float] = (start_time, start_time, start_time)
        self.down: list[tuple[float, float, int]] = []

    # ---- records -------------------------------------------------------------------------
    @property
    def ctx(self) -> dict[str, str]:
        c = {"run_id": self.job.run_id, "job_id": self.job_ids[-1], "project": self.job.project}
        if self.job.tenant:
            c["tenant"] = self.job.tenant
        return c

    def event(
        self,
        t: float,
        kind: str,
        step: int = -1,
        rank: int = -1,
        msg: str = "",
        node: str = "",
        gpu: int = -1,
        **attrs: Any,
    ) -> None:
        self.events.append((t, kind, step, rank, node, gpu, msg, json.dumps(attrs, default=str)))

    def flush_events(self) -> None:
        if not self.events:
            return
        cols = list(zip(*self.events, strict=True))
        names = ("time", "kind", "step", "rank", "node_id", "gpu", "message", "attrs")
        data: dict[str, Any] = {n: list(c) for n, c in zip(names, cols, strict=True)}
        for n in ("time", "step", "rank", "gpu"):
            data[n] = np.asarray(data[n])
        self.batcher.add(self.ctx, "event", len(self.events), data)
        self.events = []

    def pace(self) -> None:
        """Flush, then sleep until the wall clock catches up with simulated time / speed."""
        self.flush_events()
        if self.speed > 0:
            self.batcher.flush()
            ahead = (self.t - self.t0) / self.speed - (time.monotonic() - self.wall0)
            if ahead > 0:
                time.sleep(ahead)
        now = time.monotonic()
        if now - self.last_progress > 5.0:
            self.last_progress = now
            done = sum(self.batcher.total.values())
            self.progress(
                f"sim {self.job.run_id}: {self.job_ids[-1]} t+{self.t - self.t0:,.0f}s, "
                f"{done:,} records"
            )

    # ---- one chunk of steps ---------------------------------------------------------------
    def chunk(self, s0: int, s1: int) -> StepChunk:
        steps = np.arange(s0, s1)
        phys = self.place.phys
        eff = chunk_effects(self.faults, steps, phys, self.job.step_time, self.seed)
        c = simulate_chunk(steps, self.t, self.job, self.scn.noise, self.offsets, eff, self.rng)
        self.emit_steps(c)
        self.emit_scalars(c)
        self.emit_samples(c)
        for f in self.faults:
            if f.info.mode in ("slow", "checkpoint") or f.kind == "ecc_xid":
                self.note_window(f, c)
        self.t = c.end
        return c

    def note_window(self, f: Injected, c: StepChunk) -> None:
        s0, s1 = int(c.steps[0]), int(c.steps[-1]) + 1
        if f.end <= s0 or f.start >= s1:
            return
        if self.job_ids[-1] not in f.job_ids:
            f.job_ids.append(self.job_ids[-1])
        if f.start_time is None and s0 <= f.start < s1:
            f.start_time = float(c.starts[f.start - s0])
        if f.end_time is None and s0 < f.end <= s1 and f.info.mode != "fatal":
            i = f.end - 1 - s0
            f.end_time = float(c.starts[i] + c.step_time[i])

    def emit_steps(self, c: StepChunk) -> None:
        k, w = c.compute.shape
        n = k * w
        comp = c.compute.ravel()
        cols = {
            "step": np.repeat(c.steps, w),
            "rank": np.tile(np.arange(w, dtype=np.int32), k),
            "time": np.repeat(c.starts, w),
            "duration": c.duration.ravel(),
            "data_wait": c.data_wait.ravel(),
            "forward": comp * PHASE_SPLIT[0],
            "backward": comp * PHASE_SPLIT[1],
            "optimizer": comp * PHASE_SPLIT[2],
            "comm": c.comm.ravel(),
            "tokens": np.tile(self.tokens, k),
        }
        self.batcher.add(self.ctx, "step", n, cols)
        em = self.scn.emission
        every = max(1, em.collective_every)
        rows = np.flatnonzero(c.steps % every == 0)
        ranks = np.arange(w if em.collective_ranks <= 0 else min(w, em.collective_ranks))
        if len(rows):
            self.collectives(
                c.steps[rows],
                c.starts[rows],
                c.arrive[np.ix_(rows, ranks)],
                c.duration[np.ix_(rows, ranks)],
                ranks,
            )

    def collectives(self, steps: Arr, starts: Arr, enter: Arr, leave: Arr, ranks: Arr) -> None:
        k, w = enter.shape
        grad_bytes = int(self.job.model_params * 2 / (self.job.tp * self.job.pp))
        self.batcher.add(
            self.ctx,
            "collective",
            k * w,
            {
                "step": np.repeat(steps, w),
                "rank": np.tile(ranks.astype(np.int32), k),
                "seq": np.repeat(steps, w),
                "op": (["all_reduce"], np.zeros(k * w, np.uint32)),
                "group": (["dp"], np.zeros(k * w, np.uint32)),
                "enter": (starts[:, None] + enter).ravel(),
                "exit": (starts[:, None] + leave).ravel(),
                "bytes": np.full(k * w, grad_bytes, dtype=np.int64),
            },
        )

    def heartbeats(self, t0: float, t1: float, steps: Arr, phases: list[str], since: Arr) -> None:
        """What the SDK of every rank sends while its process is alive and no step ends: one
        heartbeat per rank every ``HEARTBEAT_S`` over [t0, t1) (``steps``, ``phases``, ``since``
        per rank)."""
        times = np.arange(t0 + HEARTBEAT_S, t1, HEARTBEAT_S)
        k, w = len(times), len(steps)
        if not k or not w:
            return
        names = sorted(set(phases))
        codes = np.asarray([names.index(p) for p in phases], dtype=np.uint32)
        self.batcher.add(
            self.ctx,
            "heartbeat",
            k * w,
            {
                "time": np.repeat(times, w),
                "rank": np.tile(np.arange(w, dtype=np.int32), k),
                "step": np.tile(steps.astype(np.int64), k),
                "phase": (names, np.tile(codes, k)),
                "since": np.tile(since.astype(np.float64), k),
            },
        )

    def emit_scalars(self, c: StepChunk) -> None:
        k = len(c.steps)
        s = c.steps.astype(float)
        loss = 2.1 + 8.5 * np.exp(-s / 2000.0) + 0.02 * self.rng.standard_normal(k)
        gnorm = 1.0 + 0.08 * self.rng.standard_normal(k)
        lr = np.full(k, 3e-4)
        for f in self.faults:
            if f.kind == "instability" and not f.fired:
                act = (c.steps >= f.start) & (c.steps < f.end)
                ramp = np.clip((c.steps - f.start + 1) / max(1, f.end - f.start), 0, 1)
                gnorm = np.where(act, gnorm * (1.0 + 40.0 * ramp**3), gnorm)
                loss = np.where(act, loss * (1.0 + 0.3 * ramp**3), loss)
                lr = np.where(act, 3e-4 * float(f.params.get("lr_factor", 10.0)), lr)
        names = ["loss", "grad_norm", "lr"]
        self.batcher.add(
            self.ctx,
            "scalar",
            3 * k,
            {
                "step": np.tile(c.steps, 3),
                "rank": np.zeros(3 * k, np.int32),
                "time": np.tile(c.starts + c.step_time, 3),
                "name": (names, np.repeat(np.arange(3, dtype=np.uint32), k)),
                "value": np.concatenate([loss, gnorm, lr]),
            },
        )

    def emit_samples(self, c: StepChunk) -> None:
        ts = self.devices.grid(float(c.starts[0]), c.end)
        if not len(ts):
            return
        p = self.place
        g = self.devices.gpu(c, ts, p.phys, self.faults)
        s = len(ts)
        g["node_id"] = (p.node_names, np.tile(p.rank_slot, s))
        g["gpu"] = np.tile(p.rank_gpu, s)
        g["gpu_uuid"] = (p.uuids, np.tile(np.arange(self.world, dtype=np.uint32), s))
        self.batcher.add(self.ctx, "gpu", s * self.world, g)
        nd = self.devices.node(c, ts, p.slot_nodes, self.faults)
        nd["node_id"] = (p.node_names, np.tile(np.arange(len(p.slot_nodes), dtype=np.uint32), s))
        self.batcher.add(self.ctx, "node", s * len(p.slot_nodes), nd)

    # ---- scheduler and one-off records ----------------------------------------------------
    def sched(self, submit: float, start: float, gang: float, end: float, state: str) -> None:
        self.alloc = (submit, start, gang)
        self.batcher.add(
            self.ctx,
            "sched_alloc",
            1,
            {
                "pool": [self.scn.pool.name],
                "job_id": [self.job_ids[-1]],
                "run_id": [self.job.run_id],
                "gpus": np.array([self.world]),
                "submit": np.array([submit]),
                "start": np.array([start]),
                "gang_complete": np.array([gang]),
                "end": np.array([end]),
                "state": [state],
            },
        )

    def sched_end(self, state: str) -> None:
        self.sched(*self.alloc, self.t, state)
        self.down.append((self.t, self.t + self.job.restart_s, self.place.gpn))

    def scalar(self, t: float, step: int, name: str, value: float, rank: int = 0) -> None:
        self.batcher.add(
            self.ctx,
            "scalar",
            1,
            {
                "step": np.array([step]),
                "rank": np.array([max(rank, 0)], np.int32),
                "time": np.array([t]),
                "name": [name],
                "value": np.array([value]),
            },
        )

    def xid_sample(self, t: float, rank: int, xid: int) -> None:
        """The DCGM sample that carries the XID (``DCGM_FI_DEV_XID_ERRORS``)."""
        if rank < 0:
            return
        p = self.place
        self.batcher.add(
            self.ctx,
            "gpu",
            1,
            {
                "time": np.array([t]),
                "node_id": [p.node_names[int(p.rank_slot[rank])]],
                "gpu": np.array([p.rank_gpu[rank]]),
                "gpu_uuid": [p.uuids[rank]],
                "xid": np.array([float(xid)]),
                "ecc_dbe_total": np.array([1.0 if xid == 48 else 0.0]),
                "ecc_sbe_total": np.array([self.devices.sbe[p.phys[rank]]]),
            },
        )

    def chunk_probe(self, step: int) -> StepChunk:
        """Arrivals of one step without emitting it (the step a hang never finishes)."""
        steps = np.array([step])
        eff = chunk_effects(self.faults, steps, self.place.phys, self.job.step_time, self.seed)
        noise = self.scn.noise
        return simulate_chunk(steps, self.t, self.job, noise, self.offsets, eff, self.rng)
