"""Hostile generated programs against the evaluation sandbox (bubblewrap): each one is contained.

Every hostile program exits 0 only if it got out (so ``passed`` means escaped), and the test also
checks the host side: the server saw no connection, no file appeared outside, no process lived on.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fleetlens.errors import ConfigError, SandboxUnavailable
from fleetlens.evaluation.sandbox import SandboxLimits, run_program, sandbox_mode

pytestmark = pytest.mark.e2e


def _procs_named(comm: str) -> list[int]:
    """Host processes whose name (``/proc/PID/comm``) is ``comm``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                name = Path(f"/proc/{entry}/comm").read_text().strip()
            except OSError:
                continue
            if name == comm:
                found.append(int(entry))
    return found


_NAME_ME = "import ctypes\ndef name(n): ctypes.CDLL(None).prctl(15, n.encode(), 0, 0, 0)\n"


def test_a_benign_program_prints_its_result_and_passes() -> None:
    out = run_program("import math\nprint(math.comb(10, 3))\n")
    assert out.passed and out.status == "passed" and out.stdout == "120\n"
    failed = run_program("assert sum(range(4)) == 7")
    assert not failed.passed and failed.status == "failed" and failed.detail == "AssertionError"


def test_a_fork_bomb_is_held_to_the_process_limit_and_leaves_nothing() -> None:
    token = "flb" + secrets.token_hex(4)
    # 300 children that stay: on the old sandbox (no process limit) all 300 were made, and they
    # outlived the run.
    program = _NAME_ME + (
        "import os, time\nmade = 0\n"
        "for _ in range(300):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        f"    if pid == 0:\n        name({token!r}); time.sleep(60); os._exit(0)\n"
        "    made += 1\n"
        "print(made)\nraise SystemExit(0 if made == 300 else 1)\n"
    )
    out = run_program(program, SandboxLimits(wall_s=20, processes=16))
    try:
        assert _procs_named(token) == []
        assert not out.passed and int(out.stdout) < 16
    finally:
        for pid in _procs_named(token):
            os.kill(pid, 9)


def test_a_real_fork_bomb_is_contained_and_the_host_stays_responsive() -> None:
    token = "flb" + secrets.token_hex(4)
    bomb = _NAME_ME + f"import os\nname({token!r})\nwhile True:\n    try:\n        os.fork()\n"
    bomb += "    except OSError:\n        pass\n"
    result = []
    runner = threading.Thread(
        target=lambda: result.append(run_program(bomb, SandboxLimits(wall_s=3, cpu_s=3)))
    )
    runner.start()
    # Watched from its first process (the jail's start takes longer on a loaded machine) to
    # its end: never more processes than the limit, and the host still starts one meanwhile.
    peak, spawn_s = 0, None
    deadline = time.monotonic() + 30
    while runner.is_alive() and time.monotonic() < deadline:
        peak = max(peak, len(_procs_named(token)))
        if peak and spawn_s is None:
            time.sleep(0.3)  # the bomb at full tilt
            t0 = time.monotonic()
            subprocess.run(["true"], check=True)
            spawn_s = time.monotonic() - t0
        time.sleep(0.05)
    runner.join(30)
    assert not runner.is_alive() and result[0].status == "timeout"
    assert 0 < peak <= SandboxLimits().processes
    assert spawn_s is not None and spawn_s < 2.0
    assert _procs_named(token) == []


def test_no_network_not_even_the_servers_loopback_or_unix_sockets(tmp_path: Path) -> None:
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "server.sock"))
    abstract = socket.socket(socket.AF_UNIX)
    abstract_name = "\0fleetlens-test-" + secrets.token_hex(4)
    abstract.bind(abstract_name)
    servers = (tcp, unix, abstract)
    for s in servers:
        s.listen(8)
        s.setblocking(False)
    port = tcp.getsockname()[1]
    # _socket, not socket: the old sandbox's patch of the socket module is no barrier.
    program = (
        "import _socket\nreached = []\n"
        f"for family, addr in ((_socket.AF_INET, ('127.0.0.1', {port})),"
        f" (_socket.AF_UNIX, {str(tmp_path / 'server.sock')!r}),"
        f" (_socket.AF_UNIX, {abstract_name!r})):\n"
        "    s = _socket.socket(family, _socket.SOCK_STREAM)\n"
        "    try:\n        s.connect(addr)\n        reached.append(addr)\n"
        "    except OSError as exc:\n        print(addr, exc)\n"
        "raise SystemExit(0 if reached else 1)\n"
    )
    try:
        out = run_program(program)
        assert not out.passed and out.status == "failed"
        for s in servers:
            with pytest.raises(BlockingIOError):
                s.accept()
    finally:
        for s in servers:
            s.close()


def test_it_cannot_write_outside_its_work_dir(tmp_path: Path) -> None:
    name = "fleetlens-escape-" + secrets.token_hex(4)
    targets = [tmp_path / name, Path("/") / name, Path("/etc") / name, Path("/usr") / name]
    targets.append(Path(sys.base_prefix) / name)
    program = "wrote = []\n" + "".join(
        f"try:\n    open({str(p)!r}, 'w').write('x')\n    wrote.append({str(p)!r})\n"
        "except OSError:\n    pass\n"
        for p in targets
    )
    program += "print(wrote)\nraise SystemExit(0 if wrote else 1)\n"
    try:
        out = run_program(program)
        assert not out.passed and out.stdout == "[]\n"
        assert [p for p in targets if p.exists()] == []
    finally:
        for p in targets:
            p.unlink(missing_ok=True)


