"""Shared test machinery: a real server in a subprocess, a real PostgreSQL, batch builders."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from fleetlens.wire import TableBuilder, encode_batch

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T | None], timeout: float = 60.0, every: float = 0.1, what: str = ""
) -> T:
    """Poll ``probe`` until it returns something truthy, and return that; fail after ``timeout``.

    For conditions that become true eventually (a background pass, a worker's progress): a
    deadline that is generous on a loaded machine instead of a fixed sleep, so the test waits no
    longer than it must and does not flake when the machine is slow.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what or 'condition'} not met within {timeout} s (last: {last!r})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """``fleetlens serve`` in a subprocess on a loopback port, with its own data directory."""

    data_dir: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    extra_args: tuple[str, ...] = ()
    log_path: str = ""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Server:
        self.log_path = os.path.join(self.data_dir, f"server-{self.port}.log")
        os.makedirs(self.data_dir, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetlens",
                "serve",
                "--data",
                self.data_dir,
                "--port",
                str(self.port),
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        raise RuntimeError(f"server did not come up in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        with contextlib.suppress(OSError), open(self.log_path, errors="replace") as fh:
            return fh.read()[-5000:]
        return ""

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def get(self, path: str, token: str | None = None) -> Any:
        req = urllib.request.Request(self.url + path)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)

    def request(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        """Any request; returns (status, decoded JSON or text) and never raises on 4xx/5xx."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw, status = r.read(), r.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def post(
        self,
        body: bytes,
        content_type: str = "application/msgpack",
        encoding: str = "",
        token: str | None = None,
        path: str = "/v1/ingest",
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        req = urllib.request.Request(self.url + path, data=body, method="POST")
        req.add_header("Content-Type", content_type)
        if encoding:
            req.add_header("Content-Encoding", encoding)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.load(r), dict(r.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}"), dict(exc.headers)


def step_batch(
    run_id: str,
    steps: range,
    ranks: int,
    *,
    job_id: str = "j1",
    base: float = 0.4,
    slow: dict[int, float] | None = None,
    t0: float | None = None,
    tokens: int = 1000,
    batch_id: str | None = None,
    ctx: dict[str, str] | None = None,
) -> tuple[str, bytes]:
    """A batch of per-rank step records; ``slow`` maps rank -> slowdown factor."""
    n_steps = len(steps)
    step = np.repeat(np.asarray(steps, dtype="<i8"), ranks)
    rank = np.tile(np.arange(ranks, dtype="<i4"), n_steps)
    dur = np.full(len(step), base)
    for r, factor in (slow or {}).items():
        dur[rank == r] = base * factor
    start = (t0 if t0 is not None else time.time() - 60) + (step - steps.start) * base * 1.2
    tb = TableBuilder("step")
    tb.add_packed("step", step.tobytes()).add_packed("rank", rank.tobytes())
    tb.add_packed("time", start.astype("<f8").tobytes())
    tb.add_packed("duration", dur.astype("<f8").tobytes())
    tb.add_packed("tokens", np.full(len(step), tokens, dtype="<i8").tobytes())
    context = {"run_id": run_id, "job_id": job_id, "project": "test", **(ctx or {})}
    return encode_batch({"step": tb.build()}, context, batch_id=batch_id)


def _pg_bin() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    path = found[-1] if found else shutil.which("pg_ctl")
    if not path:
        raise RuntimeError(
            "PostgreSQL server binaries not found; install them: apt-get install postgresql"
        )
    return os.path.dirname(path)


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free loopback port; yields its SQLAlchemy URL."""
    bindir = _pg_bin()
    root = tempfile.mkdtemp(prefix="fleetlens-pg-")
    os.chmod(root, 0o777)
    data = os.path.join(root, "data")
    port = free_port()
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        as_user = ["runuser", "-u", "postgres", "--"]

    def run(*cmd: str) -> None:
        subprocess.run([*as_user, *cmd], check=True, capture_output=True, timeout=120)

    try:
        run(f"{bindir}/initdb", "-D", data, "-U", "fleetlens", "--auth=trust", "-E", "UTF8")
        run(
            f"{bindir}/pg_ctl",
            "-D",
            data,
            "-w",
            "-t",
            "60",
            "-l",
            os.path.join(root, "log"),
            "-o",
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )
        run(
            f"{bindir}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "fleetlens", "fleetlens"
        )
        yield f"postgresql+psycopg://fleetlens@127.0.0.1:{port}/fleetlens"
    finally:
        with contextlib.suppress(Exception):
            run(f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)
