"""Device-side timing on CUDA: events on the streams that did the work, read back once passed.

A CUDA event's time is when its stream reached it, so every boundary is an event recorded on the
stream that runs the work, and nothing is read until ``query()`` says the device has passed it:
the training thread never waits for the device.

* **Phases** are events on the current (default) stream at each ``phase()`` boundary.
* **The compute/wait split in DDP**: the comm hook records an event on the stream that computed
  the bucket's gradients when the bucket is handed to the all-reduce. On NCCL the default stream
  waits for the all-reduces at the end of backward, so backward on the device is the time up to
  the last bucket's event (this rank's compute) and the rest is waiting for the others (``comm``),
  the split the CPU path makes with host timers. A slow rank shows the longest compute and the
  shortest wait, as on CPU.
* **Collectives**: ``enter`` is the bucket's event (when this rank's device arrived at the
  all-reduce); ``exit`` is an event recorded in the future's callback, whose stream CUDA orders
  after the collective's completion (for NCCL, the communication stream's completion event; for
  gloo on CUDA tensors, the copy back to the device). ``TorchRun.all_reduce`` brackets the call
  with events on the current stream, which waits for the collective.
* **Device times on the host's clock**: each step records an anchor event on an idle side stream,
  which the device reaches as soon as it is recorded, and the host's clock at that moment. Every
  event's device time is at or after its host record time, so each one read back gives a lower
  bound on the anchor's time too, and the tightest bound is kept: a delayed anchor (a stream that
  shares a hardware queue with busy ones) is corrected by any event recorded while the device
  was idle. Times are then exact to the launch latency, per step, so clock drift does not build up.

What the timing needs of CUDA is ``CudaApi``: ``TorchCuda`` on a GPU host (``torch.cuda``
and ``time.time``), a model of a GPU in tests (tests/fake_cuda.py), passed as
``TorchRun(..., cuda_api=...)``. Read-back is bounded (``MAX_PENDING_STEPS`` steps,
``MAX_PENDING_COLLECTIVES`` collectives; older ones are dropped and counted) and everything here
is called under TorchRun's guard, so a failure is counted in ``errors`` and never reaches training.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..sdk.run import Run

__all__ = ["CudaApi", "DeviceTimer", "TorchCuda"]

MAX_PENDING_STEPS = 64
MAX_PENDING_COLLECTIVES = 4096
_RESOLVE_STEPS = 16  # read back at most this many steps and ...
_RESOLVE_COLLECTIVES = 512  # ... collectives per call: bounded work at a step boundary

Mark = tuple[Any, float]  # (an event, the host clock when it was recorded)


class CudaApi(Protocol):
    """The CUDA the timing uses: what ``torch.cuda`` offers for it, and the host clock."""

    def event(self) -> Any:
        """A new event with timing enabled (``torch.cuda.Event(enable_timing=True)``)."""

    def side_stream(self) -> Any:
        """A new stream that runs no work (the anchor's)."""

    def synchronize(self) -> None:
        """Wait for the device (only at the end of training, in ``flush``)."""

    def time(self) -> float:
        """The host clock, in UNIX seconds."""


class TorchCuda:
    """``CudaApi`` on a GPU host: ``torch.cuda`` on ``device`` and ``time.time``."""

    def __init__(self, device: torch.device, event_factory: Any = None) -> None:
        self.device = device
        self._event = event_factory or torch.cuda.Event

    def event(self) -> Any:
        return self._event(enable_timing=True)

    def side_stream(self) -> Any:
        return torch.cuda.Stream(self.device, priority=-1)  # type: ignore[no-untyped-call]

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def time(self) -> float:
        return time.time()


class _Clock:
    """Maps an event's device time to the host clock, through an anchor event."""

    __slots__ = ("final", "ref", "t")

    def __init__(self, mark: Mark, final: bool = False) -> None:
        self.ref, self.t = mark  # t: the best lower bound on the anchor's host time so far
        self.final = final  # every event of its step has tightened it

    def since(self, mark: Mark) -> float:
        """Device seconds from the anchor to ``mark``, tightening the anchor's time with it."""
        d = float(self.ref.elapsed_time(mark[0])) / 1000.0
        if mark[1] - d > self.t:
            self.t = mark[1] - d
        return d


class _Step:
    __slots__ = ("clock", "data", "marks", "n", "tokens")

    def __init__(self, n: int, tokens: int, data: float, clock: _Clock) -> None:
        self.n, self.tokens, self.data, self.clock = n, tokens, data, clock
        self.marks: dict[str, list[Mark]] = {}  # name -> [start, end, start, end, ...]


class _Collective:
    __slots__ = ("clock", "enter", "exit", "group", "nbytes", "op", "seq", "step")

    def __init__(
        self,
        step: int,
        seq: int,
        op: str,
        group: str,
        nbytes: int,
        enter: Mark,
        exit_: Mark,
        clock: _Clock | None,
    ) -> None:
        self.step, self.seq, self.op, self.group, self.nbytes = step, seq, op, group, nbytes
        self.enter, self.exit, self.clock = enter, exit_, clock


def _done(*events: Any) -> bool:
    return all(ev.query() for ev in events)


class DeviceTimer:
    """Steps, phases and collectives as device events, recorded once the device has passed them."""

    def __init__(self, run: Run, api: CudaApi, on_error: Callable[[], None]) -> None:
        self.run, self.api, self._on_error = run, api, on_error
        self.current: _Step | None = None
        self._steps: deque[_Step] = deque()
        self._colls: deque[_Collective] = deque()
        self._lock = threading.Lock()  # collectives arrive from DDP's and gloo's threads
        self._side: Any = None
        self._clock: _Clock | None = None  # the current step's, for its collectives
        self.dropped_steps = 0
        self.dropped_collectives = 0

    # -- recording (the training thread, DDP's hook, the future's callback) ---------------------

    def mark(self) -> Mark:
        """An event on the calling thread's current stream, and the host clock."""
        ev = self.api.event()
        ev.record()
        return ev, self.api.time()

    def anchor(self) -> _Clock | None:
        """A new anchor on the side stream; without one, each step anchors itself."""
        if self._side is False:
            return None
        try:
            if self._side is None:
                self._side = self.api.side_stream()
            ev = self.api.event()
            ev.record(self._side)
            return _Clock((ev, self.api.time()))
        except Exception:
            self._side = False  # counted once; the step's own events are the anchor from now on
            self._on_error()
            return None

    def begin_step(self, n: int, tokens: int, data: float) -> None:
        anchor = self.anchor()
        first = self.mark()
        self._clock = anchor or _Clock(first)
        self.current = _Step(n, tokens, data, self._clock)
        self.current.marks["step"] = [first]

    def end_step(self) -> None:
        st, self.current = self.current, None
        if st is None:
            return
        st.marks["step"].append(self.mark())
        if len(self._steps) >= MAX_PENDING_STEPS:
            self._steps.popleft().clock.final = True  # its collectives go with what they have
            self.dropped_steps += 1
        self._steps.append(st)

    def add(self, name: str, *marks: Mark) -> None:
        """Marks of the current step's phase ``name``: (start, end) pairs, in order."""
        if self.current is not None:
            self.current.marks.setdefault(name, []).extend(marks)

    def add_data(self, seconds: float) -> None:
        if self.current is not None:
            self.current.data += seconds

    def collective(
        self, step: int, seq: int, op: str, group: str, nbytes: int, enter: Mark, exit_: Mark
    ) -> None:
        c = _Collective(step, seq, op, group, nbytes, enter, exit_, self._clock)
        with self._lock:
            if len(self._colls) >= MAX_PENDING_COLLECTIVES:
                self._colls.popleft()
                self.dropped_collectives += 1
            self._colls.append(c)

    # -- read-back (the training thread, at step boundaries; never waits) -----------------------

    def resolve(self) -> None:
        """Record what the device has finished, oldest first; bounded, and never waits.

        An item that cannot be read back (an error from the driver) is dropped and counted, so
        that it never holds up the ones behind it."""
        for _ in range(_RESOLVE_STEPS):
            if not self._steps:
                break
            try:
                if not self._resolve_step(self._steps[0]):
                    break
            except Exception:
                self._steps[0].clock.final = True
                self._on_error()
            self._steps.popleft()
        for _ in range(_RESOLVE_COLLECTIVES):
            with self._lock:
                c = self._colls[0] if self._colls else None
            if c is None:
                break
            try:
                if not _done(c.enter[0], c.exit[0]):
                    break
                if c.clock is not None and not c.clock.final:
                    break  # after its step, whose events put the anchor on the host's clock
                self._record_collective(c)
            except Exception:
                self._on_error()
            with self._lock:
                if self._colls and self._colls[0] is c:
                    self._colls.popleft()

    def _resolve_step(self, st: _Step) -> bool:
        marks = st.marks["step"]
        every = [m for ms in st.marks.values() for m in ms]
        clock = st.clock
        if len(marks) < 2 or not _done(clock.ref, *(m[0] for m in every)):
            return False
        for m in every:
            clock.since(m)  # tighten the anchor with every event of the step first
        phases: dict[str, float] = {}
        for name, ms in st.marks.items():
            if name != "step":
                phases[name] = sum(_seconds(ms[i], ms[i + 1]) for i in range(0, len(ms) - 1, 2))
        if st.data:
            phases["data"] = st.data
        self.run.record_step(
            st.n,
            time=clock.t + clock.since(marks[0]),
            duration=_seconds(marks[0], marks[1]),
            phases=phases,
            tokens=st.tokens,
        )
        clock.final = True
        return True

    def _record_collective(self, c: _Collective) -> None:
        clock = c.clock if c.clock is not None else _Clock(c.enter, final=True)
        d_enter, d_exit = clock.since(c.enter), clock.since(c.exit)
        self.run.collective(
            step=c.step,
            seq=c.seq,
            op=c.op,
            group=c.group,
            enter=clock.t + d_enter,
            exit=clock.t + max(d_exit, d_enter),
            bytes=c.nbytes,
        )

    def flush(self) -> None:
        """At the end of training: wait for the device once, and record everything left."""
        if self._steps or self._colls:
            self.api.synchronize()
        self.resolve()
        if self._clock is not None:
            self._clock.final = True  # flushed inside a step: its collectives go as they are
        while self._steps or self._colls:
            before = len(self._steps) + len(self._colls)
            self.resolve()
            if len(self._steps) + len(self._colls) == before:
                break


def _seconds(a: Mark, b: Mark) -> float:
    return float(a[0].elapsed_time(b[0])) / 1000.0
