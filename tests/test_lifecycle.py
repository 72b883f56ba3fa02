"""A run's status from its ranks' last words: FINISHED when they finished, FAILED naming a rank
killed from outside (its peers stopped or failing on its absence), STOPPED on SIGTERM.

The rules are pure (fleetlens/lifecycle.py) and tested on their own; then on real processes of
``fleetlens.init`` against a real server, with the signals sent from outside as a launcher or a
person would: SIGKILL of one rank, SIGTERM of the others (what torchrun does when a worker dies).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from fleetlens.lifecycle import GRACE_S, RankEnd, job_verdict, peer_error
from fleetlens.testing import Server, wait_until

pytestmark = pytest.mark.unit

GLOO = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
    "peer [127.0.0.1]:18344. This is typically caused by a remote worker crashing."
)


def test_every_rank_finished_is_finished_and_not_before() -> None:
    ends = [RankEnd(r, "finished", 100.0 + r, -1) for r in range(3)]
    assert job_verdict(4, ends, last_seen=103.0, now=104.0, last_step=19) is None
    v = job_verdict(4, [*ends, RankEnd(3, "finished", 103.5)], 103.5, 104.0, 19)
    assert v is not None and (v.status, v.ranks, v.step) == ("FINISHED", (), 19)


def test_a_rank_gone_silent_while_its_peers_failed_on_it_is_the_failed_one() -> None:
    ends = [
        RankEnd(0, "stopped", 50.0, -1, "received SIGTERM"),
        RankEnd(1, "failed", 49.0, 88, GLOO),
        RankEnd(3, "failed", 49.1, 88, GLOO),
    ]
    assert peer_error(GLOO) and not peer_error("ValueError: bad batch")
    assert job_verdict(4, ends, last_seen=50.0, now=50.0 + GRACE_S / 2, last_step=88) is None
    v = job_verdict(4, ends, last_seen=50.0, now=50.0 + GRACE_S, last_step=88)
    assert v is not None and (v.status, v.ranks, v.step) == ("FAILED", (2,), 88)
    assert "rank 2" in v.reason and "killed" in v.reason


def test_a_rank_s_own_error_beats_its_peers_errors_and_signals() -> None:
    ends = [
        RankEnd(1, "failed", 49.0, 88, GLOO),
        RankEnd(2, "failed", 48.9, 88, "ValueError: bad batch"),
        RankEnd(0, "stopped", 50.0),
        RankEnd(3, "stopped", 50.0),
    ]
    v = job_verdict(4, ends, last_seen=50.0, now=50.1, last_step=88)
    assert v is not None and (v.status, v.ranks) == ("FAILED", (2,))
    assert "ValueError" in v.reason


def test_all_ranks_stopped_by_a_signal_is_stopped() -> None:
    ends = [RankEnd(r, "stopped", 10.0, -1, "received SIGTERM") for r in range(4)]
    v = job_verdict(4, ends, last_seen=10.0, now=10.5, last_step=7)
    assert v is not None and v.status == "STOPPED" and "SIGTERM" in v.reason


def test_finished_ranks_beside_silent_ones_are_a_finished_job_said_so() -> None:
    ends = [RankEnd(r, "finished", 10.0) for r in range(3)]
    v = job_verdict(4, ends, last_seen=10.0, now=10.0 + GRACE_S, last_step=7)
    assert v is not None and v.status == "FINISHED" and "rank 3 sent no finish" in v.reason


def test_the_job_as_a_whole_ends_it_for_every_rank() -> None:
    v = job_verdict(256, [RankEnd(-1, "finished", 10.0, 900)], 10.0, 10.0, 900)
    assert v is not None and (v.status, v.step) == ("FINISHED", 900)


_WORKER = textwrap.dedent(
    """
    import sys, time, fleetlens
    steps = int(sys.argv[1])
    run = fleetlens.init(project="lifecycle", heartbeat_s=1.0)
    i = 0
    while steps < 0 or i < steps:
        with run.step(i, tokens=64):
            with run.phase("forward"):
                t = time.perf_counter()
                while time.perf_counter() - t < 0.02:
                    pass
        run.log(i, loss=1.0 / (i + 1))
        if i == 5:
            print("stepping", flush=True)
        i += 1
    run.finish()
    """
)


def _ranks(server: Server, run_id: str, steps: int, world: int = 4) -> list[subprocess.Popen[Any]]:
    procs = []
    for r in range(world):
        env = {
            **os.environ,
            "RANK": str(r),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(r),
            "FLEETLENS_RUN_ID": run_id,
            "FLEETLENS_SERVER": server.url,
            "FLEETLENS_RELAY": "off",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(steps)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    return procs


def _reap(procs: list[subprocess.Popen[Any]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=30)


@pytest.mark.e2e
def test_ranks_that_finish_make_a_finished_run_with_every_finish_on_its_timeline(
    server: Server,
) -> None:
    procs = _ranks(server, "fin", 20)
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out
    run = wait_until(
        lambda: (r := server.get("/v1/runs/fin"))["status"] == "FINISHED" and r, 30, 0.2, "FINISHED"
    )
    assert run["ended"]["reason"] == "all 4 ranks finished"
    items = server.get("/v1/runs/fin/timeline")["items"]
    ranks_of = {
        k: sorted(i["rank"] for i in items if i.get("kind") == k) for k in ("job_start", "finish")
    }
    assert ranks_of == {"job_start": [0, 1, 2, 3], "finish": [0, 1, 2, 3]}


@pytest.mark.e2e
@pytest.mark.parametrize("victim", [2])
def test_a_rank_killed_from_outside_fails_the_run_naming_it(server: Server, victim: int) -> None:
    procs = _ranks(server, "kill", -1)
    try:
        for p in procs:
            assert p.stdout is not None and b"stepping" in p.stdout.readline()
        procs[victim].send_signal(signal.SIGKILL)  # the OOM killer, a person, a lost node
        procs[victim].wait(10)
        for r, p in enumerate(procs):  # what torchrun does to the others when a worker dies
            if r != victim:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
        stopped = wait_until(
            lambda: (r := server.get("/v1/runs/kill"))["status"] != "RUNNING" and r,
            GRACE_S + 60,
            0.5,
            "a verdict",
        )
        assert stopped["status"] == "FAILED", stopped
        assert stopped["ended"]["ranks"] == [victim]
        found = wait_until(
            lambda: [
                f
                for f in server.get("/v1/runs/kill/diagnosis")["findings"]
                if f["diagnosis"] == "rank_lost"
            ],
            60,
            0.5,
            "the rank_lost finding",
        )
        assert found[0]["ranks"] == [victim]
    finally:
        _reap(procs)


@pytest.mark.e2e
def test_sigterm_to_every_rank_is_a_stopped_run(server: Server) -> None:
    procs = _ranks(server, "term", -1)
    try:
        for p in procs:
            assert p.stdout is not None and b"stepping" in p.stdout.readline()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
        run = wait_until(
            lambda: (r := server.get("/v1/runs/term"))["status"] == "STOPPED" and r,
            30,
            0.2,
            "STOPPED",
        )
        assert "SIGTERM" in run["ended"]["reason"] and run["ended"]["ranks"] == []
    finally:
        _reap(procs)


_RAISES = textwrap.dedent(
    """
    import fleetlens
    run = fleetlens.init(project="lifecycle")
    for i in range(3):
        with run.step(i, tokens=8):
            pass
    raise RuntimeError("the trainer's loop broke outside any step")
    """
)


@pytest.mark.e2e
def test_an_exception_outside_any_step_is_the_rank_s_last_word(server: Server) -> None:
    """A trainer's callbacks see no exception: the SDK reports the one that ends the process."""
    env = {
        **os.environ,
        "FLEETLENS_RUN_ID": "raised",
        "FLEETLENS_SERVER": server.url,
        "FLEETLENS_RELAY": "off",
    }
    done = subprocess.run(
        [sys.executable, "-c", _RAISES], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and "outside any step" in done.stderr  # the user still sees it
    run = wait_until(
        lambda: (r := server.get("/v1/runs/raised"))["status"] == "FAILED" and r, 30, 0.2, "FAILED"
    )
    assert run["ended"]["ranks"] == [0] and "outside any step" in run["ended"]["reason"]
    assert run["ended"]["step"] == 2
