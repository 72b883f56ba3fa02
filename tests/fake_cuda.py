"""A model of GPUs with CUDA's ordering, for testing the device timing where there is no GPU.

It stands in for the hardware only (``fleetlens.torch.cuda.CudaApi``, DDP's reducer and
``torch.distributed``'s all-reduce); the code under test is the real one. Time is virtual and
exact, in seconds:

* a stream runs its operations in order; an operation starts when the previous one ended, when
  the host enqueued it, and when every event it waits on has happened, whichever is last;
* an event's time is when its stream reached it; ``query()`` is true once the host's clock has
  passed that time; ``elapsed_time`` raises on an event the device has not passed (CUDA's
  ``cudaErrorNotReady``) or that was never recorded, and is in milliseconds;
* the host enqueues in no time and moves on; it waits only where told (``host_wait``, as
  ``loss.item()`` does, ``synchronize``, ``host_sleep``);
* an all-reduce is an operation on each rank's communication stream that waits for the stream
  current at the call (NCCL's order); it starts on every rank when the last rank's has started
  and ends on all of them ``transfer`` seconds later. The future's callback runs at once on a new
  stream that waits for the collective, as ``torch.futures.Future.then`` does for CUDA futures.

Ranks run one after the other in a test (``cluster.active``), each with its own host clock; an
operation whose time depends on a rank that has not enqueued its part yet has no time (and its
events are not done) until it has.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

BASE = 1_700_000_000.0  # the host clock's start, in UNIX seconds (the model counts from 0)


class Op:
    """One operation on a stream: a kernel, an event record, a wait, or a rank's collective."""

    def __init__(
        self, prev: Op | None, enqueued: float, duration: float, waits: list[Op], coll: Any = None
    ) -> None:
        self.prev, self.enqueued, self.duration, self.waits, self.coll = (
            prev,
            enqueued,
            duration,
            waits,
            coll,
        )
        self._end: float | None = None  # once known, it never changes

    def start(self) -> float | None:
        deps = [self.enqueued]
        for o in ([self.prev] if self.prev else []) + self.waits:
            t = o.end()
            if t is None:
                return None
            deps.append(t)
        return max(deps)

    def end(self) -> float | None:
        if self._end is None:
            if self.coll is not None:
                self._end = self.coll.end()
            else:
                s = self.start()
                self._end = None if s is None else s + self.duration
        return self._end


class Stream:
    def __init__(self, gpu: Gpu, name: str) -> None:
        self.gpu, self.name = gpu, name
        self.tail: Op | None = None

    def enqueue(self, duration: float = 0.0, waits: list[Op] | None = None, coll: Any = None) -> Op:
        self.tail = Op(self.tail, self.gpu.host, duration, waits or [], coll)
        return self.tail

    def wait(self, op: Op | None) -> None:
        if op is not None:
            self.enqueue(0.0, [op])


class Event:
    """``torch.cuda.Event(enable_timing=True)`` on the model."""

    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.op: Op | None = None
        self.broken = False

    def record(self, stream: Stream | None = None) -> None:
        self.op = (stream or self.gpu.current).enqueue()
        self.gpu.records += 1
        self.broken, self.gpu.break_next = self.gpu.break_next, False

    def time(self) -> float | None:
        return None if self.op is None else self.op.end()

    def query(self) -> bool:
        t = self.time()
        return t is not None and t <= self.gpu.host

    def elapsed_time(self, end: Event) -> float:
        if self.op is None or end.op is None:
            raise RuntimeError("elapsed_time on an event that was not recorded")
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready")
        if self.broken or end.broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return (end.time() - self.time()) * 1000.0  # type: ignore[operator]


