"""The SDK against the real server: a collector that is down, or killed, loses nothing."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fleetlens
from fleetlens.sdk.orphans import claim, owner_digest
from fleetlens.testing import Server, free_port, wait_until

pytestmark = pytest.mark.e2e


def _train(run: fleetlens.Run, steps: range, ranks_tokens: int = 512) -> list[float]:
    """A training loop's fleetlens calls; returns the per-step cost on this thread (us)."""
    costs = []
    for i in steps:
        t0 = time.perf_counter_ns()
        with run.step(i, tokens=ranks_tokens):
            pass
        run.log(
            i,
            loss=2.0 / (1 + i),
            lr=3e-4,
            grad_norm=1.0,
            a=1.0,
            b=2.0,
            c=3.0,
            d=4.0,
            e=5.0,
            f=6.0,
            g=7.0,
        )
        costs.append((time.perf_counter_ns() - t0) / 1000)
    return costs


def _init(url: str, run_id: str, tmp_path, **kw) -> fleetlens.Run:  # type: ignore[no-untyped-def]
    kw.setdefault("spool_dir", str(tmp_path / f"spool-{run_id}"))
    return fleetlens.init(
        project="p",
        run_id=run_id,
        server=url,
        install_signal_handler=False,
        backoff_max=1.0,
        flush_interval=0.05,
        **kw,
    )


def test_collector_down_for_the_whole_run_then_everything_is_replayed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    steps = 3000
    up_server = Server(str(tmp_path / "up")).start()
    try:
        up = _init(up_server.url, "baseline", tmp_path)
        cost_up = _train(up, range(steps))
        up.finish()
    finally:
        up_server.stop()

    down = _init(f"http://127.0.0.1:{port}", "down-run", tmp_path)
    cost_down = _train(down, range(steps))
    # The exporter spools what it could not send once its send fails (within its backoff).
    stats = wait_until(lambda: (st := down.stats())["spool_bytes"] > 0 and st, 15,
                       what="the batches spooled")  # fmt: skip
    # Nothing was delivered, nothing was dropped, and it all sits in the bounded spool.
    assert stats["batches_sent"] == 0 and stats["dropped"] == 0
    assert 0 < stats["spool_bytes"] <= down.config.spool_max_bytes
    assert stats["buffered_entries"] <= sum(down.config.buffer_caps)
    # The training thread paid the same as with a live collector (loose: figures in bench/).
    assert statistics.median(cost_down) < 3 * statistics.median(cost_up) + 5

    server = Server(str(tmp_path / "data"), port=port).start()
    try:
        assert down.flush(timeout=60)
        down.finish()
        assert down.stats()["dropped"] == 0
        run = wait_until(  # the run registry is written every 2 s
            lambda: (r := server.get("/v1/runs/down-run"))["status"] == "FINISHED" and r, 60
        )
        assert run["steps"] == steps and run["step"] == steps - 1
        assert run["tokensProcessed"] == steps * 512
        assert run["metrics"]["g"] == 7.0 and run["status"] == "FINISHED"
    finally:
        server.stop()


def test_collector_killed_mid_run_nothing_lost_nothing_twice(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = str(tmp_path / "data")
    server = Server(data).start()
    run = _init(server.url, "kill-run", tmp_path)
    steps = 6000
    done = threading.Event()

    def train() -> None:
        for i in range(steps):
            with run.step(i, tokens=100):
                time.sleep(0.0002)
            run.log(i, loss=1.0)
        done.set()

    thread = threading.Thread(target=train)
    thread.start()
    time.sleep(0.5)
    server.kill()  # SIGKILL mid-stream
    time.sleep(1.0)
    server = Server(data, port=server.port).start()
    thread.join()
    try:
        assert done.is_set()
        assert run.flush(timeout=60)
        run.finish()
        assert run.stats()["dropped"] == 0
        ranks = server.get(f"/v1/runs/kill-run/ranks?fromStep=0&toStep={steps}")["ranks"]
        assert [(r["rank"], r["steps"]) for r in ranks] == [(0, steps)]
        summary = server.get("/v1/runs/kill-run")
        assert summary["tokensProcessed"] == steps * 100  # each step stored exactly once
    finally:
        server.stop()


_RANK = """
import sys, time, fleetlens
url, run_id, spool, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
run = fleetlens.init(project="p", run_id=run_id, server=url, spool_dir=spool,
                     install_signal_handler=False, backoff_max=1.0, flush_interval=0.05,
                     exit_flush_timeout=0.5)
i = 0
while steps < 0 or i < steps:
    with run.step(i, tokens=100):
        time.sleep(0.01)  # the step's compute
    run.log(i, loss=1.0 / (1 + i))
    i += 1
run.finish()
"""


def _batches(spool: Path) -> int:
    return len(list(spool.glob("*.batch")))


def _spooled(spool: Path, at_least: int) -> bool:
    return _batches(spool) >= at_least


@contextlib.contextmanager
def _left_behind(root: Path, url: str) -> Iterator[dict[str, int]]:
    """Three ranks spooling while the collector at ``url`` is down: one killed with kill -9,
    one finished with its batches still spooled (its exit flush found nobody), one frozen with
    SIGSTOP (alive: its spool is its own). Yields the batches each left, by run id."""

    def rank(run_id: str, steps: int) -> subprocess.Popen[bytes]:
        args = [url, run_id, str(root / f"{run_id}-0"), str(steps)]
        return subprocess.Popen([sys.executable, "-c", _RANK, *args])

    killed, frozen = rank("killed", -1), rank("frozen", -1)
    try:
        assert rank("finished", 120).wait(120) == 0
        for spool in (root / "killed-0", root / "frozen-0"):
            wait_until(functools.partial(_spooled, spool, 3), 60, what=f"{spool.name} spooled")
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        frozen.send_signal(signal.SIGSTOP)
        left = {r: _batches(root / f"{r}-0") for r in ("killed", "finished", "frozen")}
        assert all(left.values()), left
        yield left
    finally:
        for proc in (killed, frozen):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)


