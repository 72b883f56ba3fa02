"""Placement in time (issue 18, item 3): node and GPU evidence applies to a run only while the
run was placed on that node. Node names are reused: run ``early`` used n1/n2 in its first
attempt, failed, and resumed on n3/n4; run ``late`` used n1/n2 in between. A GPU fault on
n2 during ``late`` is ``late``'s, not ``early``'s; an Xid on n1 while no run held it is
nobody's. Checked through the server (in this process): the analysis loop's findings, the
ranks endpoint's hardware column and the run lineage's infrastructure."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fleetlens.testing import InProcessServer, step_batch, wait_passes, wait_until
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.api

FAST_PASSES = {"FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"}
GPUS = {0: ("n1", 0), 1: ("n1", 1), 2: ("n2", 0), 3: ("n2", 1)}


def _attempt(server: InProcessServer, run: str, job: str, nodes: tuple[str, str], t0: float,
             steps: range, end: str) -> None:  # fmt: skip
    ctx = {"run_id": run, "job_id": job, "project": "llm"}
    pl = TableBuilder("placement")
    pl.add("time", [t0] * 4).add("rank", [0, 1, 2, 3]).add("world_size", [4] * 4)
    pl.add("node_id", [nodes[0], nodes[0], nodes[1], nodes[1]]).add("gpu", [0, 1, 0, 1])
    assert server.post(encode_batch({"placement": pl.build()}, ctx)[1])[0] == 200
    # How the attempt ended is sent before its steps: an analysis pass between the two would
    # see an attempt not yet over, whose node evidence runs on past its last step (a finding
    # made then is kept: see docs/detection.md, "Placement in time").
    ev = TableBuilder("event")
    ev.add("time", [t0 + 36.0]).add("kind", [end]).add("step", [steps[-1]])
    assert server.post(encode_batch({"event": ev.build()}, ctx)[1])[0] == 200
    assert server.post(step_batch(run, steps, 4, job_id=job, t0=t0, base=0.5)[1])[0] == 200


def _fault(server: InProcessServer, t: float, node: str, gpu: int, xid: int, run: str = "") -> None:
    g = TableBuilder("gpu")
    g.add("time", [t]).add("node_id", [node]).add("gpu", [gpu]).add("xid", [float(xid)])
    assert server.post(encode_batch({"gpu": g.build()}, {})[1])[0] == 200
    if run:  # the run that held the GPU reports the fault too
        ev = TableBuilder("event")
        ev.add("time", [t]).add("kind", ["hardware_fault"]).add("node_id", [node])
        ev.add("gpu", [gpu]).add("attrs", [json.dumps({"xid": xid})])
        ctx = {"run_id": run, "job_id": f"{run}-a0", "project": "llm"}
        assert server.post(encode_batch({"event": ev.build()}, ctx)[1])[0] == 200


def _xids(server: InProcessServer, run: str, lo: int, hi: int) -> dict[int, list[int]]:
    ranks = server.get(f"/v1/runs/{run}/ranks?fromStep={lo}&toStep={hi}")["ranks"]
    return {r["rank"]: (r.get("hardware") or {}).get("xids", []) for r in ranks}


def test_node_evidence_applies_to_a_run_only_while_it_was_placed_there(tmp_path: Path) -> None:
    server = InProcessServer(str(tmp_path / "data"), env=FAST_PASSES).start()
    try:
        t = time.time() - 3600
        # Device samples come in as they happen, before the runs' step records are analysed.
        _fault(server, t + 80, "n1", 1, 79)  # n1 idle between the runs: nobody's
        _fault(server, t + 120, "n2", 0, 48, run="late")  # during late, on late's rank 2
        _attempt(server, "early", "early-a0", ("n1", "n2"), t, range(0, 60), "failure")
        _attempt(server, "late", "late-a0", ("n1", "n2"), t + 100, range(0, 60), "finish")
        _attempt(server, "early", "early-a1", ("n3", "n4"), t + 200, range(60, 120), "finish")

        def findings(run: str) -> list[dict[str, Any]]:
            return list(server.get(f"/v1/runs/{run}/diagnosis")["findings"])

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(f["gpus"] for f in findings("late")):
            time.sleep(0.5)
        wait_passes(server, 3)  # later passes find nothing more
        late = [f for f in findings("late") if f["gpus"]]
        assert late and {g for f in late for g in f["gpus"]} == {"n2:0"}, late
        assert [f for f in findings("early") if f["gpus"] or f["nodes"]] == []

        assert _xids(server, "late", 0, 59) == {0: [], 1: [], 2: [48], 3: []}
        assert _xids(server, "early", 0, 59) == {0: [], 1: [], 2: [], 3: []}

        infra = server.get("/v1/lineage/runs/early")["infrastructure"]
        assert infra["xidErrors"] == [] and infra["faults"] == [
            f for f in infra["faults"] if f["sameRun"]
        ], infra
        infra = server.get("/v1/lineage/runs/late")["infrastructure"]
        assert [(x["node"], x["gpu"], x["maxXid"]) for x in infra["xidErrors"]] == [("n2", 0, 48)]
    finally:
        server.stop()


def _late_xid(tmp_path: Path, lag_s: str) -> list[dict[str, Any]]:
    """An attempt that failed 4 s ago, judged (nothing found); then the Xid of a GPU of its node
    n2, stamped just after its last step, sent late: the findings with a GPU after 3 passes."""
    env = {**FAST_PASSES, "FLEETLENS_DEVICE_LAG_S": lag_s}
    with InProcessServer(str(tmp_path / "data"), env=env) as server:
        t = time.time() - 40
        _attempt(server, "gone", "gone-a0", ("n1", "n2"), t, range(0, 60), "failure")
        wait_until(lambda: server.get("/v1/runs/gone")["step"] == 59, timeout=120)
        wait_passes(server, 3)  # the attempt's last step is analysed, nothing found
        assert not [f for f in server.get("/v1/runs/gone/diagnosis")["findings"] if f["gpus"]]
        _fault(server, t + 30.5, "n2", 1, 79)
        wait_passes(server, 3)
        return [f for f in server.get("/v1/runs/gone/diagnosis")["findings"] if f["gpus"]]


def test_the_fault_that_ended_an_attempt_is_its_own_when_reported_after_its_last_step(
    tmp_path: Path,
) -> None:
    """A GPU that falls off the bus kills the step in flight; its Xid sample arrives seconds
    later, after the attempt's last step was analysed. It is still found, on that node.

    How late it may come is judged on the server's clock (``device_lag_s`` after the attempt's
    end, and as long again to arrive): set far above what this test takes on a loaded machine,
    so that the verdict does not depend on its pace (the window's close is the next test's)."""
    found = _late_xid(tmp_path, "600")
    assert [(f["diagnosis"], f["nodes"], f["gpus"]) for f in found] == [
        ("fatal_xid", ["n2"], ["n2:1"])
    ]


def test_a_fault_reported_after_the_attempt_stopped_holding_its_nodes_is_not_its_own(
    tmp_path: Path,
) -> None:
    """The same late sample, arriving after the attempt's end plus twice ``device_lag_s`` (here
    0.5 s: long past): the node may run another job by then, so it is not this run's."""
    assert _late_xid(tmp_path, "0.5") == []


