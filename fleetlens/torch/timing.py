"""Step and phase timing on the device, data wait, and DDP collectives with the compute/wait split.

Timing never synchronizes the device on the hot path. On CPU, host timers are exact. On CUDA,
steps, phases and collectives are events on the streams that ran the work, read back once the
device has passed them (``fleetlens/torch/cuda.py`` says how, and how device times are put on the
host's clock). In DDP the backward pass ends waiting until every rank's gradients are reduced
(on CPU the host blocks; on NCCL the default stream waits for the communication stream), so its
time is split at the moment the last local bucket was ready, a host timer on CPU and an event
on the computing stream on CUDA: before it is this rank's compute, after it is waiting for the
others (``comm``). A slow rank therefore shows as the longest compute and the shortest wait, and
each collective records when this rank entered and left it (on CUDA, when its device did), so
the last arriver is found without synchronized clocks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from ..sdk.run import Run
from .cuda import CudaApi, DeviceTimer, Mark, TorchCuda
from .flight_recorder import HangDump


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
    """TorchRun's timing half: steps, phases, the loader's wait, device read-back, collectives."""

    run: Run
    errors: int

    def _init_timing(
        self,
        run: Run,
        device: torch.device | str | None,
        event_factory: Any,
        cuda_api: CudaApi | None = None,
    ) -> None:
        self.run = run
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        # On a GPU host the real torch.cuda; a test passes a model of one (tests/fake_cuda.py).
        self._dev: DeviceTimer | None = None
        if self.cuda:
            api = cuda_api or TorchCuda(self.device, event_factory)
            self._dev = DeviceTimer(run, api, self._count_error)
        self._sdk_step: Any = None
        self._data_wait = 0.0
        self._step_n = -1
        self._seq = 0
        self._last_bucket = 0.0
        self._buckets = 0  # bucket marks so far, and the latest one (CUDA)
        self._bucket: Mark | None = None
        self.hang_dump: HangDump | None = None  # TorchRun starts it (flight recorder on)
        self._step_t0 = 0.0

    @property
    def dropped_steps(self) -> int:
        """CUDA steps dropped because the device had not passed them in time (bounded read-back)."""
        return self._dev.dropped_steps if self._dev is not None else 0

    @property
    def dropped_collectives(self) -> int:
        return self._dev.dropped_collectives if self._dev is not None else 0

    # -- steps and phases ---------------------------------------------------------------------

    def step(self, n: int, *, tokens: int = 0) -> _Span:
        def enter() -> None:
            self._step_n = n
            self._seq = 0
            self._step_t0 = time.perf_counter()
            wait, self._data_wait = self._data_wait, 0.0
            if self._dev is not None:
                self.run._pos = (n, "step", time.time())  # the heartbeat's position
                self._resolve()
                if (b := getattr(self.run, "_boundary", None)) is not None:
                    b.begin(n)  # a trace capture (fleetlens.torch.capture)
                self._dev.begin_step(n, tokens, wait)
            else:
                self._sdk_step = self.run.step(n, tokens=tokens)
                self._sdk_step.__enter__()
                if wait:
                    self.run.add_phase("data", wait)

        def exit_(ev: BaseException | None) -> None:
            try:
                if self._dev is not None:
                    self._dev.end_step()
                    self.run._pos = (n, "idle", time.time())
                    if (b := getattr(self.run, "_boundary", None)) is not None:
                        b.end(n)
                elif self._sdk_step is not None:
                    s, self._sdk_step = self._sdk_step, None
                    s.__exit__(type(ev) if ev else None, ev, None)
                if self.hang_dump is not None:
                    self.hang_dump.step_ended(time.perf_counter() - self._step_t0)
            except Exception:
                self.errors += 1

        return _Span(self._guard(enter), exit_)

    def phase(self, name: str) -> _Span:
        state = {"t0": 0.0, "bucket0": 0.0}
        marks: list[Mark] = []

        def enter() -> None:
            if self._dev is not None:
                if self._dev.current is not None:
                    marks.append(self._dev.mark())
                state["bucket0"] = self._buckets
                return
            state["t0"] = time.perf_counter()
            state["bucket0"] = self._last_bucket

        def exit_(ev: BaseException | None) -> None:
            try:
                if self._dev is not None:
                    self._device_phase(name, marks, int(state["bucket0"]))
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

    def _device_phase(self, name: str, marks: list[Mark], buckets0: int) -> None:
        dev = self._dev
        if dev is None or not marks or dev.current is None:
            return
        start, end = marks[0], dev.mark()
        bucket = self._bucket
        if name == "backward" and self._buckets > buckets0 and bucket is not None:
            # DDP: after the last local bucket's gradients, the stream only waited for the others.
            dev.add("backward", start, bucket)
            dev.add("comm", bucket, end)
        else:
            dev.add(name, start, end)

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
            if self._dev is not None and self._dev.current is not None:
                self._dev.add_data(wait)  # fetched inside a step
            elif self._sdk_step is not None:
                self.run.add_phase("data", wait)
            else:
                self._data_wait += wait
            yield batch

    # -- device read-back -----------------------------------------------------------------------

    def _resolve(self) -> None:
        """Record what the device has finished (steps, collectives); never waits for it."""
        if self._dev is not None:
            self._dev.resolve()

    def flush(self) -> None:
        """At the end of training: wait for the device once and record what is left."""
        try:
            if self._dev is not None:
                self._dev.flush()
        except Exception:
            self.errors += 1

    # -- collectives ----------------------------------------------------------------------------

    def watch_ddp(
        self,
        model: torch.nn.parallel.DistributedDataParallel,
        group: Any = None,
        name: str = "default",
    ) -> None:
        """Replace DDP's all-reduce with one that records each bucket's enter and exit.

        On CUDA, enter is an event on the stream that computed the bucket (when this rank's
        device arrived) and exit one recorded in the future's callback, which CUDA orders after
        the collective: device times, read back later, never host enqueue times."""
        world = dist.get_world_size(group)

        def hook(_state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
            tensor = bucket.buffer()
            enter = time.time()
            self._last_bucket = time.perf_counter()
            seq, step = self._seq, self._step_n
            self._seq += 1
            nbytes = tensor.numel() * tensor.element_size()
            mark = self._bucket_mark()
            fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

            def done(f: torch.futures.Future[Any]) -> torch.Tensor:
                self._record_collective(step, seq, name, nbytes, enter, mark)
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
        """An explicit all-reduce, recorded like DDP's (blocking, as dist.all_reduce is).

        On CUDA it is bracketed by events on the current stream, which waits for the collective:
        when this rank's device arrived, and when the result was there."""
        enter = time.time()
        seq = self._seq
        self._seq += 1
        mark = self._try_mark()
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM, group=group)
        nbytes = tensor.numel() * tensor.element_size()
        self._record_collective(self._step_n, seq, name, nbytes, enter, mark)

    def _try_mark(self) -> Mark | None:
        if self._dev is None:
            return None
        try:
            return self._dev.mark()
        except Exception:
            self.errors += 1
            return None

    def _bucket_mark(self) -> Mark | None:
        """CUDA: an event where the stream finished this bucket's gradients (DDP's hook thread)."""
        mark = self._try_mark()
        if mark is not None:
            self._bucket = mark
            self._buckets += 1
        return mark

    def _device_collective(self, step: int, seq: int, name: str, nbytes: int, enter: Mark) -> None:
        """CUDA: the exit event on the current stream, which is ordered after the collective."""
        try:
            if self._dev is not None:
                self._dev.collective(step, seq, "all_reduce", name, nbytes, enter, self._dev.mark())
        except Exception:
            self.errors += 1

    def _count_error(self) -> None:
        self.errors += 1

    def _record_collective(
        self, step: int, seq: int, name: str, nbytes: int, enter: float, mark: Any
    ) -> None:
        """One all-reduce: host times on CPU, device events (when marked) on CUDA."""
        if self._dev is None:
            self.run.collective(
                step=step,
                seq=seq,
                op="all_reduce",
                group=name,
                enter=enter,
                exit=time.time(),
                bytes=nbytes,
            )
        elif mark is not None:
            self._device_collective(step, seq, name, nbytes, mark)

    def _guard(self, fn: Any) -> Any:
        def safe() -> None:
            try:
                fn()
            except Exception:
                self.errors += 1

        return safe
