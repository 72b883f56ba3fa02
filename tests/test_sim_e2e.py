"""A small scenario through the real HTTP path into a real server, read back via the run API."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleetlens.errors import SimError
from fleetlens.sim import load_scenario, run_scenario
from fleetlens.sim.emit import HttpSink
from fleetlens.testing import Server

pytestmark = pytest.mark.e2e


def test_straggler_scenario_end_to_end(server: Server) -> None:
    scn = load_scenario("straggler_persistent")
    scn = replace(scn, job=replace(scn.job, steps=300, run_id="e2e-sim"))
    res = run_scenario(scn, server=server.url, speed=0)
    assert res.records["step"] == 300 * 64
    run = server.get("/v1/runs/e2e-sim")
    assert run["steps"] == 300
    assert run["tokensProcessed"] == 300 * scn.job.tokens_per_step
    ranks = server.get("/v1/runs/e2e-sim/ranks?sort=comm&order=asc&limit=64")["ranks"]
    assert len(ranks) == 64
    # durations are equal in a synchronous job; the straggler is the one that waits least
    assert ranks[0]["rank"] == 13
    assert ranks[0]["commMs"] < ranks[1]["commMs"]
    assert ranks[0]["node"] == "node-0001" and ranks[0]["gpu"] == 5


def test_refused_batch_raises(server: Server) -> None:
    sink = HttpSink(server.url)
    bad = {"step": (1, {"step": __import__("numpy").array([-1])})}
    with pytest.raises(SimError, match="HTTP 4"):
        sink.send({"run_id": "x"}, bad)
    sink.close()
