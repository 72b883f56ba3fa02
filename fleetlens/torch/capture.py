"""Triggered trace capture, the job's half: a few profiled steps when the server asks.

With ``FLEETLENS_TRACE_CAPTURE=1`` (or ``init(trace_capture=True)``) in a torch job, each rank
offers capture on the job's control channel (:class:`fleetlens.sdk.control.ControlChannel`,
polled every 2 s by a daemon thread). When the server's step timing finds a rank lagging, it
asks that rank and a healthy peer for a capture (:mod:`fleetlens.services.captures`); on the
next step boundary each of the two starts ``torch.profiler`` (CPU, and CUDA where the job uses
it; no shapes, stacks or memory), profiles one warm-up step and the capture's steps, labelled
``ProfilerStep#<the job's step>``, and stops at the end of the last one, where the trace is
written to a temporary file. A daemon thread compresses it and uploads it to
``PUT /v1/runs/{run}/traces/captures/{id}/{rank}``; the server imports it and shows the two
ranks side by side on the finding.

Bounded: one capture at a time, at most :data:`MAX_STEPS` steps, a trace file of at most
:data:`MAX_FILE_BYTES`, the server's gap between captures of a run. Only the captured steps pay
(the profiler's start, its collection and, on the last one, writing the trace); every other
step pays one attribute read at each boundary. Nothing here raises into training: failures are
counted (``errors``) and the capture is dropped.
"""

from __future__ import annotations

import contextlib
import os
import queue
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from typing import Any

import torch

from ..sdk.control import CaptureAsk, ControlChannel
from ..sdk.run import Run

__all__ = ["MAX_FILE_BYTES", "MAX_STEPS", "Capturer", "ensure_capture"]

MAX_STEPS = 20
MAX_FILE_BYTES = 256 << 20
_UPLOAD_TRIES = 4
_CHUNK = 256 << 10
_PACE = 4.0


