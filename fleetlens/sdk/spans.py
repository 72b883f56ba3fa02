"""Timed spans of the training loop: a step, a phase inside it, a checkpoint save.

Each is a context manager and a decorator, and always closes, also on error: a span that leaks
on an exception would hide exactly the step that went wrong. Exiting never raises anything but
the user's own exception, which is never swallowed. Closing a span is one tuple and one
``deque.append`` (the hot path); everything else happens in the exporter thread. Where the
training thread is, for the heartbeat, is a reference the spans leave on the run and the step
(``Run._active``, ``Step.cur``, ``Run._last``): the exporter reads it (``Run._position``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from .buffer import STEP

if TYPE_CHECKING:
    from .run import Run

__all__ = ["PHASES", "Checkpoint", "Phase", "Step"]

F = TypeVar("F", bound=Callable[..., Any])

PHASES: dict[str, int] = {"data": 0, "forward": 1, "backward": 2, "optimizer": 3, "comm": 4}
"""Phase name -> slot; the slots are the step columns data_wait, forward, backward, optimizer,
comm. A phase entered twice in one step is summed."""

_PHASE_NAMES = tuple(PHASES)
_NAN = math.nan
_perf = time.perf_counter
_time = time.time


class Step:
    """``with run.step(n, tokens=...)``: wall time and phases of one optimizer step."""

    __slots__ = ("_prev", "_run", "cur", "end", "n", "ph", "t0", "tokens", "wall")

    def __init__(self, run: Run, n: int | None, tokens: int) -> None:
        self._run = run
        self.n = n
        self.tokens = tokens
        self._prev: Step | None = None
        self.ph = [_NAN, _NAN, _NAN, _NAN, _NAN]
        self.t0 = 0.0
        self.wall = 0.0
        self.end = 0.0
        self.cur: Phase | None = None  # the phase the training thread is in, for the heartbeat

    def __enter__(self) -> Step:
        run = self._run
        try:
            if self.n is None:
                self.n = run._next_step
            run._next_step = self.n + 1
            if run._first_step:
                run._on_first_step(self.n)
            self._prev = run._active
            run._active = self
            if run._boundary is not None:
                run._boundary.begin(self.n)
        except Exception:
            run._internal_error()
        self.wall = _time()
        self.t0 = _perf()
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        dur = _perf() - self.t0
        run = self._run
        try:
            self.end = self.wall + dur
            run._active = self._prev
            run._last = self
            ph = self.ph
            q = run._q1
            if len(q) < run._cap1:
                q.append(
                    (STEP, self.n, self.wall, dur, ph[0], ph[1], ph[2], ph[3], ph[4], self.tokens)
                )
            else:
                run._dropped[1] += 1
            if ev is not None:
                run._on_exception(ev, self.n)
            if run._boundary is not None:
                run._boundary.end(self.n)
        except Exception:
            run._internal_error()
        # Returning None lets the user's exception, if any, propagate untouched.

    def __call__(self, fn: F) -> F:
        """As a decorator each call is a new step: ``n`` for the first call, then n+1, ..."""
        run, first = self._run, [self.n]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            n, first[0] = first[0], None
            with Step(run, n, self.tokens):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class Phase:
    """``with run.phase("forward")``: adds its duration to the enclosing step's column."""

    __slots__ = ("_run", "slot", "t0")

    def __init__(self, run: Run, slot: int) -> None:
        self._run = run
        self.slot = slot
        self.t0 = 0.0

    def __enter__(self) -> Phase:
        step = self._run._active
        if step is not None:
            step.cur = self
        self.t0 = _perf()
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        dt = _perf() - self.t0
        step = self._run._active
        if step is None:
            return
        step.cur = None
        if self.slot >= 0:
            ph = step.ph
            v = ph[self.slot]
            ph[self.slot] = dt if v != v else v + dt  # NaN (never measured) -> first value

    def __call__(self, fn: F) -> F:
        run, slot = self._run, self.slot

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Phase(run, slot):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class Checkpoint:
    """A checkpoint save, reported three ways.

    * ``run.checkpoint(step, path=..., duration_s=...)`` as a plain call reports a save that
      already happened: one ``checkpoint_end`` event, emitted when the returned object is
      discarded (immediately, in CPython, for a call used as a statement).
    * ``with run.checkpoint(step, path=...):`` emits ``checkpoint_begin``, then
      ``checkpoint_end`` with the measured duration, and ``ok=False`` if the block raised.
    * ``@run.checkpoint(step)`` does the same around every call of the function.
    """

    __slots__ = ("_run", "_used", "attrs", "ok", "step", "t0", "wall")

    def __init__(self, run: Run, step: int | None, attrs: dict[str, Any], ok: bool) -> None:
        self._run = run
        self.step = step
        self.attrs = attrs
        self.ok = ok
        self._used = False
        self.wall = _time()
        self.t0 = 0.0

    def __enter__(self) -> Checkpoint:
        self._used = True
        self._run._ckpt = self
        self._run._emit("checkpoint_begin", self.step, "", dict(self.attrs))
        self.t0 = _perf()
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        attrs = dict(self.attrs)
        attrs["duration_s"] = _perf() - self.t0
        attrs["ok"] = ev is None and self.ok
        if ev is not None:
            attrs["error"] = type(ev).__name__
        run = self._run
        run._ckpt = None
        run._emit("checkpoint_end", self.step, "", attrs)

    def __call__(self, fn: F) -> F:
        self._used = True
        run, step, attrs, ok = self._run, self.step, self.attrs, self.ok

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Checkpoint(run, step, attrs, ok):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __del__(self) -> None:
        try:
            if not self._used:
                self._used = True
                attrs = dict(self.attrs)
                attrs["ok"] = self.ok
                self._run._emit("checkpoint_end", self.step, "", attrs, when=self.wall)
        except Exception:
            pass  # a finalizer must not raise, and may run at interpreter shutdown
