"""Auto-cordon for real: three torchrun agents on this host, one node faulted, the controller
drains it, the job checkpoints at an agreed step, the node's agent is stopped, the others
re-rendezvous at world size 2 and resume from exactly the drained step.

Each case is the whole sequence through real processes: ``fleetlens serve`` (the controller in
its monitoring pass), elastic torchrun (c10d rendezvous, gloo), the DDP example with the SDK's
control channel, and for the Xid case the node agent (``fleetlens agent``) scraping a
dcgm-exporter page.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 - the integration needs it installed; CI installs it

from fleetlens.errors import FleetlensError
from fleetlens.remediation.controller import PHASES
from fleetlens.remediation.drill import Drill
from fleetlens.testing import Server, wait_passes

from .test_cli import fleetlens_cmd

pytestmark = pytest.mark.e2e


def _server(
    tmp_path: Path, mode: str, straggler_persist_s: float = 3600.0, hang_s: float = 30.0
) -> Server:
    """Stragglers are acted on only in the test about them, and hangs judged in 5 s only in the
    hung rank's: on two shared cores a rank that gets less CPU for a while is a real straggler,
    and one starved for 5 s looks hung (a gate saw the Xid drill's action proposed for a hang)."""
    return Server(
        str(tmp_path / "server"),
        env={
            "FLEETLENS_REMEDIATION": mode,
            "FLEETLENS_ANALYSIS_INTERVAL_S": "1",
            "FLEETLENS_HANG_S": str(hang_s),
            "FLEETLENS_STRAGGLER_PERSIST_S": str(straggler_persist_s),
            # The drills' checkpoints are on a file system the server shares.
            "FLEETLENS_READABLE_PATHS": str(tmp_path),
        },
    ).start()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Any]]:
    """Whatever a test starts (servers, drills) is stopped, drills first."""
    things: list[Any] = []
    yield things
    for t in reversed(things):
        t.stop()


def _wait(what: str, fn: Callable[[], Any], timeout: float, drill: Drill, srv: Server) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = fn()
        except OSError:  # the run is not registered yet
            got = None
        if got:
            return got
        time.sleep(0.5)
    logs = "\n".join(f"--- {n}\n{drill.log(n, 2500)}" for n in drill.nodes)
    raise AssertionError(f"timed out waiting for {what}\n{logs}\n--- server\n{srv.log()}")


def _text(srv: Server, path: str) -> str:
    with urllib.request.urlopen(srv.url + path, timeout=30) as r:
        return str(r.read().decode())


def _action(srv: Server, run: str, states: tuple[str, ...]) -> dict[str, Any] | None:
    rows = srv.get(f"/v1/remediations?runId={run}")["remediations"]
    return rows[0] if rows and rows[0]["state"] in states else None


