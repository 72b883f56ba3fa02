"""The remediation policy, the controller's state machine and its refusals, the SDK's control
channel and verified checkpoints, without a training job (tests/test_cordon.py runs one)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sqlalchemy import select

from fleetlens.analysis.hangs import HangRule
from fleetlens.analysis.rootcause import Diagnosis
from fleetlens.api.remediation import INFRA_KEYS, action_json, action_view, action_views
from fleetlens.api.remediation_models import ActionOut
from fleetlens.errors import ConfigError, NotFound, Refused
from fleetlens.lifecycle import RankEnd
from fleetlens.remediation.actuators import TorchrunActuator
from fleetlens.remediation.controller import Controller
from fleetlens.remediation.machine import State
from fleetlens.remediation.policy import RemediationPolicy, RunContext, decide
from fleetlens.remediation.positions import Instruction, Position
from fleetlens.sdk import NullRun
from fleetlens.sdk.config import SDKConfig
from fleetlens.sdk.control import ControlChannel
from fleetlens.store.access import AccessStore
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.findings import FindingRow, FindingsStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope
from fleetlens.testing import Server, step_batch, wait_until
from fleetlens.torch import TorchRun, latest_checkpoint, save_verified

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0


def _finding(diag: str, nodes: list[str], **kw: Any) -> FindingRow:
    fields: dict[str, Any] = {"kind": "failure", "ranks": [2], "summary": "s"}
    fields.update(kw, first_seen=kw.get("first_seen", NOW - 3600))
    return FindingRow(key=f"k:{diag}", diagnosis=diag, nodes=nodes, **fields)


def _straggler(wait: float, first_seen: float = NOW - 3600) -> FindingRow:
    return _finding(
        "straggler.persistent",
        ["n2"],
        kind="straggler",
        first_seen=first_seen,
        evidence=[{"metric": "compute / step median", "wait_per_step_s": wait}],
    )


CTX = RunContext(world=8, last_step=999, step_time_s=1.0, config={"total_steps": 11_000}, now=NOW)


def test_fatal_faults_and_hangs_always_justify_removing_their_node() -> None:
    p = RemediationPolicy()
    d = decide(p, _finding("fatal_xid", ["n2"]), CTX)
    assert d is not None and (d.node, d.reason, d.ranks) == ("n2", "fatal_xid", [2])
    assert decide(p, _finding("hang", ["n5"], kind="hang"), CTX) is not None
    # Not one node: a rack or the network is not fixed by removing a node.
    assert decide(p, _finding("fatal_xid", ["n2", "n3"]), CTX) is None
    assert decide(p, _finding("fatal_xid", []), CTX) is None
    # Recoverable faults and other diagnoses are tickets, not removals.
    assert decide(p, _finding("xid_recoverable", ["n2"]), CTX) is None
    assert decide(p, _finding("network", ["n2"]), CTX) is None


def test_straggler_is_removed_only_when_it_costs_more_than_a_restart() -> None:
    p = RemediationPolicy(restart_cost_s=300.0)
    # 10,000 steps left (config total_steps): 50 ms/step is 500 s > 300 s.
    d = decide(p, _straggler(0.05), CTX)
    assert d is not None
    assert d.cost.remaining_steps == 10_000 and d.cost.expected_loss_s == pytest.approx(500.0)
    assert d.cost.restart_cost_basis == "default"
    # 20 ms/step is 200 s < 300 s: a restart would cost more than it saves.
    assert decide(p, _straggler(0.02), CTX) is None
    # This run's own recoveries, once measured, replace the default (median of 100, 120, 150).
    measured = RunContext(8, 999, 1.0, {"total_steps": 11_000}, [150.0, 100.0, 120.0], NOW)
    d = decide(p, _straggler(0.02), measured)
    assert d is not None and d.cost.restart_cost_s == 120.0
    # Without a step budget in the config, the horizon at the current step time.
    open_ended = RunContext(8, 999, 2.0, {}, [], NOW)
    d = decide(RemediationPolicy(horizon_s=3600.0), _straggler(0.2), open_ended)
    assert d is not None and d.cost.remaining_steps == 1800
    assert "horizon" in (d.cost.remaining_basis or "")
    # Not yet shown to persist, or moving (data skew): no action.
    assert decide(p, _straggler(0.05, first_seen=NOW - 10), CTX) is None
    moving = replace(_straggler(0.05), diagnosis="straggler.moving")
    assert decide(p, moving, CTX) is None


def test_policy_refuses_bad_settings() -> None:
    with pytest.raises(ConfigError, match="mode"):
        RemediationPolicy(mode="yolo")
    with pytest.raises(ConfigError):
        RemediationPolicy(restart_cost_s=0)


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[Controller]:
    meta = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    tel = ChdbStore(str(tmp_path / "telemetry"))
    meta.observe(
        "default",
        "r1",
        job_id="r1-a0",
        project="p",
        first=NOW - 600,
        last=time.time(),
        step=500,
        world_size=3,
    )
    findings = FindingsStore(meta)
    c = Controller(
        meta,
        tel,
        findings,
        AccessStore(meta),
        RemediationPolicy(mode="recommend"),
        [TorchrunActuator()],
        hang_rule=HangRule(floor_s=5.0),
        stale_s=60.0,
        stop_timeout_s=30.0,
        readable_roots=(str(tmp_path),),  # the job's checkpoints are on a file system it shares
    )
    try:
        yield c
    finally:
        meta.close()
        tel.close()


def _run(c: Controller) -> Any:
    from fleetlens.store.models import Run

    with c.findings.metadata._session() as s:
        run = s.scalars(select(Run)).one()
        s.expunge(run)
        return run


def _positions(c: Controller, job: str = "r1-a0", now: float | None = None) -> None:
    now = time.time() if now is None else now
    for rank, node in enumerate(("n0", "n1", "n2")):
        c.report("default", "r1", Position(job, rank, 3, node, 500, 1, now, now))


def _xid(c: Controller) -> None:
    d = Diagnosis(
        "xid:n2:0:79",
        "fatal_xid",
        "failure",
        0.95,
        "Xid 79 on n2",
        500,
        500,
        500,
        nodes=["n2"],
        ranks=[2],
        job_id="r1-a0",
    )
    c.findings.upsert("default", "r1", [d])


ADMIN = Scope(tenant="default", role="admin", actor="alice")


def test_recommend_mode_records_the_action_and_tells_the_job_nothing(ctl: Controller) -> None:
    _positions(ctl)
    _xid(ctl)
    ctl.tick([_run(ctl)])
    (a,) = ctl.actions(ADMIN, "r1")
    assert (a.state, a.node, a.reason, a.mode) == (
        State.RECOMMENDED,
        "n2",
        "fatal_xid",
        "recommend",
    )
    assert action_json(a)["phases"]["detection"]["seconds"] >= 0
    assert ctl.report("default", "r1", Position("r1-a0", 0, 3, "n0", 501, 0, 0, 0)) is None
    ctl.tick([_run(ctl)])  # one action per finding: a second pass adds nothing
    assert len(ctl.actions(ADMIN, "r1")) == 1
    # An operator carries it out: the job is told to stop; a later attempt is not.
    out = ctl.approve(ADMIN, a.id)
    assert out.state is State.DRAINING and out.approved_by == "alice"
    msg = ctl.report("default", "r1", Position("r1-a0", 1, 3, "n1", 501, 0, 0, 0))
    assert msg == Instruction(a.id, "stop", "n2", "r1-a0", False, 3)
    assert ctl.report("default", "r1", Position("r1-a1", 0, 2, "n0", 1, 0, 0, 0)) is None
    with pytest.raises(Refused, match="draining"):
        ctl.reject(ADMIN, a.id)
    other_tenant = Scope(tenant="bolt", role="admin", actor="mallory")
    with pytest.raises(NotFound):
        ctl.approve(other_tenant, a.id)


def test_a_pending_action_of_a_run_that_ended_may_be_rejected_not_approved(
    ctl: Controller,
) -> None:
    # Approving it drained a node out of a finished run and added the drain's time to the
    # run's history: its wall clock grew from 0.84 h to 1.10 h and its goodput fell 17 points.
    _positions(ctl)
    _xid(ctl)
    ctl.tick([_run(ctl)])
    (a,) = ctl.actions(ADMIN, "r1")
    meta = ctl.findings.metadata
    for rank in range(3):  # every rank finished
        meta.record_end("default", "r1", "r1-a0", RankEnd(rank, "finished", time.time(), 500))
    with pytest.raises(Refused, match=r"run r1 has ended \(FINISHED\).*reject"):
        ctl.approve(ADMIN, a.id)
    assert ctl.get(ADMIN, a.id).state is State.RECOMMENDED  # nothing was done
    (view,) = action_views(ctl, ADMIN, [a])
    assert view["runEnded"] == "FINISHED"
    assert ctl.reject(ADMIN, a.id).state is State.REJECTED


def test_a_restarted_server_carries_on_with_the_actions_under_way(ctl: Controller) -> None:
    _positions(ctl)
    _xid(ctl)
    ctl.tick([_run(ctl)])
    (a,) = ctl.actions(ADMIN, "r1")
    ctl.approve(ADMIN, a.id)
    again = Controller(ctl.findings.metadata, ctl.telemetry, ctl.findings, ctl.access,
                       ctl.policy, ctl.actuators)  # fmt: skip
    msg = again.report("default", "r1", Position("r1-a0", 0, 3, "n0", 501, 0, 0, 0))
    assert msg is not None and (msg.id, msg.phase) == (a.id, "stop")


@pytest.mark.parametrize("readable", [True, False])
def test_a_checkpoint_that_does_not_match_its_checksum_stops_the_sequence(
    ctl: Controller, tmp_path: Path, readable: bool
) -> None:
    """Where the server may read the job's files it checks rank 0's checksum; a path outside its
    readable paths (the job names it: it could be /etc/shadow or a FIFO) is never opened."""
    if not readable:
        ctl.readable_roots = (str(tmp_path / "shared-fs"),)
    _positions(ctl)
    _xid(ctl)
    ctl.tick([_run(ctl)])
    (a,) = ctl.actions(ADMIN, "r1")
    ctl.approve(ADMIN, a.id)
    path = tmp_path / "ckpt-00000501.pt"
    path.write_bytes(b"what rank 0 wrote, then something changed it")
    t = time.time()
    for rank in range(3):
        ctl.ack(
            "default",
            "r1",
            {
                "id": a.id,
                "event": "stopped",
                "rank": rank,
                "jobId": "r1-a0",
                "time": t,
                "step": 501,
            },
        )
    out = ctl.ack(
        "default",
        "r1",
        {
            "id": a.id,
            "event": "checkpointed",
            "rank": 0,
            "jobId": "r1-a0",
            "time": t,
            "step": 501,
            "started": t,
            "checkpoint": {"path": str(path), "sha256": "0" * 64},
        },
    )
    got = ctl.get(ADMIN, a.id)
    if not readable:  # rank 0's word alone: the server did not read the file
        assert (
            out.state is State.REMOVING
            and got.checkpoint["verifiedBy"] == "rank 0 (read-back checksum)"
        )
        return
    assert out.state is State.FAILED
    assert "not removing the node" in got.error and not got.actuators
    # The job is told nothing more: the ranks waiting in drain() train on.
    assert ctl.report("default", "r1", Position("r1-a0", 0, 3, "n0", 501, 0, 0, 0)) is None


def test_verified_checkpoint_moves_the_sequence_to_removing_the_node(
    ctl: Controller, tmp_path: Path
) -> None:
    _positions(ctl)
    _xid(ctl)
    ctl.tick([_run(ctl)])
    (a,) = ctl.actions(ADMIN, "r1")
    ctl.approve(ADMIN, a.id)
    path = tmp_path / "ckpt-00000501.pt"
    path.write_bytes(b"weights")
    t = time.time()
    ctl.ack(
        "default",
        "r1",
        {
            "id": a.id,
            "event": "checkpointed",
            "rank": 0,
            "jobId": "r1-a0",
            "time": t,
            "step": 501,
            "started": t - 0.1,
            "checkpoint": {"path": str(path), "sha256": hashlib.sha256(b"weights").hexdigest()},
        },
    )
    assert ctl.get(ADMIN, a.id).state is State.DRAINING  # not every rank has stopped yet
    for rank in range(3):
        out = ctl.ack(
            "default",
            "r1",
            {
                "id": a.id,
                "event": "stopped",
                "rank": rank,
                "jobId": "r1-a0",
                "time": t,
                "step": 501,
            },
        )
    assert out.state is State.REMOVING
    got = ctl.get(ADMIN, a.id)
    assert got.checkpoint["verifiedBy"].startswith("server") and got.stop_step == 501
    assert [o["actuator"] for o in got.actuators] == ["torchrun"]
    msg = ctl.report("default", "r1", Position("r1-a0", 2, 3, "n2", 500, 1, 0, 0))
    assert msg is not None and msg.phase == "remove" and msg.node == "n2"
    # The node's rank stops its agent: everyone else is told to restart.
    ctl.ack(
        "default",
        "r1",
        {
            "id": a.id,
            "event": "agent_stopping",
            "rank": 2,
            "jobId": "r1-a0",
            "time": time.time(),
        },
    )
    assert ctl.get(ADMIN, a.id).state is State.RESTARTING
    # The new attempt's first step ends it; an answer for another run is refused.
    with pytest.raises(NotFound):
        ctl.ack("default", "r2", {"id": a.id, "event": "resumed", "rank": 0, "time": 1.0})
    t2 = time.time() + 1.0  # the new workers start, load, and run their first step
    ctl.ack(
        "default",
        "r1",
        {
            "id": 0,
            "event": "resumed",
            "rank": 0,
            "jobId": "r1-a1",
            "time": t2,
            "step": 501,
            "world": 2,
            "loadS": 0.05,
            "loadedAt": t2 - 0.2,
        },
    )
    done = action_json(ctl.get(ADMIN, a.id))
    assert (done["state"], done["worldAfter"], done["stepsLost"]) == ("resumed", 2, 0)
    assert list(done["phases"])[-3:] == ["rendezvous", "reload", "warmup"]
    assert done["phases"]["reload"]["seconds"] == pytest.approx(0.05, abs=1e-6)
    assert done["recoveryS"] == pytest.approx(t2 - a.decided_at)
    # Infrastructure on-call sees the action, not the run's contents (checkpoint, cost).
    oncall = action_view(Scope(tenant="default", role="oncall", actor="bob"), ctl.get(ADMIN, a.id))
    assert tuple(oncall) == INFRA_KEYS and oncall["state"] == "resumed"
    # The routes' model answers the same JSON, whole and trimmed (response_model_exclude_unset).
    for view in (action_view(ADMIN, ctl.get(ADMIN, a.id)), oncall):
        out = ActionOut.model_validate(view).model_dump(by_alias=True, exclude_unset=True)
        assert list(out) == list(view) and out == view


def test_a_big_job_stops_without_a_row_write_per_rank(ctl: Controller, tmp_path: Path) -> None:
    world = 4096
    t = time.time()
    for rank in range(world):
        node = f"n{rank // 8}"
        ctl.report("default", "r1", Position("r1-a0", rank, world, node, 500, 1, t, t))
    d = Diagnosis("xid:n7:0:79", "fatal_xid", "failure", 0.95, "Xid 79 on n7", 500, 500, 500,
                  nodes=["n7"], ranks=[56], job_id="r1-a0")  # fmt: skip
    ctl.findings.upsert("default", "r1", [d])
    ctl.tick([_run(ctl)])
    (a,) = ctl.actions(ADMIN, "r1")
    ctl.approve(ADMIN, a.id)
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"w")
    digest = hashlib.sha256(b"w").hexdigest()
    states = set()
    for rank in range(world):
        out = ctl.ack("default", "r1", {"id": a.id, "event": "stopped", "rank": rank,
                                        "jobId": "r1-a0", "time": t, "step": 501})  # fmt: skip
        states.add(out.state)
    assert states == {State.DRAINING}  # every rank stopped, the checkpoint not yet reported
    ck = {"path": str(path), "sha256": digest}
    out = ctl.ack("default", "r1", {"id": a.id, "event": "checkpointed", "rank": 0,
                                    "jobId": "r1-a0", "time": t, "step": 501, "started": t,
                                    "checkpoint": ck})  # fmt: skip
    assert out.state is State.REMOVING
    assert [x["ranks"] for x in ctl.get(ADMIN, a.id).acks if x["event"] == "stopped"] == [world]
    assert ctl.get(ADMIN, a.id).world_before == world


def test_live_hang_names_the_rank_behind_the_others(ctl: Controller) -> None:
    ctl.policy = RemediationPolicy(mode="automatic")
    t = time.time()
    stuck_since = t - 30
    for rank, (node, step, seq) in enumerate((("n0", 81, 1), ("n1", 81, 1), ("n2", 80, 3))):
        ctl.report("default", "r1", Position("r1-a0", rank, 3, node, step, seq, stuck_since, t))
    ctl.tick([_run(ctl)])
    (f,) = ctl.findings.rows(ADMIN, "r1")
    assert (f.diagnosis, f.nodes, f.ranks) == ("hang", ["n2"], [2])
    (a,) = ctl.actions(ADMIN, "r1")
    # A hung step cannot finish: no stop, no drain checkpoint; straight to removing the node.
    assert a.state is State.REMOVING and a.reason == "hang"
    assert "periodic" in a.checkpoint["source"]


@pytest.mark.e2e
@pytest.mark.parametrize(("last_poll_s", "hung"), [(29.0, False), (1.0, True)])
def test_ranks_that_stopped_polling_when_they_stopped_are_dead_not_hung(
    ctl: Controller, last_poll_s: float, hung: bool
) -> None:
    """No progress for 30 s (1 s steps: threshold 10 s). Ranks still polling are hung; ranks
    whose last poll was when they stopped are dead (a fatal fault killed one, the others' collective
    failed): not a hang, which would name a node before the fault that killed it does."""
    ctl.policy = RemediationPolicy(mode="recommend")
    t = time.time()
    for rank, (node, step, seq) in enumerate((("n0", 81, 1), ("n1", 81, 1), ("n2", 80, 3))):
        ctl.report("default", "r1", Position("r1-a0", rank, 3, node, step, seq, t - 30,
                                             t - last_poll_s))  # fmt: skip
    ctl.repo.step_durations = lambda tenant, run, n: [1.0] * n  # type: ignore[method-assign]
    ctl.tick([_run(ctl)])
    assert [f.diagnosis for f in ctl.findings.rows(ADMIN, "r1")] == (["hang"] if hung else [])


def test_the_live_hang_threshold_scales_with_the_step_time(
    ctl: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stuck for 30 s with hang_s 5: a hang for 1 s steps (threshold 10 s), not for 10 s steps
    (threshold 100 s: a multiple of the job's own step time, as analysis and alerts judge it)."""
    ctl.policy = RemediationPolicy(mode="recommend")
    t = time.time()
    for rank, (node, step, seq) in enumerate((("n0", 81, 1), ("n1", 81, 1), ("n2", 80, 3))):
        ctl.report("default", "r1", Position("r1-a0", rank, 3, node, step, seq, t - 30, t))
    monkeypatch.setattr(ctl.repo, "step_durations", lambda tenant, run, n: [10.0] * n)
    ctl.tick([_run(ctl)])
    assert ctl.findings.rows(ADMIN, "r1") == []
    monkeypatch.setattr(ctl.repo, "step_durations", lambda tenant, run, n: [1.0] * n)
    ctl.tick([_run(ctl)])
    (f,) = ctl.findings.rows(ADMIN, "r1")
    assert f.diagnosis == "hang" and f.evidence[0]["threshold"] == 10.0


