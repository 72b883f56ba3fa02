"""The run object the training loop talks to (``init`` in ``start`` makes it).

Every per-step method is a length check and a ``deque.append`` of a small tuple: no lock, no
encoding, no I/O (the exporter thread does those). After ``init`` nothing raises into the training
loop: each public method swallows and counts its own failures, except that the user's exception
leaving ``with run.step(...)`` is re-raised untouched.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
import time
import traceback
from types import FrameType, TracebackType
from typing import Any

from ..scalars import DATA_SCALARS
from ..schema import EVENT_KINDS, P0_EVENT_KINDS
from .buffer import COLLECTIVE, EVENT, PLACEMENT, SCALARS, STEP, RecordBuffer
from .config import SDKConfig
from .environment import environment
from .exporter import Exporter
from .logs import LogCapture
from .oom import oom_attrs
from .route import open_transport
from .spans import PHASES, Checkpoint, Phase, Step
from .spool import Spool
from .tables import Identity
from .transport import Transport

__all__ = ["Run"]

_PHASE_NAMES = tuple(PHASES)

VERSION = "0.1.0"
_NAN = float("nan")
_time = time.time


class Run:
    """One process's view of a training run. Make it with :func:`fleetlens.init`."""

    def __init__(
        self,
        cfg: SDKConfig,
        transport: Transport | None = None,
        *,
        lineage: dict[str, Any] | None = None,
    ) -> None:
        self.config = cfg
        self._lineage = dict(lineage or {})
        self._buffer = RecordBuffer(cfg.buffer_caps)
        q = self._buffer.queues
        self._q0, self._q1, self._q2 = q[0], q[1], q[2]
        self._cap0, self._cap1, self._cap2 = (
            cfg.buffer_caps[0],
            cfg.buffer_caps[1],
            cfg.buffer_caps[2],
        )
        self._dropped = self._buffer.dropped
        self._active: Step | None = None
        # Where the training thread is, for the heartbeat (read by the exporter thread): the
        # open step and its open phase (``_active``, ``Step.cur``), else the last closed step,
        # else ``_pos``, which a producer timing steps elsewhere (fleetlens.torch on a GPU) sets;
        # an open checkpoint save comes first. Spans store a reference, no more, on the hot path.
        self._pos: tuple[int, str, float] = (-1, "idle", _time())
        self._last: Step | None = None
        self._ckpt: Checkpoint | None = None
        self._next_step = 0
        self._first_step = True
        self._shard: tuple[str | None, str | None] = (None, None)  # what data() last announced
        self._finished = False
        self._errors = 0
        self._spool = Spool(cfg.spool_dir, cfg.spool_max_bytes, owner=cfg.spool_owner)
        self.relay: str | None = None  # the node relay batches go through, if any
        if transport is None:
            transport, self.relay = open_transport(cfg)
        self._transport = transport
        self._exporter = Exporter(
            cfg,
            self._buffer,
            self._transport,
            Identity(rank=cfg.rank, node_id=cfg.node_id, gpu=cfg.gpu),
            self._spool,
            self._position,
        )
        self._logs = (
            LogCapture(self._buffer, cfg.rank, self._position) if cfg.capture_logs else None
        )
        self._prev_sigterm: Any = None
        # Set by fleetlens.torch.auto in a torch job: when this rank waited for the others.
        self._grads: Any = None
        self._watch: Any = None
        # Set by fleetlens.torch.capture when the job captures traces: told of step boundaries.
        self._boundary: Any = None
        self._control: Any = None  # the job's control channel, once something opens it
        self._announce()
        self._exporter.start()
        atexit.register(self._at_exit)
        self._install_sigterm()
        self._reported: int | None = None  # id() of the exception a step already reported
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._on_uncaught

    # -- the hot path -------------------------------------------------------------------------

    def step(self, n: int | None = None, *, tokens: int = 0) -> Step:
        """Time one optimizer step; ``n`` defaults to the previous step + 1."""
        return Step(self, n, tokens)

    def phase(self, name: str) -> Phase:
        """Time a phase of the current step: data, forward, backward, optimizer or comm."""
        return Phase(self, PHASES.get(name, -1))

    def add_phase(self, name: str, seconds: float) -> None:
        """Add time measured elsewhere (a device timer, a loader) to the current step's phase."""
        try:
            active, slot = self._active, PHASES.get(name, -1)
            if active is not None and slot >= 0:
                cur = active.ph[slot]
                active.ph[slot] = seconds if cur != cur else cur + seconds  # NaN: unset
        except Exception:
            self._internal_error()

    def record_step(
        self,
        step: int,
        *,
        time: float,
        duration: float,
        phases: dict[str, float] | None = None,
        tokens: int = 0,
    ) -> None:
        """Record a step timed elsewhere (e.g. CUDA events resolved after the fact)."""
        try:
            ph = [_NAN] * 5
            for name, value in (phases or {}).items():
                slot = PHASES.get(name, -1)
                if slot >= 0:
                    ph[slot] = value
            q = self._q1
            if len(q) < self._cap1:
                q.append((STEP, step, time, duration, ph[0], ph[1], ph[2], ph[3], ph[4], tokens))
            else:
                self._dropped[1] += 1
        except Exception:
            self._internal_error()

    def log(self, step: int, /, **scalars: float) -> None:
        """Record scalars of any name for ``step`` (priority P2)."""
        try:
            q = self._q2
            if len(q) < self._cap2:
                q.append((SCALARS, step, _time(), scalars))
            else:
                self._dropped[2] += len(scalars)
        except Exception:
            self._internal_error()

    def data(
        self,
        step: int,
        /,
        *,
        shard: str | None = None,
        version: str | None = None,
        queue_depth: float | None = None,
        cache_hit_rate: float | None = None,
        read_latency_s: float | None = None,
        bytes_read: float | None = None,
    ) -> None:
        """The input pipeline's state at ``step``: the dataset shard (and version) being read,
        the prefetch queue's depth, the cache hit rate (0..1), the storage read latency of the
        step's reads in seconds, the bytes read. A data stall is then traced to the shard, the
        storage or the prefetch. The numbers are scalars (P2, names in
        :data:`fleetlens.scalars.DATA_SCALARS`); the shard is an event sent when it changes."""
        try:
            values = {
                "queue_depth": queue_depth,
                "cache_hit_rate": cache_hit_rate,
                "read_latency_s": read_latency_s,
                "bytes_read": bytes_read,
            }
            scalars = {DATA_SCALARS[k]: float(v) for k, v in values.items() if v is not None}
            if scalars:
                self.log(step, **scalars)
            if shard is not None and (shard, version) != self._shard:
                self._shard = (shard, version)
                attrs = {"shard": str(shard)} | ({"version": str(version)} if version else {})
                self._emit("data_shard", step, "", attrs)
        except Exception:
            self._internal_error()

    def event(self, kind: str, step: int | None = None, message: str = "", **attrs: Any) -> None:
        """Record a lifecycle or fault event; failure kinds are P0, the others P1."""
        self._emit(kind, step, message, attrs)

    def collective(
        self,
        *,
        step: int,
        seq: int,
        op: str,
        group: str = "default",
        enter: float,
        exit: float,
        bytes: int = 0,
    ) -> None:
        """Record one collective as this rank saw it (UNIX times, priority P2)."""
        try:
            q = self._q2
            if len(q) < self._cap2:
                q.append((COLLECTIVE, step, seq, op, group, enter, exit, bytes))
            else:
                self._dropped[2] += 1
        except Exception:
            self._internal_error()

    def checkpoint(
        self,
        step: int | None = None,
        *,
        path: str = "",
        size_bytes: int | None = None,
        duration_s: float | None = None,
        sync: bool = True,
        ok: bool = True,
        **attrs: Any,
    ) -> Checkpoint:
        """Report a checkpoint save; also a context manager and decorator that times it."""
        attrs["path"] = path
        attrs["sync"] = sync
        if size_bytes is not None:
            attrs["size_bytes"] = size_bytes
        if duration_s is not None:
            attrs["duration_s"] = duration_s
        return Checkpoint(self, step, attrs, ok)

    # -- lifecycle ----------------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Send what is buffered now; True if the collector acknowledged all of it in time."""
        try:
            return self._exporter.flush(timeout)
        except Exception:
            self._internal_error()
            return False

    def finish(self, status: str = "ok", message: str = "") -> None:
        """End the run: a finish (or failure) event, a bounded flush, the thread stopped."""
        if self._finished:
            return
        self._finished = True
        try:
            kind = "finish" if status == "ok" else "failure"
            self._emit(kind, None, message, {"status": status})
            self._shutdown(self.config.exit_flush_timeout)
            atexit.unregister(self._at_exit)
            self._restore_sigterm()
            if sys.excepthook == self._on_uncaught:
                sys.excepthook = self._prev_excepthook
        except Exception:
            self._internal_error()

    def stats(self) -> dict[str, Any]:
        """Counters of what was recorded, sent, spooled and dropped, for dashboards and tests."""
        try:
            out: dict[str, Any] = dict(self._exporter.counts)
            dropped = self._exporter.dropped()
            out["dropped_by_priority"] = {f"P{i}": dropped[i] for i in range(4)}
            out["dropped"] = sum(dropped)
            out["buffered_entries"] = self._buffer.pending()
            out["spool_bytes"] = self._spool.total_bytes
            out["spool_files"] = len(self._spool)
            out["spool_dropped_batches"] = self._spool.dropped_batches
            out["spool_foreign_files"] = self._spool.foreign_files
            out["spool_in_memory_batches"] = self._spool.memory_batches
            out["spool_unwritable"] = self._spool.unwritable
            out["internal_errors"] += self._errors
            out["exporter_alive"] = self._exporter.alive
            out["relay"] = self.relay or ""
            out["log_lines_dropped"] = self._logs.dropped if self._logs is not None else 0
            return out
        except Exception:
            self._internal_error()
            return {}

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish("ok" if ev is None else "error", "" if ev is None else repr(ev))

    # -- internals ----------------------------------------------------------------------------

    def _position(self) -> tuple[int, str, float]:
        """(step, phase, since) for the heartbeat, from the exporter thread."""
        ck, step = self._ckpt, self._active
        n = -1 if step is None or step.n is None else step.n
        if ck is not None:
            last = self._last
            if step is None and last is not None and last.n is not None:
                n = last.n
            return n, "checkpoint", ck.wall
        if step is not None:
            ph = step.cur
            if ph is not None and 0 <= ph.slot < len(_PHASE_NAMES):
                # A phase's start is on the perf clock: its age, taken from now on the wall.
                return n, _PHASE_NAMES[ph.slot], _time() - (time.perf_counter() - ph.t0)
            return n, "step", step.wall
        last = self._last
        if last is not None:
            return (-1 if last.n is None else last.n), "idle", last.end
        return self._pos

    def _internal_error(self) -> None:
        self._errors += 1

    def _waited(self, seconds: float) -> None:
        """This rank waited ``seconds`` for its peers (fleetlens.torch.auto, at the end of a
        backward pass): the step's ``comm``, taken out of the phase the wait happened in."""
        step = self._active
        if step is None:
            return
        ph = step.ph
        ph[4] = seconds if ph[4] != ph[4] else ph[4] + seconds
        cur = step.cur
        if cur is not None and cur.slot != 4:
            cur.t0 += seconds

    def _emit(
        self,
        kind: str,
        step: int | None,
        message: str,
        attrs: dict[str, Any] | None,
        when: float | None = None,
    ) -> None:
        try:
            if kind not in EVENT_KINDS:
                attrs = {**(attrs or {}), "custom_kind": kind}
                kind = "custom"
            t = _time() if when is None else when
            if kind in P0_EVENT_KINDS:
                q, cap, prio = self._q0, self._cap0, 0
            else:
                q, cap, prio = self._q1, self._cap1, 1
            if len(q) < cap:
                q.append((EVENT, t, kind, step, message, attrs))
                if prio == 0:
                    self._exporter.wake()  # a failure goes out now, not at the paced interval
            else:
                self._dropped[prio] += 1
        except Exception:
            self._internal_error()

    def _on_first_step(self, n: int) -> None:
        self._first_step = False
        self._exporter.memory.note_device()  # the device the training thread uses, if any
        self._emit("first_step", n, "", None)

    def _on_uncaught(
        self, et: type[BaseException], ev: BaseException, tb: TracebackType | None
    ) -> None:
        """An exception that ends the process outside any step (a trainer's loop, whose
        callbacks see no exception): the rank's last word, then the previous hook."""
        try:
            last = self._active or self._last
            step = last.n if last is not None else None
            if isinstance(ev, KeyboardInterrupt):  # Ctrl-C: stopped, not failed
                self._emit("signal", step, "received SIGINT", {"signal": int(signal.SIGINT)})
            elif ev is not None and id(ev) != self._reported and not isinstance(ev, SystemExit):
                self._on_exception(ev, step)
        except Exception:
            self._internal_error()
        self._prev_excepthook(et, ev, tb)

    def _on_exception(self, exc: BaseException, step: int | None) -> None:
        self._reported = id(exc)
        try:
            text = "".join(traceback.format_exception(exc))[-8000:]
        except Exception:
            text = ""
        try:
            message = f"{type(exc).__name__}: {exc}"
        except Exception:
            message = type(exc).__name__
        oom = oom_attrs(exc, self.config.config)
        if oom is not None:  # the seed's OOM: its step, the bytes asked for, the device's state
            if step is not None:  # the last point of the memory's climb, at the failure
                self.log(step, **self._exporter.memory.sample())
            self._emit("oom", step, message, {**oom, "traceback": text})
            return
        self._emit("exception", step, message, {"type": type(exc).__qualname__, "traceback": text})

    def _announce(self) -> None:
        cfg = self.config
        now = _time()
        self._buffer.put(
            1, (PLACEMENT, now, cfg.rank, cfg.local_rank, cfg.world_size, cfg.node_id, cfg.gpu)
        )
        attrs = {
            "config": cfg.config,
            "world_size": cfg.world_size,
            "rank": cfg.rank,
            "local_rank": cfg.local_rank,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "sdk": VERSION,
            "launcher": {
                "name": cfg.launcher,
                "restart_count": cfg.restart_count,
                "env": cfg.launcher_env,
            },
            "launch_command": " ".join(sys.argv),
            "environment": environment(),
            **self._lineage,
        }
        self._emit("job_start", None, "", attrs, when=now)

    def _shutdown(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        # Keep part of the budget for the thread to see the stop and end its last cycle: a
        # flush that used it all (collector down) left the thread running beside the spill.
        self._exporter.flush(timeout - min(0.5, timeout / 4))
        self._exporter.stop(deadline - time.monotonic())
        # Whatever did not make it out in time waits in the spool for the next process.
        self._exporter.spill()
        close = getattr(self._transport, "close", None)
        if callable(close) and not self._exporter.alive:
            close()
        if self._logs is not None:
            self._logs.close()
        if self._boundary is not None:  # a trace capture under way stops; written ones go out
            try:
                self._boundary.close(max(0.0, min(2.0, deadline - time.monotonic())))
            except Exception:
                self._internal_error()

    def _at_exit(self) -> None:
        if not self._finished:
            self._finished = True
            try:
                self._shutdown(self.config.exit_flush_timeout)
            except Exception:
                self._internal_error()

    def _install_sigterm(self) -> None:
        if not self.config.install_signal_handler:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return  # someone else owns SIGTERM; chaining to an unknown handler is theirs
            self._prev_sigterm = signal.SIG_DFL
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):
            self._prev_sigterm = None

    def _restore_sigterm(self) -> None:
        if self._prev_sigterm is None:
            return
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        prev = self._prev_sigterm
        try:
            self._emit(
                "signal",
                self._active.n if self._active else None,
                f"received {signal.Signals(signum).name}",
                {"signal": signum},
            )
            self._exporter.flush(self.config.signal_flush_timeout)
            self._exporter.spill()
        except Exception:
            self._internal_error()
        finally:
            self._finished = True
            signal.signal(signum, prev if prev is not None else signal.SIG_DFL)
            self._prev_sigterm = None
            if callable(prev):
                prev(signum, frame)
            else:
                os.kill(os.getpid(), signum)
