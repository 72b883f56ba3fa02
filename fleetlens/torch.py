"""PyTorch integration: device-aware step timing, data wait, DDP collectives, training signals.

``pip install 'fleetlens[torch]'``; nothing here is imported by ``import fleetlens``.

    import fleetlens, fleetlens.torch
    run = fleetlens.init(project="llm")
    tr = fleetlens.torch.TorchRun(run, device)
    tr.watch_ddp(ddp_model)                     # every gradient all-reduce: enter and exit
    for i, batch in enumerate(tr.loader(loader)):   # time waiting for the loader
        with tr.step(i, tokens=batch.numel()):
            with tr.phase("forward"): loss = ddp_model(batch)
            with tr.phase("backward"): loss.backward()
            with tr.phase("optimizer"): opt.step()
        tr.log(i, loss=loss, optimizer=opt)

Timing never synchronizes the device on the hot path. On CUDA, a step and its phases are timed
with CUDA events that are read back later, when the device has passed them (``query()``), and
recorded then; on CPU, host timers are exact. In DDP the backward pass blocks until every rank's
gradients are reduced, so its time is split at the moment the last local bucket was ready:
before it is this rank's compute, after it is waiting for the others (``comm``). A slow rank
therefore shows as the longest compute and the shortest wait, and each collective records when
this rank entered and left it, so the last arriver is found without synchronized clocks.

Draining for the server's remediation controller (docs/remediation.md)::

    start, state = tr.resume(ckpt_dir) or (0, None)     # newest verified checkpoint
    for step in range(start, total):
        if tr.stop_requested(step):                     # same answer on every rank
            tr.drain(step, lambda: {"model": ..., "optim": ...}, ckpt_dir)
        ...

``stop_requested`` agrees on the stop step through an all-reduce on a side gloo group, launched
at one vote boundary and read at the next (about four votes a second), so it never waits on the
hot path; ``drain`` writes a
verified checkpoint (rank 0), reports it, and exits with ``DRAIN_EXIT_CODE`` when the server
says the node is out, so torchrun's agents re-form the job without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from .sdk.control import DRAIN_EXIT_CODE, ControlChannel
from .sdk.run import Run

__all__ = ["DRAIN_EXIT_CODE", "TorchRun", "latest_checkpoint", "load", "save", "save_verified"]

_MAX_PENDING = 64  # CUDA steps awaiting read-back; older ones are dropped (and counted)


def _item(x: Any) -> float:
    if isinstance(x, torch.Tensor):
        return float(x.detach().float().item())
    return float(x)


class _CudaStep:
    """Events of one step on the device, read back once the device has passed them."""

    __slots__ = ("events", "n", "tokens", "wall")

    def __init__(self, n: int, tokens: int, wall: float) -> None:
        self.n, self.tokens, self.wall = n, tokens, wall
        self.events: dict[str, list[Any]] = {}


class _Span:
    __slots__ = ("_enter", "_exit")

    def __init__(self, enter: Any, exit_: Any) -> None:
        self._enter, self._exit = enter, exit_

    def __enter__(self) -> _Span:
        self._enter()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._exit(ev)


class TorchRun:
    """A fleetlens Run with PyTorch-aware timing. Never raises into the training loop."""

    def __init__(
        self, run: Run, device: torch.device | str | None = None, event_factory: Any = None
    ) -> None:
        self.run = run
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        # A test can pass a stand-in for torch.cuda.Event; on a GPU host it is the real one.
        self._event = event_factory or (torch.cuda.Event if self.cuda else None)
        self._pending: deque[_CudaStep] = deque()
        self._current: _CudaStep | None = None
        self._sdk_step: Any = None
        self._data_wait = 0.0
        self._step_n = -1
        self._seq = 0
        self._last_bucket = 0.0
        self.dropped_steps = 0
        self.errors = 0
        self.control_interval = float(os.environ.get("FLEETLENS_CONTROL_INTERVAL", "2") or 2)
        self._channel: ControlChannel | None = None
        self._ctl_group: Any = None
        self._vote: tuple[Any, torch.Tensor] | None = None
        self.vote_interval_s = 0.25  # how often (wall-clock) the ranks vote on a drain
        self._next_vote = -1  # the step boundary of the next vote; the same on every rank
        self._last_boundary = (-1, 0.0)  # (step, perf_counter) of the previous call
        # After resuming: (the remediation that caused it or 0, step, load seconds, loaded at)
        self._resumed: tuple[int, int, float, float] | None = None

    # -- steps and phases ---------------------------------------------------------------------

    def step(self, n: int, *, tokens: int = 0) -> _Span:
        def enter() -> None:
            self._step_n = n
            self._seq = 0
            wait, self._data_wait = self._data_wait, 0.0
            if self.cuda:
                self._resolve()
                self._current = _CudaStep(n, tokens, time.time())
                self._mark("step")
                if wait:
                    self._current.events.setdefault("host_data", []).append(wait)
            else:
                self._sdk_step = self.run.step(n, tokens=tokens)
                self._sdk_step.__enter__()
                if wait:
                    self.run.add_phase("data", wait)

        def exit_(ev: BaseException | None) -> None:
            try:
                if self.cuda:
                    self._mark("step")
                    if self._current is not None:
                        if len(self._pending) >= _MAX_PENDING:
                            self._pending.popleft()
                            self.dropped_steps += 1
                        self._pending.append(self._current)
                        self._current = None
                elif self._sdk_step is not None:
                    s, self._sdk_step = self._sdk_step, None
                    s.__exit__(type(ev) if ev else None, ev, None)
            except Exception:
                self.errors += 1

        return _Span(self._guard(enter), exit_)

    def phase(self, name: str) -> _Span:
        state = {"t0": 0.0, "bucket0": 0.0}

        def enter() -> None:
            if self.cuda:
                self._mark(name)
            state["t0"] = time.perf_counter()
            state["bucket0"] = self._last_bucket

        def exit_(ev: BaseException | None) -> None:
            try:
                if self.cuda:
                    self._mark(name)
                    return
                t1 = time.perf_counter()
                spent = t1 - state["t0"]
                last = self._last_bucket
                if name == "backward" and last > state["bucket0"] and state["t0"] < last <= t1:
                    # DDP: after the last local bucket was ready, backward() only waited.
                    self.run.add_phase("backward", last - state["t0"])
                    self.run.add_phase("comm", t1 - last)
                else:
                    self.run.add_phase(name, spent)
            except Exception:
                self.errors += 1

        return _Span(self._guard(enter), exit_)

    def loader(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield from a DataLoader, charging the time spent waiting to the next step's data."""
        it = iter(iterable)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            wait = time.perf_counter() - t0
            if self._sdk_step is not None or self._current is not None:
                self.run.add_phase("data", wait)  # fetched inside a step
            else:
                self._data_wait += wait
            yield batch

    # -- drain: stop at a step boundary, checkpoint, leave ------------------------------------

    def _open_channel(self) -> ControlChannel:
        if self._channel is None:
            ch = ControlChannel(
                self.run.config,
                lambda: (self._step_n, self._seq),
                interval=self.control_interval,
                flush=self.run.flush,
            )
            if self.run.config.enabled:
                ch.start()
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

    # -- CUDA event read-back -------------------------------------------------------------------

    def _mark(self, name: str) -> None:
        if self._current is None or self._event is None:
            return
        ev = self._event(enable_timing=True)
        ev.record()
        self._current.events.setdefault(name, []).append(ev)

    def _resolve(self) -> None:
        """Record every pending step the device has finished; never waits for one."""
        while self._pending:
            st = self._pending[0]
            marks = st.events.get("step", [])
            if len(marks) < 2 or not marks[1].query():
                return
            self._pending.popleft()
            phases: dict[str, float] = {}
            for name, evs in st.events.items():
                if name in ("step", "host_data"):
                    continue
                phases[name] = sum(
                    evs[i].elapsed_time(evs[i + 1]) / 1000.0 for i in range(0, len(evs) - 1, 2)
                )
            if "host_data" in st.events:
                phases["data"] = float(sum(st.events["host_data"]))
            self.run.record_step(
                st.n,
                time=st.wall,
                duration=marks[0].elapsed_time(marks[1]) / 1000.0,
                phases=phases,
                tokens=st.tokens,
            )

    def flush(self) -> None:
        """At the end of training: wait for the device once and record the remaining steps."""
        try:
            if self.cuda and self._pending:
                torch.cuda.synchronize(self.device)
            self._resolve()
        except Exception:
            self.errors += 1

    # -- collectives ----------------------------------------------------------------------------

    def watch_ddp(
        self,
        model: torch.nn.parallel.DistributedDataParallel,
        group: Any = None,
        name: str = "default",
    ) -> None:
        """Replace DDP's all-reduce with one that records each bucket's enter and exit."""
        world = dist.get_world_size(group)

        def hook(_state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
            tensor = bucket.buffer()
            enter = time.time()
            self._last_bucket = time.perf_counter()
            seq, step = self._seq, self._step_n
            self._seq += 1
            nbytes = tensor.numel() * tensor.element_size()
            fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

            def done(f: torch.futures.Future[Any]) -> torch.Tensor:
                self.run.collective(
                    step=step,
                    seq=seq,
                    op="all_reduce",
                    group=name,
                    enter=enter,
                    exit=time.time(),
                    bytes=nbytes,
                )
                result: torch.Tensor = f.value()[0].div_(world)
                return result

            return fut.then(done)  # type: ignore[no-any-return]

        # DDP checks the hook's annotations as objects; this module's are strings.
        hook.__annotations__ = {
            "_state": object,
            "bucket": dist.GradBucket,  # type: ignore[attr-defined]
            "return": torch.futures.Future[torch.Tensor],
        }
        model.register_comm_hook(None, hook)

    def all_reduce(
        self, tensor: torch.Tensor, group: Any = None, name: str = "default", op: Any = None
    ) -> None:
        """An explicit all-reduce, recorded like DDP's (blocking, as dist.all_reduce is)."""
        enter = time.time()
        seq = self._seq
        self._seq += 1
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM, group=group)
        self.run.collective(
            step=self._step_n,
            seq=seq,
            op="all_reduce",
            group=name,
            enter=enter,
            exit=time.time(),
            bytes=tensor.numel() * tensor.element_size(),
        )

    # -- training signals -----------------------------------------------------------------------

    def log(
        self,
        step: int,
        *,
        loss: Any = None,
        optimizer: Any = None,
        scaler: Any = None,
        model: Any = None,
        memory: bool = False,
        **scalars: Any,
    ) -> None:
        """Loss, learning rate, loss scale, grad norm, NaN/Inf and device memory for ``step``.

        Reading a device tensor synchronizes with the device; call this at your log interval.
        ``model`` computes the gradient norm (after backward, before zero_grad).
        """
        try:
            out: dict[str, float] = {k: _item(v) for k, v in scalars.items()}
            if loss is not None:
                out["loss"] = _item(loss)
            if optimizer is not None:
                out["lr"] = float(optimizer.param_groups[0]["lr"])
            if scaler is not None and scaler.is_enabled():
                out["loss_scale"] = float(scaler.get_scale())
            if model is not None:
                grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
                if grads:
                    norm = torch.linalg.vector_norm(
                        torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
                    )
                    out["grad_norm"] = _item(norm)
            if memory and self.cuda:
                out["mem_allocated_bytes"] = float(torch.cuda.memory_allocated(self.device))
                out["mem_max_allocated_bytes"] = float(torch.cuda.max_memory_allocated(self.device))
                out["mem_reserved_bytes"] = float(torch.cuda.memory_reserved(self.device))
            bad = [k for k, v in out.items() if not math.isfinite(v)]
            self.run.log(step, **out)
            if bad:
                self.run.event(
                    "nan", step=step, message=f"non-finite {', '.join(bad)}", metrics=bad
                )
        except Exception:
            self.errors += 1

    def _guard(self, fn: Any) -> Any:
        def safe() -> None:
            try:
                fn()
            except Exception:
                self.errors += 1

        return safe