@pytest.mark.e2e
@pytest.mark.parametrize(("silent_s", "stop_after_s", "hung"), [
    (59.0, None, False),  # under the floor (60 s > 10 x 1 s steps)
    (61.0, None, True),
    (61.0, 10.0, False),  # the job reported a stop soon after its last step: not a hang
    (61.0, -30.0, False),  # ... or just before it (a drain, then the step and checkpoint)
    (200.0, -90.0, True),  # a stop long before the last progress explains nothing
])  # fmt: skip
def test_one_hang_rule_for_analysis_alerts_and_remediation(
    silent_s: float, stop_after_s: float | None, hung: bool
) -> None:
    """The analysis loop, the alert engine and the controller all judge a hang by
    fleetlens.analysis.hangs: the same verdict for the same silence."""
    from fleetlens.alerts.engine import RunSignals, evaluate
    from fleetlens.alerts.policy import DEFAULT_POLICY
    from fleetlens.analysis.hangs import HangRule, find_stalls, live_hang, recent_step_time

    last, now = 10_000.0, 10_000.0 + silent_s
    steps = np.arange(last - 100.0, last + 0.5, 1.0)  # 1 s steps ending at `last`
    stops = [] if stop_after_s is None else [last + stop_after_s]
    thr = HangRule().threshold(recent_step_time(np.diff(steps)))
    analysis = find_stalls(steps, now, thr, np.asarray(stops))
    remediation = live_hang(last, now, HangRule(floor_s=60.0).threshold(1.0), stops)
    signals = RunSignals("t", "r", "p", now, "RUNNING", 100, last, 1.0,
                         stopped_at=stops[0] if stops else None)  # fmt: skip
    alerts = [c for c in evaluate(DEFAULT_POLICY, signals) if c.rule.signal == "hang"]
    assert (bool(analysis), remediation is not None, bool(alerts)) == (hung, hung, hung)
    if hung:
        assert analysis[0].detected_at == alerts[0].starts_at == last + 60.0


