"""The job dumps its own Flight Recorder when it hangs, and uploads it (docs/flight_recorder.md).

With PyTorch's flight recorder on (``TORCH_NCCL_TRACE_BUFFER_SIZE`` or ``TORCH_FR_BUFFER_SIZE``
above 0), every rank of a ``TorchRun`` watches its own progress from a daemon thread: when no step
has ended for the hang rule's ``max(10 x recent step time, floor)`` (the server's rule,
``fleetlens.analysis.hangs.HangRule``, which a training process does not import; the floor is
``FLEETLENS_HANG_FLOOR_S``, 60 s), it
writes the recorder's buffer (``torch._C._distributed_c10d._dump_fr_trace``, the pickle PyTorch
itself writes on a timeout) to ``DIR/fleetlens_fr_rank_<rank>``. Rank 0 then waits up to
``gather_s`` for the other ranks' files and sends them all to ``POST /v1/runs/{run}/flight-
recorder``, which names the stuck collective and the ranks missing from it as findings of the
run. The thread of a rank stuck in a collective still runs: the collective waits outside the
GIL.

``DIR`` is ``FLEETLENS_FR_DIR``, else the directory of ``TORCH_FR_DUMP_TEMP_FILE`` /
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, else a directory in the node's temp dir; with several nodes
it must be shared by them (rank 0 reads every rank's file). One dump per hang: progress resets it.
``FLEETLENS_FR_DUMP=0`` turns it off. Like all of fleetlens inside a training process it never
raises and never blocks training: failures are counted in ``errors``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import statistics
import tempfile
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from ..sdk.run import Run
from ..sdk.transport import HttpTransport

__all__ = ["HangDump", "dump_dir", "enabled"]

log = logging.getLogger("fleetlens.torch")

_BUFFER_VARS = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
PREFIX = "fleetlens_fr_rank_"


def enabled(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """The recorder keeps a buffer and the dump is not turned off."""
    if env.get("FLEETLENS_FR_DUMP", "") == "0":
        return False
    for var in _BUFFER_VARS:
        with contextlib.suppress(ValueError):
            if int(env.get(var, "0") or 0) > 0:
                return True
    return False


def dump_dir(run_id: str, job_id: str, env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """Where the ranks write their dumps (one directory per job attempt)."""
    base = env.get("FLEETLENS_FR_DIR", "")
    if not base:
        prefix = next((env[v] for v in _FILE_VARS if env.get(v)), "")
        base = os.path.dirname(prefix) if prefix else tempfile.gettempdir()
        base = os.path.join(base, "fleetlens-fr")
    return os.path.join(base, f"{run_id}-{job_id}".replace(os.sep, "_"))


def _dump_trace() -> bytes:
    import torch

    c10d: Any = torch._C._distributed_c10d  # not in torch's stubs
    return bytes(c10d._dump_fr_trace())


class _DumpFile(msgspec.Struct):
    """One rank's dump as the upload route takes it: its file name, base64 of its bytes."""

    name: str
    data: str


class _Upload(msgspec.Struct, rename="camel", omit_defaults=True):
    """The body of ``POST /v1/runs/{run}/flight-recorder``: the dumps, and the job they are of
    (absent: the run's newest)."""

    files: list[_DumpFile]
    job_id: str | None = None


class HangDump:
    """The watch of one rank (see the module's doc)."""

    def __init__(
        self,
        run: Run,
        rank: int,
        world: int,
        directory: str,
        *,
        k: float = 10.0,
        floor_s: float | None = None,
        gather_s: float = 30.0,
        poll_s: float = 1.0,
        dump: Callable[[], bytes] = _dump_trace,
        upload: Callable[[list[str]], dict[str, Any]] | None = None,
    ) -> None:
        if floor_s is None:
            floor_s = float(os.environ.get("FLEETLENS_HANG_FLOOR_S", "60") or 60)
        self.run, self.rank, self.world, self.directory = run, rank, world, directory
        self.k, self.floor_s = k, floor_s
        self.gather_s, self.poll_s = gather_s, poll_s
        self._dump, self._upload = dump, upload or self._post
        self._steps: deque[float] = deque(maxlen=20)  # recent step durations
        self._progress_at: float | None = None
        self._dumped = False
        self.dumps = 0
        self.uploads = 0
        self.errors = 0
        self.last_answer: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleetlens-fr", daemon=True)

    def start(self) -> HangDump:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def step_ended(self, seconds: float) -> None:
        """A step ended after ``seconds``: progress (the training thread; two stores)."""
        self._steps.append(seconds)
        self._progress_at = time.monotonic()

    def limit(self) -> float:
        """Seconds without a step that make a hang: HangRule.threshold of the recent steps."""
        recent = statistics.median(self._steps) if self._steps else 0.0
        return max(self.k * recent, self.floor_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                at = self._progress_at
                if at is None:
                    continue  # no step yet: start-up is not a hang
                if time.monotonic() - at < self.limit():
                    self._dumped = False
                    continue
                if not self._dumped:
                    self._dumped = True
                    self._on_hang()
            except Exception:
                self.errors += 1

    def _on_hang(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, f"{PREFIX}{self.rank}")
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(self._dump())
        os.replace(tmp, path)  # a reader never sees half a dump
        self.dumps += 1
        log.warning(
            "fleetlens: no step for %.0fs; flight recorder dumped to %s", self.limit(), path
        )
        if self.rank != 0:
            return
        deadline = time.monotonic() + self.gather_s
        while True:
            paths = sorted(
                os.path.join(self.directory, n)
                for n in os.listdir(self.directory)
                if n.startswith(PREFIX) and n[len(PREFIX) :].isdigit()
            )
            if len(paths) >= self.world or time.monotonic() >= deadline or self._stop.is_set():
                break
            time.sleep(min(self.poll_s, 0.5))
        try:
            self.last_answer = self._upload(paths)
            self.uploads += 1
        except Exception as exc:  # counted and said once; training goes on (or stays hung)
            self.errors += 1
            log.warning(
                "fleetlens: the flight recorder dumps in %s were not sent: %s", self.directory, exc
            )

    def _post(self, paths: list[str]) -> dict[str, Any]:
        """The route's body, sent with the SDK's own transport (no server extras needed)."""
        cfg = self.run.config
        files = []
        for path in paths:
            with open(path, "rb") as fh:
                data = base64.b64encode(fh.read()).decode("ascii")
            files.append(_DumpFile(os.path.basename(path), data))
        body = msgspec.json.encode(_Upload(files, cfg.job_id or None))
        route = f"/v1/runs/{urllib.parse.quote(cfg.run_id, safe='')}/flight-recorder"
        transport = HttpTransport(cfg.server, cfg.token, 120.0, path=route)
        try:
            status, reason, _, answer = transport.post(body, {"Content-Type": "application/json"})
        finally:
            transport.close()
        if status != 200:
            raise RuntimeError(f"flight-recorder upload: {status} {reason}: {answer[:300]!r}")
        return dict(json.loads(answer))
