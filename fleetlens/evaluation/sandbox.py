"""Run untrusted generated code inside a bubblewrap jail, and refuse to run it without one.

The jail (``bwrap``) has its own user, mount, pid, network, IPC and UTS namespaces: no network
but a loopback of its own, a root that holds only ``/usr`` and the interpreter's prefix
(read-only), a private ``/tmp`` and work directory (size-limited tmpfs), and no files of the
host besides. The program runs as uid 65534 with no capabilities and ``no_new_privs``. When the
server is root, that uid is also 65534 on the host (the user namespace maps it so, and the jail
drops to it with ``setpriv``), so the process limit applies and nothing runs as root. It cannot
make user namespaces of its own (bwrap's ``--disable-userns``, or as root a seccomp filter).

Limits: ``prlimit`` inside the jail sets address space, CPU seconds, file size, open files and
processes before ``exec``; nothing runs in a forked child of this (threaded) process but
``exec`` itself. The wall-clock limit and the output limit (stdout and stderr together, read up
to ``output_bytes``) kill bwrap, whose pid namespace takes every process of the program with it.

Without ``bwrap`` (or ``prlimit``, ``setpriv``) :func:`run_program` raises
:class:`~fleetlens.errors.SandboxUnavailable`, unless the operator set
``FLEETLENS_SANDBOX=unsafe-allow``: then the program runs unisolated (limits only) and every run
logs a warning.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import ConfigError, SandboxUnavailable
from .seccomp import no_user_namespaces

__all__ = ["UNSAFE_ALLOW", "SandboxLimits", "SandboxResult", "run_program", "sandbox_mode"]

log = logging.getLogger("fleetlens.eval.sandbox")

UNSAFE_ALLOW = "unsafe-allow"
_MODES = ("bwrap", UNSAFE_ALLOW)
_NOBODY = 65534
_WORK = "/sandbox"
_THREAD_POOLS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_MAX_THREADS",
)
_INSTALL = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora/RHEL: dnf install "
    "bubblewrap; it needs user namespaces: sysctl kernel.unprivileged_userns_clone=1, and on "
    "Ubuntu 24.04 an AppArmor profile for bwrap), or set FLEETLENS_SANDBOX=unsafe-allow to run "
    "generated code without isolation (docs/security.md)"
)


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 1 << 30  # address space of each process
    file_bytes: int = 1 << 20  # largest file the program may write
    open_files: int = 64
    processes: int = 32  # processes and threads of the program together
    output_bytes: int = 1 << 20  # stdout and stderr together; past it the program is killed
    disk_bytes: int = 64 << 20  # each of /tmp and the work directory


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    status: str  # passed | failed | timeout | output_limit
    detail: str = ""
    stdout: str = ""


def sandbox_mode(environ: Mapping[str, str] | None = None) -> str:
    """``FLEETLENS_SANDBOX``: ``bwrap`` (the default: the jail or nothing) or ``unsafe-allow``."""
    env = os.environ if environ is None else environ
    mode = env.get("FLEETLENS_SANDBOX", "").strip() or "bwrap"
    if mode not in _MODES:
        raise ConfigError(f"FLEETLENS_SANDBOX is {mode!r}; use one of {', '.join(_MODES)}")
    return mode


def run_program(
    program: str, limits: SandboxLimits | None = None, *, mode: str | None = None
) -> SandboxResult:
    """Run ``program`` (a complete Python source); it passes if it exits 0 within the limits.

    ``mode`` None takes :func:`sandbox_mode` from the environment."""
    limits = limits or SandboxLimits()
    mode = mode or sandbox_mode()
    if mode not in _MODES:
        raise ConfigError(f"sandbox mode {mode!r}; use one of {', '.join(_MODES)}")
    tools = {tool: shutil.which(tool) for tool in _tools()}
    missing = [tool for tool, path in tools.items() if path is None]
    source = program.encode("utf-8")
    if not missing:
        try:
            return _with_pipes(functools.partial(_jailed, tools, source, limits))
        except SandboxUnavailable as exc:
            if mode != UNSAFE_ALLOW:
                raise
            why = str(exc)
    elif mode != UNSAFE_ALLOW:
        raise SandboxUnavailable(
            f"refusing to run untrusted code: {', '.join(missing)} not found on PATH; {_INSTALL}"
        )
    else:
        why = f"{', '.join(missing)} missing"
    log.warning(
        "FLEETLENS_SANDBOX=unsafe-allow: running generated code WITHOUT a jail (%s): it can "
        "read and write this host's files and use its network",
        why,
    )
    return _with_pipes(functools.partial(_unsafe, source, limits))


def _with_pipes(run: Callable[[int, int, set[int]], SandboxResult]) -> SandboxResult:
    """``run`` with the started-marker pipe; closes what ``run`` left open."""
    marker_r, marker_w = os.pipe()
    owned = {marker_r, marker_w}
    try:
        return run(marker_r, marker_w, owned)
    finally:
        for fd in owned:
            os.close(fd)


def _unsafe(
    source: bytes, limits: SandboxLimits, marker_r: int, marker_w: int, owned: set[int]
) -> SandboxResult:
    with tempfile.TemporaryDirectory(prefix="fl-sbx-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "wb") as fh:
            fh.write(source)
        prlimit = shutil.which("prlimit")
        limit = _prlimit(limits, prlimit) if prlimit else []
        argv = [*limit, sys.executable, "-I", "-c", _boot(marker_w, path)]
        return _Run(argv, [marker_w], owned, tmp, limits, marker_r, None).result()


def _tools() -> list[str]:
    return ["bwrap", "prlimit", "setpriv"] if os.geteuid() == 0 else ["bwrap", "prlimit"]


def _boot(marker_fd: int, path: str) -> str:
    """The interpreter's first statements: say it started (so a jail that failed to start is
    told from a program that failed), then run the program as ``__main__``."""
    return (
        f"import os,runpy,sys;os.write({marker_fd},b'.');os.close({marker_fd});"
        f"sys.argv=[{path!r}];runpy.run_path({path!r},run_name='__main__')"
    )


def _prlimit(limits: SandboxLimits, path: str) -> list[str]:
    return [
        path,
        f"--as={limits.memory_bytes}",
        f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        f"--nproc={limits.processes}",
        "--core=0",
        "--",
    ]


def _interpreter_roots() -> list[str]:
    """The directories the interpreter needs outside ``/usr`` (bound whole): its prefixes (a
    virtual environment's and its base's) and its own directory, outermost only."""
    roots = {os.path.abspath(sys.executable).rpartition("/")[0]}
    for prefix in (sys.prefix, sys.base_prefix):
        roots |= {os.path.abspath(prefix), os.path.realpath(prefix)}
    kept: list[str] = []
    for root in sorted(roots, key=len):
        if root in ("", "/", "/usr") or root.startswith("/usr/"):
            continue
        if not any(root == k or root.startswith(k + "/") for k in kept):
            kept.append(root)
    return kept


def _jail_argv(
    tools: Mapping[str, str | None], limits: SandboxLimits, src_fd: int, marker_w: int, root: bool
) -> list[str]:
    size = str(limits.disk_bytes)
    argv = [str(tools["bwrap"]), "--unshare-all", "--unshare-user"]
    if not root:  # bwrap cannot combine it with the uid map we write as root
        argv += ["--disable-userns"]
    argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    # the tmpfs first: an interpreter under /tmp (a virtual environment) is bound on top of it
    argv += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    argv += ["--perms", "0777", "--size", size, "--tmpfs", _WORK]
    made = {"/tmp", _WORK}
    for where in _interpreter_roots():
        parts = where.strip("/").split("/")
        for i in range(1, len(parts)):
            parent = "/" + "/".join(parts[:i])
            if parent not in made:
                made.add(parent)
                argv += ["--perms", "0755", "--dir", parent]
        argv += ["--ro-bind", where, where]
    argv += ["--perms", "0444", "--ro-bind-data", str(src_fd), f"{_WORK}/program.py"]
    argv += ["--remount-ro", "/"]  # the jail's own root (a tmpfs of no size limit) too
    argv += ["--chdir", _WORK, "--clearenv"]
    for key, value in (("PATH", "/usr/bin:/bin"), ("PYTHONHASHSEED", "0"), ("HOME", _WORK)):
        argv += ["--setenv", key, value]
    for pool in _THREAD_POOLS:  # one thread per pool: a thread per core would pass the limit
        argv += ["--setenv", pool, "1"]
    argv += ["--setenv", "TMPDIR", "/tmp", "--uid", "0" if root else str(_NOBODY)]
    argv += ["--gid", "0" if root else str(_NOBODY), "--", *_prlimit(limits, str(tools["prlimit"]))]
    if root:
        ids = [f"--reuid={_NOBODY}", f"--regid={_NOBODY}", "--clear-groups"]
        ids += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        argv += [str(tools["setpriv"]), *ids]
    return [*argv, sys.executable, "-I", "-c", _boot(marker_w, f"{_WORK}/program.py")]


def _jailed(
    tools: Mapping[str, str | None],
    source: bytes,
    limits: SandboxLimits,
    marker_r: int,
    marker_w: int,
    owned: set[int],
) -> SandboxResult:
    with tempfile.TemporaryFile() as src:
        src.write(source)
        src.flush()
        src.seek(0)
        return _jailed_from(tools, src.fileno(), limits, marker_r, marker_w, owned)


def _jailed_from(
    tools: Mapping[str, str | None],
    src_fd: int,
    limits: SandboxLimits,
    marker_r: int,
    marker_w: int,
    owned: set[int],
) -> SandboxResult:
    root = os.geteuid() == 0
    info_r, info_w = os.pipe()
    owned |= {info_r, info_w}
    argv = _jail_argv(tools, limits, src_fd, marker_w, root)
    argv[1:1] = ["--info-fd", str(info_w)]
    fds = [src_fd, marker_w, info_w]
    block_w = None
    if root:
        # As root, bwrap's own mapping would make the jail's uid host root (and exempt from
        # the process limit). It waits instead while we map uid 0 (for the mounts) and 65534
        # (for the program) to themselves; setpriv then drops to 65534 before the interpreter.
        block_r, block_w = os.pipe()
        owned |= {block_r, block_w}
        argv[1:1] = ["--userns-block-fd", str(block_r)]
        fds.append(block_r)
        bpf = no_user_namespaces()  # in place of --disable-userns, which the map excludes
        if bpf is not None:
            filter_r, filter_w = os.pipe()
            owned |= {filter_r, filter_w}
            os.write(filter_w, bpf)  # a few hundred bytes: within the pipe's buffer
            owned.discard(filter_w)
            os.close(filter_w)
            argv[1:1] = ["--seccomp", str(filter_r)]
            fds.append(filter_r)
    return _Run(argv, fds, owned, "/", limits, marker_r, (info_r, block_w)).result()


class _Run:
    """One child: started, (as root) given its uid map, read with a bound, killed at the end."""

    def __init__(
        self,
        argv: list[str],
        pass_fds: list[int],
        owned: set[int],
        cwd: str,
        limits: SandboxLimits,
        marker_r: int,
        jail: tuple[int, int | None] | None,
    ) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.wall_s
        self.marker_r = marker_r
        self.jail = jail
        self.pid1: tuple[int, str] | None = None  # the jail's first process and its start time
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxUnavailable(f"cannot start {argv[0]}: {exc}; {_INSTALL}") from exc
        for fd in pass_fds:  # the child's ends of our pipes (not the program's source)
            if fd in owned:
                owned.discard(fd)
                os.close(fd)

    def result(self) -> SandboxResult:
        try:
            if self.jail is not None:
                self._start_jail(*self.jail)
            out, err, started, over = self._collect()
            timed_out = not over and not self._wait()
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self._await_teardown()
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
        code = self.proc.returncode
        stdout = out.decode(errors="replace")
        if over:
            return SandboxResult(
                False, "output_limit", f"output over {self.limits.output_bytes} bytes", stdout
            )
        if timed_out:
            return SandboxResult(False, "timeout", f"exceeded {self.limits.wall_s}s", stdout)
        if not started:
            raise SandboxUnavailable(
                f"the sandbox did not start the program (exit {code}): "
                f"{err.decode(errors='replace').strip()[-500:]}"
            )
        if code == 0:
            return SandboxResult(True, "passed", "", stdout)
        # bwrap reports a program killed by signal N as 128 + N; a direct child as -N
        if code in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL):
            detail = f"exceeded {self.limits.cpu_s} CPU seconds"
            return SandboxResult(False, "timeout", detail, stdout)
        tail = err.decode(errors="replace").strip().splitlines()[-1:]
        return SandboxResult(False, "failed", tail[0][:500] if tail else f"exit {code}", stdout)

    def _start_jail(self, info_r: int, block_w: int | None) -> None:
        """Read bwrap's child pid; as root, map 0 and 65534 to themselves in its user namespace
        and let it go on."""
        info = b""
        with selectors.DefaultSelector() as sel:
            sel.register(info_r, selectors.EVENT_READ)
            while time.monotonic() < self.deadline:
                if sel.select(max(0.0, self.deadline - time.monotonic())):
                    chunk = os.read(info_r, 4096)
                    if not chunk:
                        break
                    info += chunk
        try:
            pid = int(json.loads(info)["child-pid"])
            self.pid1 = (pid, _start_time(pid))
        except (ValueError, KeyError, TypeError, OSError):
            self.proc.kill()
            _, err = self.proc.communicate()
            raise SandboxUnavailable(
                f"bubblewrap did not start: {err.decode(errors='replace').strip()[-500:]}; "
                f"{_INSTALL}"
            ) from None
        if block_w is None:
            return
        ids = f"0 0 1\n{_NOBODY} {_NOBODY} 1\n"
        try:
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{name}", "w", encoding="ascii") as fh:
                    fh.write(ids)
        except OSError as exc:
            self.proc.kill()
            raise SandboxUnavailable(f"cannot map the jail's user ids: {exc}") from exc
        os.write(block_w, b"1")

    def _await_teardown(self) -> None:
        """bwrap answers with the program's exit status before its pid 1 has ended; the pid
        namespace's other processes die (SIGKILL) when that one does. Wait for it, 5 s at most."""
        if self.pid1 is None:
            return
        pid, started = self.pid1
        until = time.monotonic() + 5.0
        while time.monotonic() < until:
            try:
                if _start_time(pid) != started or _state(pid) in ("Z", "X"):
                    return
            except OSError:
                return
            time.sleep(0.005)

    def _collect(self) -> tuple[bytes, bytes, bool, bool]:
        """stdout, stderr, whether the program started, whether the output went over its bound."""
        pipes = [p.fileno() for p in (self.proc.stdout, self.proc.stderr) if p is not None]
        bufs = {fd: bytearray() for fd in pipes}
        started = over = False
        cap = self.limits.output_bytes
        with selectors.DefaultSelector() as sel:
            for fd in (*bufs, self.marker_r):
                sel.register(fd, selectors.EVENT_READ)
            while bufs.keys() & {k.fd for k in sel.get_map().values()}:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if key.fd == self.marker_r:
                        started = started or bool(chunk)
                    elif chunk:
                        bufs[key.fd] += chunk
                    if not chunk:
                        sel.unregister(key.fd)
                if sum(map(len, bufs.values())) > cap:
                    over = True
                    break
            with contextlib.suppress(BlockingIOError, OSError):
                started = started or bool(_read_ready(self.marker_r))
        out, err = bufs.values()
        return bytes(out[:cap]), bytes(err[:cap]), started, over

    def _wait(self) -> bool:
        """Whether the child exited before the wall-clock deadline."""
        try:
            self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        return True


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
        return fh.read().rpartition(")")[2].split()


def _start_time(pid: int) -> str:
    return _stat(pid)[19]


def _state(pid: int) -> str:
    return _stat(pid)[0]


def _read_ready(fd: int) -> bytes:
    os.set_blocking(fd, False)
    return os.read(fd, 1)