def _check_resumed(srv: Server, run: str, a: dict[str, Any]) -> None:
    """What every drained run must show: world 3 -> 2, the sequence timed, the books kept."""
    assert a["state"] == "resumed", a
    assert (a["worldBefore"], a["worldAfter"]) == (3, 2)
    assert a["node"] == "node-c"
    assert list(a["phases"]) == [p for p in PHASES if p in a["phases"]]
    assert {"rendezvous", "reload", "warmup", "remove"} <= set(a["phases"])
    for name, p in a["phases"].items():
        assert p["seconds"] is not None and p["seconds"] >= 0, (name, p)
    assert a["recoveryS"] is not None and 0 < a["recoveryS"] < 90
    # The new attempt runs at world size 2 and starts at exactly the step it resumed from.
    deadline = time.monotonic() + 60  # the run registry catches up within seconds
    while len(jobs := srv.get(f"/v1/runs/{run}")["jobIds"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(jobs) == 2 and a["jobId"] == jobs[0], jobs
    resume = a["resumeStep"]
    while time.monotonic() < deadline + 30:
        # every step: the default 1,000 points are a downsampled series once the run is longer
        points = srv.get(f"/v1/runs/{run}/metrics?name=loss&points=100000")["points"]
        if points[-1]["step"] > resume + 25:
            break
        time.sleep(0.5)
    loss = {p["step"]: p["value"] for p in points}
    steps = [p["step"] for p in points]
    assert steps == list(range(steps[0], steps[-1] + 1)), "a step is missing or doubled"
    assert steps[-1] > resume + 25 and points[-1]["step"] > a["stopStep"] + 12
    before = [loss[s] for s in range(resume - 5, resume)]
    after = [loss[s] for s in range(resume, resume + 5)]
    # Continuous: the restored model picks up where it left off (a fresh one is at ~4.85).
    assert abs(sum(after) / 5 - sum(before) / 5) < 0.5 * (sum(before) / 5), (before, after)
    fresh = a["stopStep"] + 2  # steps only the new attempt ran (a hang's are re-run before)
    # Each node sends on its own clock: wait until both have sent those steps and their
    # placement (a rank's node is its placement's), not only rank 0.
    window = f"/v1/runs/{run}/ranks?fromStep={fresh}&toStep={fresh + 10}"

    def placed(ranks: list[dict[str, Any]]) -> bool:
        return len(ranks) >= 2 and all(r["node"] is not None for r in ranks)

    while not placed(ranks := srv.get(window)["ranks"]) and time.monotonic() < deadline + 60:
        time.sleep(0.5)
    assert sorted(str(r["node"]) for r in ranks) == ["node-a", "node-b"], ranks
    # Every phase is on the timeline, and the goodput breakdown charges the pause to recovery.
    tl = srv.get(f"/v1/runs/{run}/timeline?fromStep={max(0, resume - 100)}&toStep={resume + 3}")
    shown = {i["attrs"].get("phase") for i in tl["items"] if i["kind"] == "remediation"}
    timed = {n for n in a["phases"] if n not in ("detection", "approval")}
    assert timed <= shown, (timed, shown)
    assert any(i["kind"] == "drain" for i in tl["items"])
    gp = srv.get(f"/v1/runs/{run}/goodput")["breakdown"]
    lines = {line["category"]: line["seconds"] for line in gp["lines"]}
    assert lines["recovery"] >= 0.9 * a["phases"]["rendezvous"]["seconds"], lines
    assert gp["interruptions"].get("recovery") == 1, gp["interruptions"]


def test_fatal_xid_on_a_node_is_drained_after_approval_and_the_job_resumes_without_it(
    tmp_path: Path, started: list[Any]
) -> None:
    srv = _server(tmp_path, "approve")
    started.append(srv)
    drill = Drill(
        srv.url, tmp_path / "job", "cordon-xid", example_args=("--checkpoint-every", "50")
    )
    started.append(drill.start())
    _wait("step 40", lambda: (srv.get("/v1/runs/cordon-xid")["step"] or 0) >= 40, 120, drill, srv)
    drill.inject_xid("node-c", 79)
    pending = _wait(
        "an action awaiting approval",
        lambda: _action(srv, "cordon-xid", ("awaiting_approval",)),
        60,
        drill,
        srv,
    )
    assert pending["reason"] == "fatal_xid" and pending["node"] == "node-c"
    # Nothing happens to the job until someone approves: it is still at world size 3.
    wait_passes(srv, 3)
    assert all(drill.alive(n) for n in drill.nodes)
    # The on-call engineer approves it from the command line.
    listed = fleetlens_cmd("remediations", "list", "--server", srv.url)
    assert listed.returncode == 0 and "mode: approve" in listed.stdout, listed.stderr
    row = next(
        line for line in listed.stdout.splitlines() if line.split()[:1] == [str(pending["id"])]
    )
    assert "awaiting_approval" in row and "node-c" in row and "fatal_xid" in row
    out = fleetlens_cmd(
        "remediations", "approve", str(pending["id"]), "--server", srv.url, "--json"
    )
    assert out.returncode == 0, out.stderr
    approved = json.loads(out.stdout)
    assert approved["state"] == "draining" and approved["approvedBy"] == "local"
    again = fleetlens_cmd("remediations", "approve", str(pending["id"]), "--server", srv.url)
    assert again.returncode != 0 and "HTTP 409" in again.stderr, again
    a = _wait(
        "the job to resume",
        lambda: _action(srv, "cordon-xid", ("resumed", "failed")),
        120,
        drill,
        srv,
    )
    _check_resumed(srv, "cordon-xid", a)
    assert a["stepsLost"] == 0 and a["stopStep"] == a["resumeStep"]
    assert "approval" in a["phases"]
    assert (
        a["checkpoint"]["verifiedBy"].startswith("server") and len(a["checkpoint"]["sha256"]) == 64
    )
    assert [o["actuator"] for o in a["actuators"]] == ["torchrun"]
    _wait("node-c's agent to exit", lambda: not drill.alive("node-c"), 30, drill, srv)
    assert drill.alive("node-a") and drill.alive("node-b")
    # The alert that paged for the fault and its incident record the action.
    alert = srv.get(f"/v1/alerts/{a['alertId']}")
    assert alert["alertname"] == "FatalHardwareFault"
    assert [r["id"] for r in alert["remediations"]] == [a["id"]]
    # Prometheus sees it too, for the dashboards on-call already has.
    deadline = time.monotonic() + 60
    want = 'fleetlens_remediations{state="resumed",tenant="default"} 1.0'
    while want not in (text := _text(srv, "/metrics")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert want in text, text[-2000:]
    incident = srv.get(f"/v1/incidents/{a['incidentId']}")
    assert [r["id"] for r in incident["remediations"]] == [a["id"]]
    assert incident["remediations"][0]["state"] == "resumed"


def _automatic(
    tmp_path: Path, started: list[Any], run: str, *example_args: str
) -> tuple[Server, Drill, dict[str, Any]]:
    """A drill with a fault from the start, the server in automatic mode: the finished action."""
    persist = 3.0 if "--slow-node" in example_args else 3600.0
    srv = _server(tmp_path, "automatic", persist, 5.0 if "--hang-node" in example_args else 30.0)
    started.append(srv)
    drill = Drill(srv.url, tmp_path / "job", run, example_args=example_args)
    started.append(drill.start())
    a = _wait(
        "the faulty node to be removed and the job to resume",
        lambda: _action(srv, run, ("resumed", "failed")),
        180,
        drill,
        srv,
    )
    return srv, drill, a


def test_persistent_straggler_costing_more_than_a_restart_is_drained_automatically(
    tmp_path: Path, started: list[Any]
) -> None:
    srv, drill, a = _automatic(
        tmp_path, started, "cordon-slow", "--slow-node", "node-c", "--slow-ms", "60",
        "--from-step", "30",
    )  # fmt: skip
    # Persistent, or "intermittent" when start-up noise made an earlier episode on this
    # crowded machine; either way its episode is still going when the node is drained.
    assert a["reason"] in ("straggler.persistent", "straggler.intermittent"), a
    _check_resumed(srv, "cordon-slow", a)
    assert a["stepsLost"] == 0 and a["stopStep"] == a["resumeStep"]
    # The trade that justified it: the straggler's cost over the rest of the run vs a restart.
    cost = a["cost"]
    assert cost["expectedLossS"] > cost["restartCostS"] and cost["waitPerStepS"] > 0.02
    # Without the slow node no rank computes longer than its peers. (Not their step time
    # against the slow phase's: on a crowded machine both phases are CPU bound, and the job
    # without node-c shares its work among fewer ranks; a gate on a 1.3-CPU cap saw 108 ms
    # after against 100 ms before, with the straggler gone.)
    resume = a["resumeStep"]
    slow = srv.get(f"/v1/runs/cordon-slow/ranks?fromStep=35&toStep={resume - 1}")["ranks"]
    # Fifty steps, so one stall of this crowded machine does not make the mean.
    _wait(
        "50 steps after the resume",
        lambda: (srv.get("/v1/runs/cordon-slow")["step"] or 0) >= resume + 56,
        120,
        drill,
        srv,
    )
    fast = srv.get(f"/v1/runs/cordon-slow/ranks?fromStep={resume + 5}&toStep={resume + 55}")
    lag = max(r["computeSlowdown"] or 0.0 for r in slow)
    assert lag >= 1.5, slow
    assert max(r["computeSlowdown"] or 0.0 for r in fast["ranks"]) < 1.25, (slow, fast)


def test_hung_rank_is_found_its_node_removed_and_the_others_resume_before_any_timeout(
    tmp_path: Path, started: list[Any]
) -> None:
    srv, _, a = _automatic(
        tmp_path, started, "cordon-hang", "--hang-node", "node-c", "--hang-at-step", "80",
        "--checkpoint-every", "25",
    )  # fmt: skip
    assert a["reason"] == "hang", a
    _check_resumed(srv, "cordon-hang", a)
    # A hung step never finishes: the job goes back to its newest verified checkpoint.
    assert a["resumeStep"] == 75 and a["stepsLost"] == a["stopStep"] - 75
    finding = [
        f
        for f in srv.get("/v1/runs/cordon-hang/diagnosis")["findings"]
        if f["key"] == a["findingKey"]
    ]
    assert finding and finding[0]["nodes"] == ["node-c"] and finding[0]["diagnosis"] == "hang"
    # Detected after the 5 s threshold, resumed long before gloo's 30-minute collective timeout.
    hung_at = a["phases"]["detection"]["start"]
    first_step = a["phases"]["warmup"]["end"]
    assert first_step - hung_at < 60, a["phases"]


def test_gpu_lost_for_real_its_workers_die_and_the_job_resumes_from_its_newest_verified_checkpoint(
    tmp_path: Path, started: list[Any]
) -> None:
    """Xid 79 as it happens: node-c's GPU falls off the bus and takes its worker with it
    (SIGKILL: no vote, no checkpoint). The others' all-reduce fails, torchrun restarts the job,
    the server takes node-c out, and the job goes on at world size 2 from its newest verified
    checkpoint, losing at most the steps since it."""
    every, run = 20, "cordon-fatal"
    srv = _server(tmp_path, "automatic")
    started.append(srv)
    drill = Drill(srv.url, tmp_path / "job", run, example_args=("--checkpoint-every", str(every)))
    started.append(drill.start())
    _wait("step 50", lambda: (srv.get(f"/v1/runs/{run}")["step"] or 0) >= 50, 120, drill, srv)
    victims = drill.workers("node-c")
    assert len(victims) == 1, victims
    killed_at = drill.lose_gpu("node-c", 79)
    a = _wait(
        "the job to resume without node-c",
        lambda: _action(srv, run, ("resumed", "failed")),
        180,
        drill,
        srv,
    )
    assert a["state"] == "resumed", a
    assert (a["reason"], a["node"]) == ("fatal_xid", "node-c")
    assert a["checkpoint"]["lost"] is True and "periodic" in a["checkpoint"]["source"]
    assert (a["worldBefore"], a["worldAfter"]) == (3, 2)
    # The killed worker is gone for good, and so is node-c's agent (the server removed it: its
    # next worker found no GPU and waited to be taken out); the others train on.
    _wait("node-c's agent to exit", lambda: not drill.alive("node-c"), 30, drill, srv)
    assert not any(Path(f"/proc/{pid}").exists() for pid in victims)
    assert drill.alive("node-a") and drill.alive("node-b")
    assert "no GPU on node-c" not in drill.log("node-c", 20_000)  # removed, not failed
    # It resumed from a verified checkpoint no older than the newest one verified before the
    # kill and verified before the job's first step after it (rank 0 may finish the checkpoint
    # of a step every rank completed while node-c dies: newer and just as good); the steps
    # since, redone.
    verified = [json.loads(m.read_text()) for m in drill.checkpoint_dir.glob("ckpt-*.json")]
    before = max(m["step"] for m in verified if m["time"] <= killed_at)
    usable = {m["step"] for m in verified if m["time"] <= a["decidedAt"] + a["recoveryS"]}
    assert a["resumeStep"] in usable and a["resumeStep"] >= before, (a, verified)
    assert 0 <= a["stepsLost"] <= every and a["stepsLost"] == a["stopStep"] - a["resumeStep"]
    assert a["stopStep"] > 50
    # Recovery timed from the kill: the survivors' failure detection is part of it.
    first_step_at = a["decidedAt"] + a["recoveryS"]
    assert 0 < first_step_at - killed_at < 120, a
    fresh = a["stopStep"] + 2
    _wait(
        "steps beyond the lost ones",
        lambda: (srv.get(f"/v1/runs/{run}")["step"] or 0) > fresh + 10,
        60,
        drill,
        srv,
    )

    def newest_nodes() -> list[str]:
        """The nodes of the run's newest 10 steps. The window moves with the run: node-c's
        agent, back in the first restart until the server removes it, can cost one more
        re-formation, and that attempt redoes steps from its checkpoint; the newest steps are
        the last formation's once it has passed the others'. Its placement is joined as it
        arrives."""
        top = int(srv.get(f"/v1/runs/{run}")["step"] or 0)
        path = f"/v1/runs/{run}/ranks?fromStep={max(fresh, top - 10)}&toStep={top}"
        return sorted({str(r["node"]) for r in srv.get(path)["ranks"]})

    _wait(
        "the steps after the loss to run on node-a and node-b only",
        lambda: newest_nodes() == ["node-a", "node-b"],
        90,
        drill,
        srv,
    )
    # The run's findings name the fault and the node; the action is linked to it.
    finding = [
        f for f in srv.get(f"/v1/runs/{run}/diagnosis")["findings"] if f["key"] == a["findingKey"]
    ]
    assert finding and finding[0]["diagnosis"] == "fatal_xid", finding
    assert finding[0]["nodes"] == ["node-c"]


class _NoStore(Drill):
    """A first agent that starts but never opens the rendezvous store (or exits at once)."""

    exit_at_start: bool = False

    def command(self) -> list[str]:
        code = (
            "print('no torchrun here'); raise SystemExit(3)"
            if self.exit_at_start
            else "import time; time.sleep(60)"
        )
        return [sys.executable, "-c", code]


def test_a_drill_whose_first_agent_opens_no_store_says_so_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    drill = _NoStore("http://127.0.0.1:9", tmp_path / "a", "no-store", store_timeout_s=1.0)
    with pytest.raises(FleetlensError, match="node-a's torchrun opened no rendezvous store in 1 s"):
        drill.start()
    assert list(drill.procs) == ["node-a"] and not drill.alive("node-a")  # stopped, no others
    gone = _NoStore("http://127.0.0.1:9", tmp_path / "b", "no-store")
    gone.exit_at_start = True
    with pytest.raises(FleetlensError, match="exited at start: no torchrun here"):
        gone.start()
    assert list(gone.procs) == ["node-a"]
