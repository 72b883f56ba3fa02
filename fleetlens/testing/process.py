"""The server as users run it (``fleetlens serve`` in a process of its own) and a PostgreSQL."""

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _PortTaken(RuntimeError):
    """The server could not bind its port: another process holds it."""


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
        """Start it and wait for ``/healthz``. A first start whose port another process took
        between :func:`free_port` and the bind (several test workers start servers at once) is
        tried again on a new port; a restart keeps its port (the test's clients know it)."""
        first, own_log = self.proc is None, not self.log_path
        for attempt in range(3):
            try:
                return self._start(timeout)
            except _PortTaken:
                if not first or attempt == 2:
                    raise
                self.port = free_port()
                if own_log:
                    self.log_path = ""
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> Server:
        self.log_path = self.log_path or os.path.join(self.data_dir, f"server-{self.port}.log")
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
                text = self.log()
                error = _PortTaken if "address already in use" in text else RuntimeError
                raise error(f"server exited early:\n{text}")
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
        return _send(req, token, 30)

    def put(
        self, path: str, content: bytes, content_type: str, token: str | None = None
    ) -> tuple[int, Any]:
        """A raw body PUT (a trace file); (status, decoded JSON or text)."""
        req = urllib.request.Request(self.url + path, data=content, method="PUT")
        req.add_header("Content-Type", content_type)
        return _send(req, token, 60)

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


def _send(req: urllib.request.Request, token: str | None, timeout: float) -> tuple[int, Any]:
    """(status, decoded JSON or text) of a request; never raises on 4xx/5xx."""
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


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