def save(run: Run, obj: Any, path: str, step: int, **attrs: Any) -> None:
    """``torch.save`` as a checkpoint: begin and end events with size and duration."""
    with run.checkpoint(step, path=path, sync=True, **attrs) as ck:
        torch.save(obj, path)
        with contextlib.suppress(OSError, AttributeError):  # a disabled run's span has no attrs
            ck.attrs["size_bytes"] = os.path.getsize(path)


def load(run: Run, path: str, step: int | None = None, **kwargs: Any) -> Any:
    """``torch.load`` with a checkpoint_load event (path, size, duration)."""
    t0 = time.perf_counter()
    obj = torch.load(path, **kwargs)
    with contextlib.suppress(Exception):  # telemetry never breaks the caller
        run.event(
            "checkpoint_load",
            step=step,
            message=path,
            path=path,
            duration_s=time.perf_counter() - t0,
            size_bytes=os.path.getsize(path),
        )
    return obj


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_verified(
    run: Run, obj: Any, directory: str, step: int, *, remediation: int = 0
) -> dict[str, Any]:
    """A synchronous checkpoint that is verified before anyone relies on it.

    The state is serialized in memory and hashed, written to a temporary file, flushed to disk
    and renamed; the file is then read back and hashed again. Only when both hashes match is the
    manifest (``ckpt-<step>.json``: step, path, sha256, bytes) written, atomically, next to it:
    a checkpoint without a manifest is never resumed from. ``step`` is the first step to run
    after loading it. Raises if verification fails."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"ckpt-{step:08d}.pt")
    attrs: dict[str, Any] = (
        {"category": "recovery", "remediation": remediation} if remediation else {}
    )
    with run.checkpoint(step, path=path, sync=True, **attrs) as ck:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        readback = _sha256(path)
        if readback != digest:
            raise OSError(f"checkpoint {path} reads back as {readback}, wrote {digest}")
        manifest = {
            "step": step,
            "path": path,
            "sha256": digest,
            "bytes": len(data),
            "time": time.time(),
            "remediation": remediation,
        }
        mtmp = os.path.join(directory, f".ckpt-{step:08d}.json.tmp-{os.getpid()}")
        with open(mtmp, "w") as fh:
            json.dump(manifest, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(mtmp, os.path.join(directory, f"ckpt-{step:08d}.json"))
        if isinstance(getattr(ck, "attrs", None), dict):  # a disabled run's span has none
            ck.attrs.update(size_bytes=len(data), sha256=digest, verified=True)
    return manifest


def latest_checkpoint(directory: str) -> tuple[dict[str, Any], str] | None:
    """The newest checkpoint in ``directory`` whose file matches its manifest's checksum."""
    try:
        names = sorted(
            (n for n in os.listdir(directory) if n.startswith("ckpt-") and n.endswith(".json")),
            reverse=True,
        )
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(directory, name)) as fh:
                manifest = json.load(fh)
            path = os.path.join(directory, os.path.basename(str(manifest["path"])))
            if _sha256(path) == manifest["sha256"]:
                return manifest, path
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None