class Gpu:
    """One rank's device and host clock: ``CudaApi`` for ``TorchRun(cuda_api=...)``."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.host = 0.0  # seconds since BASE: exact in floating point, as elapsed_time is
        self.default = Stream(self, "default")
        self.comm = Stream(self, "comm")
        self.current = self.default
        self.streams = [self.default, self.comm]
        self.syncs = 0
        self.records = 0
        self.side_stream_fails = False
        self.break_next = False  # the next event recorded fails in elapsed_time

    # -- CudaApi --
    def event(self) -> Event:
        return Event(self)

    def side_stream(self) -> Stream:
        if self.side_stream_fails:
            raise RuntimeError("no streams here")
        return self.new_stream("side")

    def synchronize(self) -> None:
        self.syncs += 1
        for s in self.streams:
            self.host_wait(s.tail)

    def time(self) -> float:
        return BASE + self.host

    # -- the training loop's side --
    def new_stream(self, name: str) -> Stream:
        s = Stream(self, name)
        self.streams.append(s)
        return s

    def kernel(self, seconds: float) -> None:
        self.current.enqueue(seconds)

    def host_wait(self, op: Op | None) -> None:
        """The host blocks until ``op`` has happened (``loss.item()`` on the default stream)."""
        if op is None:
            return
        t = op.end()
        if t is None:
            raise RuntimeError(f"rank {self.rank} would wait forever: another rank is missing")
        self.host = max(self.host, t)

    def host_sleep(self, seconds: float) -> None:
        self.host += seconds

    @contextlib.contextmanager
    def using(self, stream: Stream) -> Iterator[Stream]:
        prev, self.current = self.current, stream
        try:
            yield stream
        finally:
            self.current = prev


class Collective:
    def __init__(self, world: int, transfer: float) -> None:
        self.world, self.transfer = world, transfer
        self.ops: dict[int, Op] = {}

    def end(self) -> float | None:
        if len(self.ops) < self.world:
            return None
        starts = [o.start() for o in self.ops.values()]
        if any(s is None for s in starts):
            return None
        return max(starts) + self.transfer  # type: ignore[type-var, operator]


class Future:
    """A CUDA future: ready on ``op``; ``then`` runs the callback at once on a waiting stream."""

    def __init__(self, gpu: Gpu, op: Op | None, value: Any) -> None:
        self.gpu, self.op, self._value = gpu, op, value

    def value(self) -> Any:
        return self._value

    def then(self, cb: Callable[[Future], Any]) -> Future:
        stream = self.gpu.new_stream("callback")
        stream.wait(self.op)
        with self.gpu.using(stream):
            result = cb(self)
        return Future(self.gpu, stream.tail, result)

    def wait(self) -> Any:
        self.gpu.current.wait(self.op)  # the current stream waits; the host does not
        return self._value


class Work:
    def __init__(self, fut: Future) -> None:
        self._fut = fut

    def get_future(self) -> Future:
        return self._fut


class Cluster:
    """The ranks' GPUs and the network between them; ``install`` patches torch.distributed."""

    def __init__(self, world: int, transfer: float) -> None:
        self.gpus = [Gpu(r) for r in range(world)]
        self.world, self.transfer = world, transfer
        self.active = 0
        self._colls: dict[int, Collective] = {}
        self._calls = [0] * world

    @property
    def gpu(self) -> Gpu:
        return self.gpus[self.active]

    def install(self, monkeypatch: Any) -> None:
        monkeypatch.setattr(torch.distributed, "all_reduce", self.all_reduce)
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: self.world)

    def all_reduce(
        self, tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False
    ) -> Work | None:
        gpu, k = self.gpu, self._calls[self.active]
        self._calls[self.active] += 1
        coll = self._colls.setdefault(k, Collective(self.world, self.transfer))
        ready = gpu.current.tail  # NCCL: the communication stream waits for the current stream
        coll.ops[gpu.rank] = gpu.comm.enqueue(0.0, [ready] if ready else [], coll)
        fut = Future(gpu, gpu.comm.tail, [tensor])
        if async_op:
            return Work(fut)
        fut.wait()
        return None


class Bucket:
    def __init__(self, numel: int) -> None:
        self._t = torch.ones(numel)

    def buffer(self) -> torch.Tensor:
        return self._t


class DDP:
    """DDP's reducer on the model: buckets handed to the comm hook as their gradients are ready,
    the default stream waiting for every bucket's future at the end of backward, then the copy
    of the reduced gradients back."""

    def __init__(self, cluster: Cluster, buckets: int = 2, copy_back: float = 0.001) -> None:
        self.cluster, self.buckets, self.copy_back = cluster, buckets, copy_back
        self.hook: Any = None

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        self.hook = hook

    def backward(self, seconds: float) -> None:
        gpu = self.cluster.gpu
        futs = []
        for _ in range(self.buckets):
            gpu.kernel(seconds / self.buckets)
            futs.append(self.hook(None, Bucket(256)))
        for f in futs:
            f.wait()
        gpu.kernel(self.copy_back)


class RecordingRun:
    """What TorchRun sends to a fleetlens Run on the device path: steps and collectives."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.collectives: list[dict[str, Any]] = []

    def record_step(self, step: int, **kw: Any) -> None:
        self.steps.append({"step": step, **kw})

    def collective(self, **kw: Any) -> None:
        self.collectives.append(kw)

    def add_phase(self, name: str, seconds: float) -> None:
        raise AssertionError("the device path records whole steps, not host phases")