def test_it_cannot_read_the_servers_files(tmp_path: Path) -> None:
    secret = secrets.token_hex(16)
    (tmp_path / "metadata.db").write_text(secret)
    program = (
        f"import os\nfound = []\nfor p in ({str(tmp_path / 'metadata.db')!r},"
        f" '/proc/{os.getpid()}/environ', '/proc/1/environ'):\n"
        "    try:\n        found.append(open(p).read())\n    except OSError:\n        pass\n"
        "print(found)\n"
        f"raise SystemExit(0 if any({secret!r} in f for f in found) else 1)\n"
    )
    out = run_program(program)
    assert not out.passed and secret not in out.stdout


def test_it_cannot_make_user_namespaces_of_its_own() -> None:
    # a user namespace is where an unprivileged process gets capabilities (and kernel bugs)
    program = (
        "import ctypes, subprocess, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "mine = libc.unshare(0x10000000) == 0\n"
        "tool = subprocess.run(['unshare', '--user', '--map-root-user', 'true']).returncode == 0\n"
        "t = threading.Thread(target=print, args=('threads work',))\nt.start(); t.join()\n"
        "raise SystemExit(0 if mine or tool else 1)\n"
    )
    out = run_program(program)
    assert not out.passed and out.status == "failed" and out.stdout == "threads work\n"


def test_huge_output_is_cut_at_its_bound() -> None:
    limits = SandboxLimits(wall_s=20, output_bytes=1 << 20)
    t0 = time.monotonic()
    out = run_program("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", limits)
    assert out.status == "output_limit" and not out.passed
    assert len(out.stdout) <= 1 << 20 and time.monotonic() - t0 < 10
    # 16 MiB on stderr and exit 0: the old sandbox read it all and called it passed
    err = run_program("import sys\nsys.stderr.write('y' * (16 << 20))\n", limits)
    assert err.status == "output_limit" and not err.passed


def test_loops_and_sleepers_are_killed_with_their_whole_tree() -> None:
    t0 = time.monotonic()
    spin = run_program("while True: pass", SandboxLimits(wall_s=10, cpu_s=1))
    assert spin.status == "timeout" and "CPU" in spin.detail and time.monotonic() - t0 < 8
    token = "fls" + secrets.token_hex(4)
    # a child that leaves the program's session and process group: the old sandbox's killpg
    # missed it
    program = _NAME_ME + (
        "import os, time\n"
        f"if os.fork() == 0:\n    os.setsid(); name({token!r}); time.sleep(60); os._exit(0)\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    out = run_program(program, SandboxLimits(wall_s=1.5))
    try:
        assert out.status == "timeout" and time.monotonic() - t0 < 5
        assert _procs_named(token) == []
    finally:
        for pid in _procs_named(token):
            os.kill(pid, 9)


def test_memory_hogs_are_held(tmp_path: Path) -> None:
    grow = run_program("chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))\n")
    assert not grow.passed and "MemoryError" in grow.detail
    # /tmp is memory too (tmpfs): the jail's is size-limited; the old sandbox wrote to the host's
    hog = f"/tmp/fleetlens-hog-{secrets.token_hex(4)}"
    program = (
        f"import os\nos.makedirs({hog!r})\nmib = 0\n"
        "try:\n    while mib < 256:\n"
        f"        open(f'{hog}/{{mib}}', 'wb').write(b'x' * (1 << 20))\n        mib += 1\n"
        "except OSError as exc:\n    print(exc)\n"
        "print(mib)\nraise SystemExit(0 if mib >= 256 else 1)\n"
    )
    try:
        out = run_program(program, SandboxLimits(disk_bytes=32 << 20, file_bytes=2 << 20))
        assert not out.passed and int(out.stdout.split()[-1]) <= 32
        assert not os.path.exists(hog)
    finally:
        subprocess.run(["rm", "-rf", hog], check=False)


def test_without_the_jail_it_refuses_unless_the_operator_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, prlimit or setpriv on it
    monkeypatch.delenv("FLEETLENS_SANDBOX", raising=False)
    with pytest.raises(SandboxUnavailable, match=r"bwrap.*apt-get install bubblewrap"):
        run_program("print(1)")
    monkeypatch.setenv("FLEETLENS_SANDBOX", "unsafe-allow")
    with caplog.at_level(logging.WARNING, logger="fleetlens.eval.sandbox"):
        out = run_program("print(1)")
    assert out.passed and out.stdout == "1\n"
    assert "WITHOUT a jail" in caplog.text
    monkeypatch.setenv("FLEETLENS_SANDBOX", "yolo")
    with pytest.raises(ConfigError, match="unsafe-allow"):
        sandbox_mode()


def test_a_jail_that_cannot_start_is_refused_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = tmp_path / "bwrap"  # what bwrap says where user namespaces are turned off
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.delenv("FLEETLENS_SANDBOX", raising=False)
    with pytest.raises(SandboxUnavailable, match=r"uid map: Permission denied.*user namespaces"):
        run_program("print(1)")
    with caplog.at_level(logging.WARNING, logger="fleetlens.eval.sandbox"):
        out = run_program("print(2)", mode="unsafe-allow")
    assert out.passed and out.stdout == "2\n" and "WITHOUT a jail" in caplog.text