def test_everyone_stuck_in_the_same_place_blames_no_node(ctl: Controller) -> None:
    ctl.policy = RemediationPolicy(mode="automatic")
    t = time.time()
    for rank, node in enumerate(("n0", "n1", "n2")):
        ctl.report("default", "r1", Position("r1-a0", rank, 3, node, 81, 1, t - 30, t))
    ctl.tick([_run(ctl)])
    assert ctl.findings.rows(ADMIN, "r1") == [] and ctl.actions(ADMIN, "r1") == []


def test_control_channel_never_raises_and_never_blocks_when_the_server_is_gone() -> None:
    cfg = SDKConfig(server="http://127.0.0.1:9", run_id="r", job_id="r-a0", send_timeout=0.5)
    ch = ControlChannel(cfg, lambda: (3, 0), interval=0.05)
    ch.start()
    for i in range(200):  # more answers than the queue holds: the oldest go, nothing raises
        ch.ack(1, "stopped", step=i)
    wait_until(lambda: ch.errors > 0, 30, what="the channel to count its failed polls")
    ch.close()
    assert ch.errors > 0 and ch.action is None and len(ch._acks) <= 64


def test_stop_requested_without_a_process_group_is_false_and_cheap() -> None:
    tr = TorchRun(NullRun())
    assert not any(tr.stop_requested(s) for s in range(100))
    assert tr.errors == 0  # its cost on the hot path is measured in bench/torch_overhead.py