def test_a_gpu_fault_on_a_gpu_two_runs_held_at_once_says_so(tmp_path: Path) -> None:
    """Two runs report the same node and GPU names at the same time (two simulated fleets on
    one server, a placement reported wrong): an Xid on a GPU both held is found on each, and
    each finding names the other run and says the fault is not known to be its own, at half
    the confidence. A GPU only one run held stays that run's at full confidence."""
    server = InProcessServer(str(tmp_path / "data"), env=FAST_PASSES).start()
    try:
        t = time.time() - 3600
        _fault(server, t + 20, "n2", 0, 79)
        _fault(server, t + 20, "n9", 1, 79)
        _attempt(server, "left", "left-a0", ("n1", "n2"), t, range(0, 60), "finish")
        _attempt(server, "right", "right-a0", ("n2", "n9"), t + 5, range(0, 60), "finish")

        def xid_findings(run: str) -> list[dict[str, Any]]:
            found = server.get(f"/v1/runs/{run}/diagnosis")["findings"]
            return [f for f in found if f["diagnosis"] == "fatal_xid"]

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (xid_findings("left") and
                                                   len(xid_findings("right")) == 2):  # fmt: skip
            time.sleep(0.5)
        left = {g: f for f in xid_findings("left") for g in f["gpus"]}
        right = {g: f for f in xid_findings("right") for g in f["gpus"]}
        assert set(left) == {"n2:0"} and set(right) == {"n2:0", "n9:1"}, (left, right)
        assert "also placed to run right" in left["n2:0"]["summary"], left
        assert "also placed to run left" in right["n2:0"]["summary"], right
        assert left["n2:0"]["confidence"] < right["n9:1"]["confidence"], (left, right)
        assert "also placed" not in right["n9:1"]["summary"], right
        placement = [e for e in left["n2:0"]["evidence"] if e.get("metric") == "placement"]
        assert placement and placement[0]["runs"] == ["right"], left
    finally:
        server.stop()
