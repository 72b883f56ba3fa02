"""The SDK against the real server: a collector that is down, or killed, loses nothing."""

from __future__ import annotations

import statistics
import threading
import time

import pytest

import fleetlens
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
    return fleetlens.init(
        project="p",
        run_id=run_id,
        server=url,
        spool_dir=str(tmp_path / f"spool-{run_id}"),
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
