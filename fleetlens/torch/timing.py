"""Step and phase timing on the device, data wait, and DDP collectives with the compute/wait split.

Timing never synchronizes the device on the hot path. On CUDA, a step and its phases are timed
with CUDA events that are read back later, when the device has passed them (``query()``), and
recorded then; on CPU, host timers are exact. In DDP the backward pass blocks until every rank's
gradients are reduced, so its time is split at the moment the last local bucket was ready:
before it is this rank's compute, after it is waiting for the others (``comm``). A slow rank
therefore shows as the longest compute and the shortest wait, and each collective records when
this rank entered and left it, so the last arriver is found without synchronized clocks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from ..sdk.run import Run

_MAX_PENDING = 64  # CUDA steps awaiting read-back; older ones are dropped (and counted)


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


class StepTiming:
    """TorchRun's timing half: steps, phases, the loader's wait, CUDA read-back, collectives."""

    run: Run
    errors: int

    def _init_timing(self, run: Run, device: torch.device | str | None, event_factory: Any) -> None:
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

    def _guard(self, fn: Any) -> Any:
        def safe() -> None:
            try:
                fn()
            except Exception:
                self.errors += 1

        return safe
