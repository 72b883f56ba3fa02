"""A full disk under a real server (issue 38): ingest refused with 503 and Retry-After, reads
answering, the server saying it is out of space, and nothing an SDK job sent lost once space
returns. The data directory is a small tmpfs mounted for the test (the e2e tier runs as root,
as CI does); the disk is filled from outside the server, as another process would."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import fleetlens
from fleetlens.testing import Server, step_batch, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(
            f"mounting a small file system for the disk-full tests needs root: {done.stderr}"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount: Path, leave: int) -> Path:
    """A ballast file that leaves ``leave`` bytes free on the mount."""
    st = os.statvfs(mount)
    ballast = mount / "ballast"
    with open(ballast, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, st.f_bavail * st.f_frsize - leave)
    return ballast


def _metric(server: Server, name: str) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


@pytest.mark.parametrize("floor", [64 << 20, 0], ids=["below-the-floor", "engine-out-of-space"])
def test_a_full_disk_refuses_ingest_with_retry_after_and_loses_nothing(
    disk: Path, floor: int
) -> None:
    server = Server(str(disk / "data"), env={"FLEETLENS_MIN_FREE_BYTES": str(floor)}).start()
    try:
        assert server.post(step_batch("full", range(0, 5), 4)[1])[0] == 200
        run = fleetlens.init(
            project="p",
            run_id="sdk-full",
            server=server.url,
            spool_dir=str(disk.parent / "spool"),
            flush_interval=0.05,
            install_signal_handler=False,
        )
        for i in range(20):
            with run.step(i):
                pass
        assert run.flush(10.0)
        # Below the floor (the first case), or with a few KiB left that the engine's insert
        # needs more than (the second: the engine fails, and that is a refusal too).
        ballast = _fill(disk, 32 << 20 if floor else 16 << 10)
        time.sleep(1.1)  # the server looks at the free space at most once a second
        status, answer, headers = server.post(step_batch("full", range(5, 105), 64)[1])
        assert status == 503, (status, answer)
        assert "disk is full" in answer["error"] and int(headers["retry-after"]) >= 1
        for i in range(20, 60):  # the job goes on through the outage
            with run.step(i):
                pass
        run.flush(0.5)
        # Reads answer meanwhile, and the server says why ingest is refused.
        started = time.monotonic()
        assert server.get("/v1/runs/full")["steps"] == 5
        assert time.monotonic() - started < 5
        assert server.get("/healthz")["storage"]["outOfSpace"] is True
        assert _metric(server, "fleetlens_storage_out_of_space") == 1
        # Space comes back: ingest resumes, and the job's steps of the outage arrive once.
        ballast.unlink()
        wait_until(lambda: server.post(step_batch("full", range(5, 105), 64)[1])[0] == 200, 30)
        assert server.get("/healthz")["storage"]["outOfSpace"] is False
        # The job sends what it kept once the Retry-After has passed.
        wait_until(lambda: run.flush(1.0) and run.stats()["spool_files"] == 0, 60)
        run.finish()
        stats = run.stats()
        assert stats["dropped"] == 0 and stats["send_failures"] >= 1, stats
        assert server.get("/v1/runs/sdk-full")["steps"] == 60
        ranks = server.get("/v1/runs/full/ranks?fromStep=0&toStep=200")["ranks"]
        assert {r["steps"] for r in ranks if r["rank"] < 4} == {105}
    finally:
        server.stop()
