"""Draining for the server's remediation controller: the stop vote, drain, resume.

``stop_requested`` agrees on the stop step through an all-reduce on a side gloo group, launched
at one vote boundary and read at the next (about four votes a second), so it never waits on the
hot path; ``drain`` writes a verified checkpoint (rank 0), reports it, and exits with
``DRAIN_EXIT_CODE`` when the server says the node is out, so torchrun's agents re-form the job
without it; ``resume`` loads the newest verified checkpoint after the restart.
``await_removal`` is for a worker whose device is gone (a fatal Xid): it cannot train, so it waits
for the server to take its node out instead of failing the job's restarts one after another.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from ..sdk.control import DRAIN_EXIT_CODE, ControlChannel
from ..sdk.run import Run
from .checkpoint import latest_checkpoint, load, save_verified


class Drain:
    """TorchRun's drain half: stop at a step boundary, checkpoint, leave (or train on)."""

    run: Run
    errors: int
    # The position the control channel reports: set by the step timing.
    _step_n: int
    _seq: int

    def _init_drain(self) -> None:
        self.control_interval = float(os.environ.get("FLEETLENS_CONTROL_INTERVAL", "2") or 2)
        self._channel: ControlChannel | None = None
        self._ctl_group: Any = None
        self._vote: tuple[Any, torch.Tensor] | None = None
        self.vote_interval_s = 0.25  # how often (wall-clock) the ranks vote on a drain
        self._next_vote = -1  # the step boundary of the next vote; the same on every rank
        self._last_boundary = (-1, 0.0)  # (step, perf_counter) of the previous call
        # After resuming: (the remediation that caused it or 0, step, load seconds, loaded at)
        self._resumed: tuple[int, int, float, float] | None = None

    def _open_channel(self) -> ControlChannel:
        if self._channel is None:
            ch = getattr(self.run, "_control", None)  # opened already (trace capture)
            if isinstance(ch, ControlChannel):
                ch._position = lambda: (self._step_n, self._seq)
                ch.interval = self.control_interval
                ch.acts = True  # the job drains now: remediation may count on it
                self._channel = ch
                return ch
            ch = ControlChannel(
                self.run.config,
                lambda: (self._step_n, self._seq),
                interval=self.control_interval,
                flush=self.run.flush,
            )
            if self.run.config.enabled:
                ch.start()
                self.run._control = ch
            self._channel = ch
        return self._channel

    def stop_requested(self, step: int) -> bool:
        """At a step boundary, on every rank: True when the server asked this job to drain.

        Every rank gets the same answer at the same step. At a vote boundary each rank launches
        an all-reduce (MAX) of ["a drain is pending here", "steps until the next vote"] on a
        side gloo group and reads the one launched at the previous vote, which has long
        finished: nothing waits on the hot path, and the votes are spaced so that there are
        about four a second whatever the step time (the spacing is agreed through the same
        all-reduce, so every rank votes at the same steps). Call it every step, on every rank."""
        try:
            ch = self._open_channel()
            if self._resumed is not None and step > self._resumed[1]:
                aid, at, load_s, loaded = self._resumed
                self._resumed = None
                ch.ack(
                    aid,
                    "resumed",
                    step=at,
                    world=self.run.config.world_size,
                    loadS=load_s,
                    loadedAt=loaded,
                )
            local = 1 if ch.pending("stop") is not None else 0
            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
                return bool(local)
            now = time.perf_counter()
            last_step, last_t = self._last_boundary
            self._last_boundary = (step, now)
            if step < self._next_vote:
                return False
            if self._ctl_group is None:
                self._ctl_group = dist.new_group(backend="gloo")
            per_step = (now - last_t) / (step - last_step) if 0 <= last_step < step else 0.0
            every = min(1000, max(1, math.ceil(self.vote_interval_s / per_step))) if per_step else 1
            vote = torch.tensor([local, every], dtype=torch.int32)
            work = dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self._ctl_group, async_op=True)
            prev, self._vote = self._vote, (work, vote)
            if prev is None:
                self._next_vote = step + 1
                return False
            prev[0].wait()
            stop, agreed = (int(x) for x in prev[1].tolist())
            self._next_vote = step + max(1, agreed)
            return stop > 0
        except Exception:
            self.errors += 1
            return False

    def drain(self, step: int, state: Any, directory: str, *, timeout: float = 600.0) -> None:
        """Carry out the server's drain at this boundary (``step`` is the first step not run).

        Rank 0 writes ``state`` (or ``state()``) as a verified checkpoint; every rank reports
        that it stopped, then waits for the server: when the node is out it exits with
        ``DRAIN_EXIT_CODE`` (torchrun restarts the workers without it); if the server cancels
        the drain, or is silent past ``timeout``, this returns and training goes on."""
        ch = self._open_channel()
        deadline = time.monotonic() + timeout
        # The vote may have stopped this rank before its own poll saw the instruction.
        action = ch.pending("stop")
        while action is None and time.monotonic() < deadline:
            ch.next_poll(ch.cadence + 1.0, now=True)
            action = ch.pending("stop")
        if action is None:
            self.errors += 1
            return
        aid = int(action["id"])
        ch.ack(aid, "stopped", step=step)
        if self.run.config.rank == 0:
            t0 = time.time()
            try:
                obj = state() if callable(state) else state
                manifest = save_verified(self.run, obj, directory, step, remediation=aid)
                ch.ack(aid, "checkpointed", step=step, started=t0, checkpoint=manifest)
            except Exception as exc:
                self.errors += 1
                ch.ack(aid, "checkpoint_failed", step=step, error=repr(exc)[:500])
        while time.monotonic() < deadline:
            ch.next_poll(ch.cadence + 1.0)  # at the channel's cadence: 10,000 ranks wait here
            a = ch.action
            if a is None or int(a.get("id", 0)) != aid:
                self.errors += 1  # cancelled or superseded: train on
                return
            if a.get("phase") == "restart":
                ch.exiting.set()
                self.run.flush(5.0)
                sys.exit(DRAIN_EXIT_CODE)
            if a.get("phase") == "resume":
                return
        self.errors += 1

    def await_removal(self, timeout: float = 120.0) -> None:
        """This worker's device is gone (a fatal Xid took the GPU): it cannot train, vote or
        checkpoint. Failing at once would make the launcher restart the job around this node
        again and again (each time a restart of every node); instead it polls the control
        channel until the server takes the node out -- ``remove``: the channel stops this
        node's launcher agent, which stops this worker. Returns only if that has not happened
        within ``timeout`` seconds (the caller then raises its device error)."""
        ch = self._open_channel()
        if not ch.alive:  # fleetlens is off: nobody will take the node out
            return
        deadline = time.monotonic() + timeout
        ch.next_poll(ch.cadence + 1.0, now=True)
        while time.monotonic() < deadline:
            ch.next_poll(ch.cadence + 1.0)

    def resume(self, directory: str, **load_kwargs: Any) -> tuple[int, Any] | None:
        """The newest verified checkpoint in ``directory``: (first step to run, the state)."""
        found = latest_checkpoint(directory)
        if found is None:
            return None
        manifest, path = found
        t0 = time.perf_counter()
        obj = load(self.run, path, int(manifest["step"]), **load_kwargs)
        load_s = time.perf_counter() - t0
        if self.run.config.restart_count > 0 or manifest.get("remediation"):
            aid = int(manifest.get("remediation") or 0)
            self._resumed = (aid, int(manifest["step"]), load_s, time.time())
        return int(manifest["step"]), obj
