"""Run comparison on simulated runs: a learning-rate change vs a straggler."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fleetlens.analysis.compare import RunFigures, conclude, config_diff
from fleetlens.sim.library import load_scenario, run_scenario
from fleetlens.testing import Server, wait_until
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.unit

CONFIG = {
    "model": "8b",
    "optim": {"lr": 3e-4, "betas": [0.9, 0.95]},
    "global_batch_size": 512,
    "seq_length": 8192,
}


@pytest.fixture
def gserver(tmp_path: Path) -> Iterator[Server]:
    srv = Server(str(tmp_path / "data")).start()
    try:
        yield srv
    finally:
        srv.stop()


def _sim(server: Server, scenario: str, run_id: str) -> None:
    scn = load_scenario(scenario)
    job = dataclasses.replace(scn.job, run_id=run_id, steps=300, checkpoint_every=100)
    run_scenario(scn, server=server.url, speed=0, job=job)


def _val_loss(server: Server, run_id: str, scale: float) -> None:
    """The validation loss each run's evaluation logged (the simulator has none)."""
    steps = list(range(0, 300, 20))
    v = [scale * (2.1 + 8.5 * np.exp(-s / 2000.0)) for s in steps]
    t = TableBuilder("scalar")
    t.add("step", steps).add("time", [1.7e9 + s for s in steps]).add(
        "name", ["val_loss"] * len(steps)
    )
    t.add("value", v)
    _, body = encode_batch({"scalar": t.build()}, {"run_id": run_id, "job_id": "eval"})
    assert server.post(body)[0] == 200


def test_config_diff_shows_only_what_differs_changed_first() -> None:
    b = {**CONFIG, "optim": {"lr": 6e-4, "betas": [0.9, 0.95]}, "new_flag": True}
    diff = config_diff([CONFIG, b])
    assert [(d["key"], d["status"]) for d in diff] == [
        ("optim.lr", "changed"),
        ("new_flag", "added"),
    ]
    assert config_diff([CONFIG, dict(CONFIG)]) == []
    c = {**CONFIG, "global_batch_size": 1024}
    keys = [d["key"] for d in config_diff([CONFIG, c])]
    assert keys == ["derived.tokens_per_step", "global_batch_size"]


@pytest.mark.e2e
def test_compare_lr_vs_straggler(gserver: Server) -> None:
    for run in ("base", "lr"):
        _sim(gserver, "_small", f"sim-{run}")
    _sim(gserver, "straggler_persistent", "sim-straggler")
    high_lr = {**CONFIG, "optim": {"lr": 6e-4, "betas": [0.9, 0.95]}}
    for run, cfg in (("sim-base", CONFIG), ("sim-lr", high_lr), ("sim-straggler", CONFIG)):
        st, _ = gserver.request(
            "POST",
            f"/v1/runs/{run}/describe",
            {"config": cfg, "dataset": "web:v42", "code": "a94df2"},
        )
        assert st == 200
    _val_loss(gserver, "sim-base", 1.0)
    _val_loss(gserver, "sim-lr", 1.08)
    _val_loss(gserver, "sim-straggler", 1.0)

    cmp = gserver.get("/v1/runs/compare?left=sim-base&right=sim-lr")
    assert [d["key"] for d in cmp["config"]] == ["optim.lr"]
    assert not cmp["dataset"]["changed"] and not cmp["code"]["changed"]
    c = cmp["conclusions"][0]
    assert c["cause"] == "configuration" and c["qualityRegressed"] and not c["speedRegressed"]
    assert c["lines"][0] == "Infrastructure appears healthy."
    assert "optim.lr" in c["lines"][-1]
    tail = cmp["matchedSteps"]["val_loss"]["tail"]
    assert tail["sim-lr"] == pytest.approx(tail["sim-base"] * 1.08)
    side = {s["runId"]: s for s in cmp["side"]}
    assert side["sim-base"]["mfu"] is None or side["sim-base"]["mfu"] > 0
    assert side["sim-base"]["stepTimeMedianSeconds"] == pytest.approx(
        side["sim-lr"]["stepTimeMedianSeconds"], rel=0.02
    )

    # The goodput a comparison shows is the run page's and the goodput endpoint's.
    for run in ("sim-base", "sim-lr"):
        factors = gserver.get(f"/v1/runs/{run}/goodput")["factors"]
        assert side[run]["goodput"] == pytest.approx(factors["jobProduct"], abs=1e-9)
        assert side[run]["runtimeGoodput"] == pytest.approx(factors["runtime"], abs=1e-9)
        overview = gserver.get(f"/v1/runs/{run}/overview")["goodput"]["factors"]
        assert side[run]["goodput"] == pytest.approx(overview["jobProduct"], abs=1e-9)

    cmp = gserver.get("/v1/runs/compare?runs=sim-base,sim-straggler,sim-lr")
    assert [d["key"] for d in cmp["config"]] == ["optim.lr"]
    by_run = {c["run"]: c for c in cmp["conclusions"]}
    s = by_run["sim-straggler"]
    assert s["cause"] == "infrastructure" and s["speedRegressed"] and s["infrastructureChanged"]
    assert "slowest rank" in s["lines"][0]
    assert by_run["sim-lr"]["cause"] == "configuration"
    # Once the analysis has diagnosed the straggler, the conclusion names the finding too.
    wait_until(
        lambda: gserver.get("/v1/runs/sim-straggler/stragglers")["stragglers"],
        timeout=90,
        what="the straggler finding",
    )
    cmp = gserver.get("/v1/runs/compare?left=sim-base&right=sim-straggler")
    (s,) = cmp["conclusions"]
    assert "straggler.persistent finding(s)" in s["lines"][0] and s["cause"] == "infrastructure"
    issues = [i for side in cmp["side"] for i in side["health"]["issues"]]
    assert any("straggler.persistent finding(s)" in i for i in issues), issues