class Capturer:
    """Told of step boundaries by the run (``Run._boundary``); profiles what it is asked to."""

    def __init__(self, run: Run, channel: ControlChannel) -> None:
        self.run = run
        self.channel = channel
        channel.capture_offer = True
        self.errors = 0
        self.captured = 0  # traces written
        self.uploaded = 0  # traces the server took
        self.refused = 0  # traces the server refused (a 4xx): not retried
        self._prof: Any = None
        self._asked: dict[str, Any] = {}
        self._ended = 0
        self._total = 0
        self._done: set[int] = set()
        self._calls = 0
        self._written: str | None = None
        self._rec: Any = None  # the open ProfilerStep# mark
        self._uploads: queue.Queue[tuple[int, str]] = queue.Queue(maxsize=4)
        self._uploader: threading.Thread | None = None
        self.last_upload_at: float | None = None

    # -- the training thread --------------------------------------------------------------------

    def begin(self, n: int | None) -> None:
        """A step starts: start profiling if asked, else move the profiler to step ``n``."""
        try:
            if self._prof is not None:
                self._prof.step()  # the schedule's next state: warm-up, record, save
                self._mark(n)
                return
            asked = self.channel.capture
            if asked is None or n is None:
                return
            cid = asked.id
            if cid in self._done or self.run.config.rank not in asked.ranks:
                return
            if n < (asked.from_step or 0):
                return  # every rank asked starts at the same step
            self._done.add(cid)  # whatever happens, once
            self._start(cid, asked)
            self._mark(n)
        except Exception:
            self._drop()

    def end(self, n: int | None) -> None:
        """A step ended: after the capture's last step, stop and write the trace."""
        if self._prof is None:
            return
        try:
            rec, self._rec = self._rec, None
            if rec is not None:
                rec.__exit__(None, None, None)
            self._ended += 1
            if self._ended >= self._total:
                self._finish()
        except Exception:
            self._drop()

    def _mark(self, n: int | None) -> None:
        """``ProfilerStep#n`` over the step itself, begin to end (the profiler's own would run
        from one step's start to the next one's, and the last to its stop), with the job's
        own step number."""
        if n is None:
            return
        rec = torch.autograd.profiler.record_function(f"ProfilerStep#{n}")
        rec.__enter__()  # type: ignore[no-untyped-call]
        self._rec = rec

    def _start(self, cid: int, asked: CaptureAsk) -> None:
        steps = max(1, min(asked.steps, MAX_STEPS))
        warmup = max(0, min(asked.warmup, 5))
        self._asked = {"id": cid, "steps": steps, "warmup": warmup}
        self._total, self._ended, self._calls = warmup + steps, 0, 0
        self._written = None
        act = torch.profiler.ProfilerAction

        def schedule(_step: int) -> Any:
            # Counted in calls (one at construction, one a step), not step numbers: the job's
            # steps need not be consecutive.
            c, self._calls = self._calls, self._calls + 1
            if c < warmup:
                return act.WARMUP
            if c < warmup + steps - 1:
                return act.RECORD
            return act.RECORD_AND_SAVE if c == warmup + steps - 1 else act.NONE

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(
            activities=activities, schedule=schedule, on_trace_ready=self._write
        )
        prof.record_steps = False  # the steps are marked by _mark, over the steps themselves
        prof.start()
        self._prof = prof

    def _write(self, prof: Any) -> None:
        """The profiler's trace is ready (at the last captured step's end): to a file."""
        rank = self.run.config.rank
        fd, path = tempfile.mkstemp(prefix=f"fleetlens-capture-rank{rank}-", suffix=".json")
        os.close(fd)
        self._written = path  # before the export: a failed one is still removed (_drop)
        prof.export_chrome_trace(path)

    def _finish(self) -> None:
        prof, self._prof = self._prof, None
        prof.stop()  # RECORD_AND_SAVE -> stopped: the trace is written (_write)
        path, self._written = self._written, None
        if path is None:
            self.errors += 1
            return
        self.captured += 1
        try:
            self._uploads.put_nowait((int(self._asked["id"]), path))
        except queue.Full:
            self.errors += 1
            os.unlink(path)
            return
        if self._uploader is None:
            self._uploader = threading.Thread(
                target=self._upload_loop, name="fleetlens-capture", daemon=True
            )
            self._uploader.start()

    def _drop(self) -> None:
        """A failure: count it, stop the profiler if it runs; training goes on."""
        self.errors += 1
        rec, self._rec = self._rec, None
        prof, self._prof = self._prof, None
        try:
            if rec is not None:
                rec.__exit__(None, None, None)
            if prof is not None:
                prof.stop()
        except Exception:
            self.errors += 1
        if self._written:
            with contextlib.suppress(OSError):
                os.unlink(self._written)
            self._written = None

    def close(self, timeout: float) -> None:
        """The run ends: a capture under way is dropped (the profiler stops), and the traces
        already written get up to ``timeout`` seconds to reach the server."""
        if self._prof is not None:
            self._drop()
        deadline = time.monotonic() + timeout
        while self._uploads.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)

    # -- the upload thread ----------------------------------------------------------------------

    def _upload_loop(self) -> None:
        while True:
            cid, path = self._uploads.get()
            try:
                self._upload(cid, path)
            except Exception:
                self.errors += 1
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                self._uploads.task_done()

    def _upload(self, cid: int, path: str) -> None:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            self.refused += 1
            return
        body = _gzip_paced(path)
        cfg = self.run.config
        run = urllib.parse.quote(cfg.run_id, safe="")
        url = f"{cfg.server.rstrip('/')}/v1/runs/{run}/traces/captures/{cid}/{cfg.rank}"
        headers = {"Content-Type": "application/gzip"}
        if cfg.token:
            headers["Authorization"] = f"Bearer {cfg.token}"
        for attempt in range(_UPLOAD_TRIES):
            req = urllib.request.Request(url, data=body, headers=headers, method="PUT")
            try:
                with urllib.request.urlopen(req, timeout=60.0) as r:
                    r.read()
                self.uploaded += 1
                self.last_upload_at = time.time()
                return
            except urllib.error.HTTPError as exc:
                if exc.code not in (408, 429) and exc.code < 500:
                    self.refused += 1  # the server will not take it: retrying cannot help
                    return
                self.errors += 1
            except Exception:
                self.errors += 1
            if attempt + 1 < _UPLOAD_TRIES:
                time.sleep(min(30.0, 2.0 * 2**attempt))


def _gzip_paced(path: str) -> bytes:
    """The file gzip-compressed a chunk at a time, sleeping :data:`_PACE` times as long as each
    chunk took: at most a fifth of a core, so that the training steps after the capture do not
    pay for it (zlib lets the GIL go while it compresses)."""
    comp = zlib.compressobj(level=1, wbits=31)  # 31: the gzip container
    out = []
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            t0 = time.perf_counter()
            out.append(comp.compress(chunk))
            time.sleep((time.perf_counter() - t0) * _PACE)
    out.append(comp.flush())
    return b"".join(out)


def ensure_capture(run: Run, channel: ControlChannel | None = None) -> Capturer | None:
    """Capture on request for ``run`` when its config says so (``trace_capture``), on its
    control channel (``channel``, or one opened here); None when off or disabled."""
    try:
        cfg = getattr(run, "config", None)
        if cfg is None or not cfg.enabled or not cfg.trace_capture:
            return None
        have = getattr(run, "_boundary", None)
        if isinstance(have, Capturer):
            return have
        if channel is None:
            channel = getattr(run, "_control", None)
        if channel is None:
            # capture only: remediation's instructions (remove, restart) are not carried out
            # here, and the server does not count the job as one it can drain
            channel = ControlChannel(
                cfg, lambda: (run._position()[0], 0), flush=run.flush, acts=False
            )
            channel.start()
            run._control = channel
        cap = Capturer(run, channel)
        run._boundary = cap
        return cap
    except Exception:
        return None