def test_resume_skips_a_checkpoint_whose_file_no_longer_matches(tmp_path: Path) -> None:
    run = NullRun()
    save_verified(run, {"w": torch.ones(3)}, str(tmp_path), 100)
    man = save_verified(run, {"w": torch.full((3,), 2.0)}, str(tmp_path), 200)
    assert man["sha256"] == hashlib.sha256(Path(man["path"]).read_bytes()).hexdigest()
    assert json.loads((tmp_path / "ckpt-00000200.json").read_text())["step"] == 200
    found = latest_checkpoint(str(tmp_path))
    assert found is not None and found[0]["step"] == 200
    with open(man["path"], "r+b") as fh:  # bit rot after the write
        fh.seek(40)
        fh.write(b"\xff\xff")
    found = latest_checkpoint(str(tmp_path))
    assert found is not None and found[0]["step"] == 100
    tr = TorchRun(run)
    step, state = tr.resume(str(tmp_path)) or (None, None)
    assert step == 100 and torch.equal(state["w"], torch.ones(3))
    (tmp_path / "ckpt-00000300.pt").write_bytes(b"no manifest: never resumed from")
    assert latest_checkpoint(str(tmp_path))[0]["step"] == 100  # type: ignore[index]


@pytest.mark.e2e
def test_a_big_job_polls_no_faster_than_the_server_allows(server: Server) -> None:
    _, body = step_batch("big-run", range(0, 3), 2)
    assert server.post(body)[0] == 200
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the run registry catches up within seconds
        if server.request("GET", "/v1/runs/big-run")[0] == 200:
            break
        time.sleep(0.2)
    cfg = SDKConfig(server=server.url, run_id="big-run", job_id="j1", rank=5, world_size=10_000)
    ch = ControlChannel(cfg, lambda: (2, 0), interval=0.05)
    ch.start()
    try:
        ch.next_poll(10.0, now=True)
        # 10,000 ranks at 0.05 s would be 200,000 polls a second; the server spreads them.
        assert ch.action is None and ch.min_interval == pytest.approx(5.0)
        assert ch.cadence == pytest.approx(5.0) and ch.errors == 0
    finally:
        ch.close()
