"""A cordon drill: an elastic torchrun job on this host, three "nodes", one of them faulted.

Three torchrun agents (``--nnodes=2:3 --rdzv-backend=c10d``), one worker each, train the DDP
example (``fleetlens.examples.ddp_train``) against a fleetlens server; each agent is a node
through ``FLEETLENS_NODE_ID``. The first agent started hosts the rendezvous store, so faults go
on the others. Used by the integration tests and ``bench/cordon.py``; on-call teams can run it
against a staging server to see the whole sequence end to end.

Two faults: ``inject_xid`` reports a fatal Xid while the GPU trains on (the planned drain: the
job stops at an agreed step and checkpoints), ``lose_gpu`` is the fault for real: the node's GPU
falls off the bus, its workers die (SIGKILL), a worker started there later finds no GPU, and the
node's agent reports Xid 79. The others' collective fails, torchrun restarts the job, the server
takes the node out, and the job resumes from its newest verified checkpoint at the smaller world
size.

The rendezvous settings are the ones that make re-forming fast (``last_call_timeout=2``, keep-
alives every second, three missed ones drop a node), and ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
keeps restarted workers from reading stale peer addresses (pytorch/pytorch#135712).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..errors import FleetlensError

__all__ = ["Drill"]

RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Drill:
    server: str
    workdir: Path
    run_id: str
    steps: int = 100_000
    nodes: tuple[str, ...] = ("node-a", "node-b", "node-c")
    example_args: tuple[str, ...] = ()
    control_interval: float = 0.5
    token: str = ""
    store_timeout_s: float = 120.0  # for the first agent to open the rendezvous store
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    port: int = field(default_factory=_free_port)

    @property
    def checkpoint_dir(self) -> Path:
        return self.workdir / "ckpt"

    @property
    def lost_gpu_dir(self) -> Path:
        """A file named after a node here: the node's GPU is gone (``lose_gpu``)."""
        return self.workdir / "gpu-lost"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes=2:{len(self.nodes)}",
            "--nproc-per-node=1",
            "--max-restarts=3",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            f"--rdzv-id={self.run_id}",
            f"--rdzv-conf={RDZV_CONF}",
            "--monitor-interval=0.5",
            "-m",
            "fleetlens.examples.ddp_train",
            "--steps",
            str(self.steps),
            "--checkpoint-dir",
            str(self.checkpoint_dir),
            "--min-nodes",
            "2",
            "--lost-gpu-dir",
            str(self.lost_gpu_dir),
            *self.example_args,
        ]

    def env(self, node: str) -> dict[str, str]:
        env = {
            **os.environ,
            "FLEETLENS_SERVER": self.server,
            "FLEETLENS_RUN_ID": self.run_id,
            "FLEETLENS_NODE_ID": node,
            "FLEETLENS_CONTROL_INTERVAL": str(self.control_interval),
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        if self.token:
            env["FLEETLENS_TOKEN"] = self.token
        return env

    def start(self) -> Drill:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.lost_gpu_dir.mkdir(exist_ok=True)
        for i, node in enumerate(self.nodes):
            log = open(self.workdir / f"{node}.log", "ab")  # noqa: SIM115 - the child owns it
            self.procs[node] = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(node),
                cwd=self.workdir,
                start_new_session=True,  # the agent and its workers: one group to stop
            )
            log.close()
            if i == 0:  # the first agent must host the rendezvous store: faults go on the others
                try:
                    self._wait_for_store(node)
                except FleetlensError:
                    self.stop()  # nothing left running behind the error
                    raise
        return self

    def _wait_for_store(self, node: str) -> None:
        """Until the first agent listens on the rendezvous port. Its torch import takes seconds
        on a loaded machine; an agent started before it binds would host the store itself, and a
        fault on that node would then take the store, and the job, with it."""
        deadline = time.monotonic() + self.store_timeout_s
        while time.monotonic() < deadline:
            if self.procs[node].poll() is not None:
                raise FleetlensError(f"{node}'s torchrun exited at start: {self.log(node, 2000)}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0),
            ):
                return
            time.sleep(0.1)
        wait = self.store_timeout_s
        raise FleetlensError(f"{node}'s torchrun opened no rendezvous store in {wait:g} s")

    def log(self, node: str, tail: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return (self.workdir / f"{node}.log").read_text(errors="replace")[-tail:]
        return ""

    def inject_xid(self, node: str, xid: int = 79, gpu: int = 0) -> None:
        """The node's agent reports an XID: a real ``fleetlens agent --once`` scraping a
        dcgm-exporter page (served here on loopback) whose XID field carries ``xid``."""
        labels = f'gpu="{gpu}",UUID="GPU-drill-{node}-{gpu}",Hostname="{node}"'
        page = (
            f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid}\nDCGM_FI_DEV_GPU_TEMP{{{labels}}} 55\n"
        ).encode()

        class Exporter(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: object) -> None:
                pass

        http = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
        threading.Thread(target=http.serve_forever, daemon=True).start()
        try:
            argv = [
                sys.executable,
                "-m",
                "fleetlens",
                "agent",
                "--server",
                self.server,
                "--node",
                node,
                "--once",
                "--dcgm-url",
                f"http://127.0.0.1:{http.server_port}/metrics",
            ]
            out = subprocess.run(
                argv, capture_output=True, text=True, timeout=60, env=self.env(node)
            )
            if out.returncode != 0:
                raise FleetlensError(f"fleetlens agent failed: {out.stderr[-2000:]}")
        finally:
            http.shutdown()
            http.server_close()

    def workers(self, node: str) -> list[int]:
        """The process ids of the node's training workers (its torchrun agent's children)."""
        p = self.procs.get(node)
        if p is None or p.poll() is not None:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == p.pid and b"fleetlens.examples.ddp_train" in cmd:
                found.append(int(entry))
        return found

    def lose_gpu(self, node: str, xid: int = 79) -> float:
        """The node's GPU falls off the bus: from now on a worker started there finds no GPU,
        its workers are killed (SIGKILL: they cannot vote, checkpoint or say goodbye), and its
        node agent reports the Xid. Returns when the workers were killed (``time.time()``)."""
        (self.lost_gpu_dir / node).touch()
        pids = self.workers(node)
        if not pids:
            raise FleetlensError(f"{node} has no training worker to kill; is the drill running?")
        killed_at = time.time()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.inject_xid(node, xid)
        return killed_at

    def alive(self, node: str) -> bool:
        p = self.procs.get(node)
        return p is not None and p.poll() is None

    def stop(self) -> None:
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def __enter__(self) -> Drill:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