def test_diagnosed_infrastructure_findings_count_before_the_config_is_blamed() -> None:
    """`fleetlens compare` said "infrastructure appears healthy" for runs with diagnosed
    network and rack faults, and blamed the config (issue 18)."""
    base = RunFigures("a", step_time_s=1.0)
    slow = RunFigures("b", step_time_s=1.3, findings={"network": 1, "rack_cooling": 1})
    lr = [{"key": "optim.lr", "values": [3e-4, 6e-4], "status": "changed"}]
    c = conclude(base, slow, lr)
    assert c.infrastructure_changed and c.cause == "configuration and infrastructure"
    assert "1 network finding(s)" in c.lines[0] and "1 rack_cooling finding(s)" in c.lines[0]
    assert conclude(base, slow, []).cause == "infrastructure"
    # The same findings in both runs did not change: the config is what changed.
    assert (
        conclude(slow, RunFigures("c", step_time_s=1.7, findings=slow.findings), lr).cause
        == "configuration"
    )


def test_conclusion_rules() -> None:
    base = RunFigures("a", step_time_s=1.0, quality={"val_loss": 2.0})
    same = RunFigures("b", step_time_s=1.0, quality={"val_loss": 2.0})
    assert conclude(base, same, []).cause == "none"
    worse = RunFigures("b", step_time_s=1.0, quality={"val_loss": 2.2}, dataset="web:v42")
    assert conclude(base, worse, []).cause == "data"
    both = RunFigures("b", step_time_s=1.3, faults={"hardware_fault": 2})
    diff = [{"key": "lr", "status": "changed", "values": [1, 2]}]
    assert conclude(base, both, diff).cause == "configuration and infrastructure"
    assert (
        conclude(base, RunFigures("b", step_time_s=1.0, quality={"val_loss": 2.2}), []).cause
        == "unexplained"
    )


def test_a_candidate_that_lost_goodput_to_a_fatal_fault_and_failed_a_gate_regressed() -> None:
    """Compare said "no regression" for a candidate whose goodput fell from 83.8% to 73.4% with
    a fatal Xid and a failed safety gate: loss and step time alone decided (issue 37)."""
    base = RunFigures("v141", step_time_s=1.0, quality={"val_loss": 2.0}, goodput=0.838)
    cand = RunFigures(
        "v142",
        step_time_s=1.01,
        quality={"val_loss": 2.0},
        goodput=0.734,
        faults={"hardware_fault": 1},
        evaluation_failures=["safety regression in safety/unsafe_rate"],
    )
    lr = [{"key": "optim.lr", "values": [3e-4, 6e-4], "status": "changed"}]
    c = conclude(base, cand, lr)
    assert c.cause != "none" and c.goodput_regressed and c.faults_regressed
    assert c.evaluation_regressed and not c.quality_regressed and not c.speed_regressed
    assert not any("No regression" in line for line in c.lines)
    # Goodput, faults and the evaluation come before the configuration in what it says.
    said = (
        "Goodput fell: 83.8% -> 73.4% (-10.4 points)",
        "More faults in v142",
        "Evaluation of v142 failed: safety",
        "Training configuration changed",
    )
    order = [next(i for i, line in enumerate(c.lines) if line.startswith(p)) for p in said]
    assert order == sorted(order), c.lines
    assert c.cause == "configuration and infrastructure"
    # A goodput a point lower, no new fault, no failed gate: no regression.
    close = RunFigures("v143", step_time_s=1.0, quality={"val_loss": 2.0}, goodput=0.83)
    assert conclude(base, close, []).cause == "none"
