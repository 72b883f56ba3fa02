"""Run untrusted generated code: a child process with time, memory and file limits, no network.

The child is a fresh ``python -I`` in an empty temporary directory with an empty environment.
Limits come from ``resource.setrlimit`` in the child before it starts (address space, CPU
seconds, file size, open files, processes); the wall-clock limit kills its process group. The
network is cut by a new network namespace where the kernel allows one (root, or unprivileged
user namespaces), and in every case by replacing ``socket`` before the program runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

__all__ = ["SandboxLimits", "SandboxResult", "run_program"]

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000

_PRELUDE = """\
import socket as _s
def _denied(*a, **k):
    raise OSError("network access is disabled in the evaluation sandbox")
_s.socket = _denied
_s.create_connection = _denied
_s.getaddrinfo = _denied
del _s, _denied
"""


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 1 << 30
    file_bytes: int = 1 << 20
    open_files: int = 64


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    status: str  # passed | failed | timeout
    detail: str = ""


def _isolate(limits: SandboxLimits) -> None:
    """In the child, before exec: limits, a process group, and no network namespace."""
    os.setsid()
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWNET) != 0:
            libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
    except (OSError, AttributeError):
        pass  # the socket prelude still holds


def run_program(program: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``program`` (a complete Python source); it passes if it exits 0 within the limits."""
    limits = limits or SandboxLimits()
    with tempfile.TemporaryDirectory(prefix="fleetlens-sandbox-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(_PRELUDE + "\n" + program)
        proc = subprocess.Popen(
            [sys.executable, "-I", path],
            cwd=tmp,
            env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: _isolate(limits),
        )
        try:
            _, err = proc.communicate(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return SandboxResult(False, "timeout", f"exceeded {limits.wall_s}s")
    if proc.returncode == 0:
        return SandboxResult(True, "passed")
    if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return SandboxResult(False, "timeout", f"exceeded {limits.cpu_s} CPU seconds")
    tail = err.decode(errors="replace").strip().splitlines()[-1:] if err else []
    return SandboxResult(False, "failed", tail[0][:500] if tail else f"exit {proc.returncode}")