def _stored_once(server: Server) -> None:
    """The finished rank's run has every step, once, and its end; the killed rank's the steps
    it spooled, from the first, none twice."""
    done = wait_until(
        lambda: (r := server.get("/v1/runs/finished"))["status"] == "FINISHED" and r, 60
    )
    assert done["steps"] == 120 and done["tokensProcessed"] == 120 * 100
    dead = wait_until(lambda: (r := server.get("/v1/runs/killed"))["steps"] and r, 60)
    assert dead["steps"] == dead["step"] + 1 and dead["tokensProcessed"] == dead["steps"] * 100


def test_spools_left_by_a_killed_rank_and_a_finished_one_are_sent_by_the_next_run(
    tmp_path: Path,
) -> None:
    """Nobody will run the killed and the finished ranks again: the next run on the node, once
    the collector is back, sends what they left (each batch once) and leaves the frozen rank's
    spool alone."""
    port = free_port()
    url, root = f"http://127.0.0.1:{port}", tmp_path / "spool-root"
    server = Server(str(tmp_path / "data"), port=port)
    try:
        with _left_behind(root, url) as left:
            server.start()
            run = _init(url, "next", tmp_path, spool_dir=str(root / "next-0"))
            _train(run, range(20))
            adopted = wait_until(
                lambda: run.stats()["adopted_batches"], 60, what="the orphaned spools adopted"
            )
            assert adopted == left["killed"] + left["finished"]
            assert run.flush(timeout=60)
            run.finish()
            assert run.stats()["dropped"] == 0
            _stored_once(server)
            # The orphans' directories are gone; the frozen rank's spool is still its own.
            assert not (root / "killed-0").exists() and not (root / "finished-0").exists()
            assert _batches(root / "frozen-0") == left["frozen"]
    finally:
        server.stop()


def _spool_cli(root: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlens", "spool", "--root", str(root), "--server", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_fleetlens_spool_shows_what_gone_ranks_left_and_sends_it(tmp_path: Path) -> None:
    """The epilogue's way (no next run on the node): ``fleetlens spool`` says which spools are
    gone and what waits in them; ``--send`` against a collector still down keeps every batch
    and says so; once it is back, it sends them, each once, and leaves the frozen rank's."""
    port = free_port()
    url, root = f"http://127.0.0.1:{port}", tmp_path / "spool-root"
    server = Server(str(tmp_path / "data"), port=port)
    try:
        with _left_behind(root, url) as left:
            shown = _spool_cli(root, url, "--json")
            assert shown.returncode == 0, shown.stderr
            dirs = {d["name"]: d for d in json.loads(shown.stdout)}
            assert {n: (d["state"], d["yours"], d["batches"]) for n, d in dirs.items()} == {
                f"{r}-0": ("live" if r == "frozen" else "gone", True, n) for r, n in left.items()
            }
            elsewhere = _spool_cli(root, "http://127.0.0.1:1", "--json")
            assert not any(d["yours"] for d in json.loads(elsewhere.stdout))

            down = _spool_cli(root, url, "--send")
            assert down.returncode == 1 and "batches wait in" in down.stderr, down.stderr
            (held,) = root.glob("send-*")  # what it adopted waits in its own spool, gone now
            waiting = _batches(held)
            assert waiting == left["killed"] + left["finished"]
            # A batch the server will refuse as bad: dropped and counted, not blocking the rest.
            (held / "p3-00000000000000000001-000000-1-junk.batch").write_bytes(b"\xc1junk")

            # Ranks that sent all they spooled, then were killed, leave empty claimed spools:
            # more than one sweep looks at, ahead of the batches in the name order.
            for i in range(70):
                (root / f"a-empty-{i:02d}-0").mkdir()
                fd = claim(str(root / f"a-empty-{i:02d}-0"), owner_digest(url, None))
                assert fd is not None
                os.close(fd)

            server.start()
            sent = _spool_cli(root, url, "--send", "--json")
            assert sent.returncode == 0, sent.stderr
            got = json.loads(sent.stdout)
            assert got == {"server": url, "spools": 71, "batches": waiting} | {
                "refused": 1,
                "left": 0,
                "error": "",
            }
            _stored_once(server)
            assert sorted(p.name for p in root.iterdir()) == ["frozen-0"]
            assert _batches(root / "frozen-0") == left["frozen"]
    finally:
        server.stop()
