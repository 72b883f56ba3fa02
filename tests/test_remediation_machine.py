"""Golden tests of the remediation state machine: every transition, one row each.

Each row is (the action before, what was observed, the state after, the effects, the fields the
transition sets). The machine is pure: no database, no clock, no actuator; the controller's
own tests (tests/test_remediation.py) and the real drill (tests/test_cordon.py) cover the I/O.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from fleetlens.remediation.machine import (
    Action,
    Actuate,
    Effect,
    Emit,
    ForgetStops,
    Limits,
    LookUpLastStep,
    Observations,
    Refused,
    State,
    Verify,
    advance,
    asks,
    initial_state,
    instruction,
)
from fleetlens.remediation.positions import Instruction

pytestmark = pytest.mark.unit

NOW = 1000.0
LIMITS = Limits(stop_timeout_s=300.0, remove_timeout_s=15.0, resume_timeout_s=900.0)
DETECTED = {"detection": (890.0, 900.0)}


def act(state: State, **kw: Any) -> Action:
    base: dict[str, Any] = dict(
        id=7, tenant="t", run_id="r", node="n2", reason="fatal_xid", mode="automatic",
        state=state, decided_at=900.0, updated_at=900.0, job_id="j0", world_before=3,
        phases=dict(DETECTED),
    )  # fmt: skip
    return Action(**{**base, **kw})


POLLING = Observations(job_id="j0", world=3)
DRAIN = Emit("drain", NOW, {"planned": False, "remediation": 7, "node": "n2",
                            "reason": "fatal_xid"}, "j0")  # fmt: skip


def failed(why: str) -> Emit:
    return Emit("remediation", NOW, {"remediation": 7, "phase": "failed", "error": why}, "j0")


# -- draining --------------------------------------------------------------------------------
WAITING = {**DETECTED, "wait": (950.0, None)}
CK = {"event": "checkpointed", "rank": 0, "jobId": "j0", "time": 990.0, "step": 501,
      "started": 985.0, "checkpoint": {"path": "/c/ckpt.pt", "sha256": "ab"},
      "received": 990.0}  # fmt: skip
ALL_STOPPED = Observations(job_id="j0", world=3, stopped=3, stopped_at=988.0)
CHECKED = replace(ALL_STOPPED, verified=True, verified_at=995.0)
STOP_ACK = {"event": "stopped", "ranks": 3, "time": 988.0, "jobId": "j0", "received": NOW}
DRAINED_PHASES = {**DETECTED, "wait": (950.0, 988.0), "checkpoint": (985.0, 990.0),
                  "verify": (990.0, 995.0)}  # fmt: skip
MISMATCH = "checkpoint /c/ckpt.pt has sha256 cd, the job wrote ab: not removing the node"


def draining(**kw: Any) -> Action:
    return act(State.DRAINING, **{"phases": dict(WAITING), **kw})


# -- removing, restarting ----------------------------------------------------------------------
def removing(**kw: Any) -> Action:
    phases = {**DRAINED_PHASES, "remove": (990.0, None)}
    return act(State.REMOVING, **{"stop_step": 501, "phases": phases, **kw})


GONE = {"event": "agent_stopping", "rank": 2, "jobId": "j0", "time": 992.0, "received": 992.0}
REMOVED = {**DRAINED_PHASES, "remove": (990.0, NOW), "rendezvous": (NOW, None)}
RESTARTING = {**DRAINED_PHASES, "remove": (990.0, 991.0), "rendezvous": (991.0, None)}
RESUMED_ACK = {"event": "resumed", "rank": 0, "jobId": "j1", "time": 999.0, "step": 501,
               "world": 2, "loadS": 0.5, "loadedAt": 998.0, "received": 999.0}  # fmt: skip


def restarting(**kw: Any) -> Action:
    return act(State.RESTARTING, **{"stop_step": 501, "phases": dict(RESTARTING), **kw})


def recovery(phase: str, at: float, seconds: float, job: str) -> Emit:
    return Emit("remediation", at, {"remediation": 7, "phase": phase, "duration": seconds,
                                    "category": "recovery", "node": "n2"}, job)  # fmt: skip


RECOVERY = [
    recovery("wait", 950.0, 38.0, "j0"),
    recovery("checkpoint", 985.0, 5.0, "j0"),
    recovery("verify", 990.0, 5.0, "j0"),
    recovery("remove", 990.0, 1.0, "j0"),
    recovery("rendezvous", 991.0, 6.5, "j0"),
    recovery("reload", 997.5, 0.5, "j1"),
    recovery("warmup", 998.0, 1.0, "j1"),
]
FINISHED = {**RESTARTING, "rendezvous": (991.0, 997.5), "reload": (997.5, 998.0),
            "warmup": (998.0, 999.0)}  # fmt: skip
HANG_CHECKPOINT = {"source": "newest verified periodic checkpoint (a hung step cannot finish)"}
NO_JOB = "the job is not polling its control channel: node drained, job untouched"
LOST = {"source": "newest verified periodic checkpoint (the node's ranks were lost: no drain "
        "checkpoint)", "lost": True}  # fmt: skip
LOST_WAIT = {**DETECTED, "wait": (950.0, NOW), "remove": (NOW, None)}

TRANSITIONS = [
    # A person's answer to a pending action; approval begins the sequence.
    pytest.param(
        act(State.AWAITING_APPROVAL, mode="approve", job_id=""),
        replace(POLLING, verb="approve", actor="alice"),
        State.DRAINING,
        [Actuate("drain"), replace(DRAIN, job_id="")],
        {
            "approved_by": "alice",
            "job_id": "j0",
            "world_before": 3,
            "updated_at": NOW,
            "phases": {**DETECTED, "approval": (900.0, NOW), "wait": (NOW, None)},
        },
        id="awaiting_approval-approve-draining",
    ),
    pytest.param(
        act(State.RECOMMENDED, mode="recommend"),
        replace(POLLING, verb="approve", actor="alice"),
        State.DRAINING,
        [Actuate("drain"), DRAIN],
        {
            "approved_by": "alice",
            "phases": {**DETECTED, "approval": (900.0, NOW), "wait": (NOW, None)},
        },
        id="recommended-approve-draining",
    ),
    pytest.param(
        act(State.AWAITING_APPROVAL),
        Observations(verb="approve", actor="alice"),
        State.DRAINED,
        [Actuate("drain"), DRAIN],
        {"error": NO_JOB, "approved_by": "alice"},
        id="awaiting_approval-approve-no_rank_polling-drained",
    ),
    pytest.param(
        act(State.AWAITING_APPROVAL),
        replace(POLLING, verb="reject", actor="bob"),
        State.REJECTED,
        [],
        {"approved_by": "bob", "updated_at": NOW, "phases": DETECTED},
        id="awaiting_approval-reject-rejected",
    ),
    pytest.param(
        act(State.RECOMMENDED),
        Observations(verb="reject", actor="bob"),
        State.REJECTED,
        [],
        {"approved_by": "bob"},
        id="recommended-reject-rejected",
    ),
    pytest.param(
        act(State.AWAITING_APPROVAL),
        POLLING,
        State.AWAITING_APPROVAL,
        [],
        {"updated_at": 900.0},
        id="awaiting_approval-tick-unchanged",
    ),
    pytest.param(
        act(State.RECOMMENDED), POLLING, State.RECOMMENDED, [], {}, id="recommended-tick-unchanged"
    ),
    # Automatic mode begins at once.
    pytest.param(
        act(State.DECIDING),
        POLLING,
        State.DRAINING,
        [Actuate("drain"), DRAIN],
        {"phases": {**DETECTED, "wait": (NOW, None)}, "approved_by": ""},
        id="deciding-draining",
    ),
    pytest.param(
        act(State.DECIDING),
        Observations(),
        State.DRAINED,
        [Actuate("drain"), DRAIN],
        {"error": NO_JOB, "job_id": "j0"},
        id="deciding-no_rank_polling-drained",
    ),
    pytest.param(
        act(State.DECIDING, reason="hang", world_before=0),
        POLLING,
        State.REMOVING,
        [
            Actuate("drain"),
            replace(DRAIN, attrs={**DRAIN.attrs, "reason": "hang"}),
            Actuate("remove"),
        ],
        {
            "checkpoint": HANG_CHECKPOINT,
            "world_before": 3,
            "phases": {**DETECTED, "remove": (NOW, None)},
        },
        id="deciding-hang-removing_without_drain_checkpoint",
    ),
    # Draining: every rank stopped and rank 0's checkpoint verified, or a refusal.
    pytest.param(draining(), POLLING, State.DRAINING, [], {}, id="draining-waiting"),
    pytest.param(
        draining(acks=(CK,)),
        replace(ALL_STOPPED, stopped=2),
        State.DRAINING,
        [],
        {"stop_step": -1},
        id="draining-checkpointed-not_every_rank_stopped",
    ),
    pytest.param(
        draining(),
        ALL_STOPPED,
        State.DRAINING,
        [],
        {"stop_step": -1},
        id="draining-every_rank_stopped-no_checkpoint_yet",
    ),
    pytest.param(
        draining(acks=(CK,)),
        ALL_STOPPED,
        State.DRAINING,
        [Verify("/c/ckpt.pt")],
        {"stop_step": -1, "acks": (CK,)},
        id="draining-stopped_and_checkpointed-verify",
    ),
    pytest.param(
        draining(acks=(CK,)),
        replace(CHECKED, server_sha256="ab"),
        State.REMOVING,
        [ForgetStops(), Actuate("remove")],
        {
            "stop_step": 501,
            "acks": (CK, STOP_ACK),
            "checkpoint": {
                "path": "/c/ckpt.pt",
                "sha256": "ab",
                "verifiedBy": "server (read-back checksum) and rank 0",
            },
            "phases": {**DRAINED_PHASES, "remove": (NOW, None)},
        },
        id="draining-checksum_matches-removing",
    ),
    pytest.param(
        draining(acks=(CK,)),
        CHECKED,
        State.REMOVING,
        [ForgetStops(), Actuate("remove")],
        {
            "checkpoint": {
                "path": "/c/ckpt.pt",
                "sha256": "ab",
                "verifiedBy": "rank 0 (read-back checksum)",
            }
        },
        id="draining-server_cannot_read_it-rank0_verified-removing",
    ),
    pytest.param(
        draining(acks=(CK,)),
        replace(CHECKED, server_sha256="cd"),
        State.FAILED,
        [ForgetStops(), failed(MISMATCH)],
        {"error": MISMATCH, "stop_step": 501, "actuators": ()},
        id="draining-checksum_mismatch-failed",
    ),
    pytest.param(
        draining(acks=({"event": "checkpoint_failed", "jobId": "j0", "error": "disk full"},)),
        ALL_STOPPED,
        State.FAILED,
        [ForgetStops(), failed("checkpoint failed on rank 0: disk full")],
        {"error": "checkpoint failed on rank 0: disk full"},
        id="draining-checkpoint_failed-failed",
    ),
    pytest.param(
        draining(acks=({**CK, "jobId": "j-other"},)),
        ALL_STOPPED,
        State.DRAINING,
        [],
        {},
        id="draining-answer_of_another_attempt-ignored",
    ),
    # A fatal fault killed the node's ranks: nobody can agree on a stop; no drain checkpoint.
    pytest.param(
        draining(),
        replace(POLLING, polling=3),
        State.DRAINING,
        [],
        {"checkpoint": {}},
        id="draining-every_rank_polling-waiting",
    ),
    pytest.param(
        draining(),
        replace(POLLING, job_id="j1"),
        State.REMOVING,
        [ForgetStops(), Actuate("remove")],
        {"checkpoint": LOST, "phases": LOST_WAIT, "job_id": "j0", "stop_step": -1},
        id="draining-the_attempt_restarted_on_its_own-ranks_lost-removing",
    ),
    pytest.param(
        draining(),
        Observations(),
        State.REMOVING,
        [ForgetStops(), Actuate("remove")],
        {"checkpoint": LOST, "phases": LOST_WAIT},
        id="draining-no_rank_polling_any_more-ranks_lost-removing",
    ),
    pytest.param(
        draining(),
        replace(POLLING, polling=1),
        State.REMOVING,
        [ForgetStops(), Actuate("remove")],
        {"checkpoint": LOST},
        id="draining-ranks_of_the_attempt_missing-ranks_lost-removing",
    ),
    pytest.param(
        draining(phases={**DETECTED, "wait": (NOW - 301.0, None)}),
        POLLING,
        State.FAILED,
        [ForgetStops(), failed("the job did not stop within 300s")],
        {"error": "the job did not stop within 300s"},
        id="draining-stop_timeout-failed",
    ),
    # Removing: the launcher's actuator answers, then the node's workers do.
    pytest.param(
        removing(),
        replace(POLLING, actuated="remove", pending=True),
        State.REMOVING,
        [],
        {},
        id="removing-actuated_pending-waits_for_the_workers",
    ),
    pytest.param(
        removing(),
        replace(POLLING, actuated="remove", pending=False),
        State.RESTARTING,
        [],
        {"phases": {**DRAINED_PHASES, "rendezvous": (NOW, None)}, "error": ""},
        id="removing-actuated_done-restarting",
    ),
    pytest.param(
        removing(acks=(GONE,)),
        replace(POLLING, ranks_on_node=frozenset({2})),
        State.RESTARTING,
        [],
        {"phases": REMOVED, "error": ""},
        id="removing-node_workers_gone-restarting",
    ),
    pytest.param(
        removing(acks=(GONE,)),
        replace(POLLING, ranks_on_node=frozenset({2, 5})),
        State.REMOVING,
        [],
        {},
        id="removing-some_workers_left-waits",
    ),
    pytest.param(
        removing(phases={**DRAINED_PHASES, "remove": (NOW - 16.0, None)}),
        replace(POLLING, ranks_on_node=frozenset({2})),
        State.RESTARTING,
        [],
        {
            "error": "no answer from the node's workers in 15s; restarting without it",
            "phases": {**DRAINED_PHASES, "remove": (NOW - 16.0, NOW), "rendezvous": (NOW, None)},
        },
        id="removing-timeout-restarting_without_it",
    ),
    pytest.param(
        removing(checkpoint=LOST, stop_step=-1, acks=({**GONE, "jobId": "j1", "node": "n2"},)),
        replace(POLLING, job_id="j1"),
        State.RESTARTING,
        [],
        {"phases": REMOVED, "error": ""},
        id="removing-lost-a_later_attempt_s_worker_on_the_node_stopped_its_agent-restarting",
    ),
    pytest.param(
        removing(checkpoint=LOST, acks=({**GONE, "node": "n1"},)),
        POLLING,
        State.REMOVING,
        [],
        {},
        id="removing-lost-an_answer_from_another_node-waits",
    ),
    pytest.param(
        removing(reason="hang", checkpoint=dict(HANG_CHECKPOINT), stop_step=-1),
        replace(POLLING, job_id="j1", nodes=frozenset({"n0", "n1", "n2"})),
        State.REMOVING,
        [],
        {"checkpoint": {**HANG_CHECKPOINT, "lost": True}},
        id="removing-the_node_is_back_in_a_later_attempt-ranks_lost",
    ),
    pytest.param(
        restarting(),
        replace(POLLING, job_id="j1", nodes=frozenset({"n2"})),
        State.RESTARTING,
        [],
        {"checkpoint": {"source": LOST["source"], "lost": True}},
        id="restarting-the_node_is_back_in_a_later_attempt-ranks_lost",
    ),
    pytest.param(
        restarting(),
        replace(POLLING, job_id="j1", nodes=frozenset({"n0", "n1"})),
        State.RESTARTING,
        [],
        {"checkpoint": {}},
        id="restarting-a_later_attempt_without_the_node-as_planned",
    ),
    # Restarting: the new attempt's first step ends it.
    pytest.param(restarting(), POLLING, State.RESTARTING, [], {}, id="restarting-waiting"),
    pytest.param(
        restarting(acks=({**RESUMED_ACK, "jobId": "j0"},)),
        POLLING,
        State.RESTARTING,
        [],
        {},
        id="restarting-resumed_from_the_old_attempt-ignored",
    ),
    pytest.param(
        restarting(acks=(RESUMED_ACK,)),
        POLLING,
        State.RESUMED,
        RECOVERY,
        {
            "phases": FINISHED,
            "resume_step": 501,
            "stop_step": 501,
            "world_after": 2,
            "steps_lost": 0,
            "recovery_s": 99.0,
        },
        id="restarting-resumed-resumed",
    ),
    pytest.param(
        restarting(acks=(RESUMED_ACK,), stop_step=-1, reason="hang"),
        POLLING,
        State.RESTARTING,
        [LookUpLastStep("j0")],
        {"stop_step": -1},
        id="restarting-hang_resumed-look_up_where_it_stopped",
    ),
    pytest.param(
        restarting(acks=({**RESUMED_ACK, "step": 475},), stop_step=-1, reason="hang"),
        replace(POLLING, looked_up=True, last_step=489),
        State.RESUMED,
        RECOVERY,
        {"stop_step": 490, "resume_step": 475, "steps_lost": 15},
        id="restarting-hang_resumed-stop_step_after_the_last_step",
    ),
    pytest.param(
        restarting(acks=(RESUMED_ACK,), stop_step=-1, reason="hang"),
        replace(POLLING, looked_up=True, last_step=None),
        State.RESUMED,
        RECOVERY,
        {"stop_step": 501, "steps_lost": 0},
        id="restarting-hang_resumed-no_step_ran-stop_step_is_resume_step",
    ),
    pytest.param(
        restarting(acks=(RESUMED_ACK,), stop_step=-1, checkpoint=LOST),
        POLLING,
        State.RESTARTING,
        [LookUpLastStep("", exclude="j1")],
        {"stop_step": -1},
        id="restarting-lost_resumed-look_up_where_any_earlier_attempt_stopped",
    ),
    pytest.param(
        restarting(acks=({**RESUMED_ACK, "step": 475},), stop_step=-1, checkpoint=LOST),
        replace(POLLING, looked_up=True, last_step=489),
        State.RESUMED,
        RECOVERY,
        {"stop_step": 490, "resume_step": 475, "steps_lost": 15, "world_after": 2},
        id="restarting-lost_resumed-steps_since_the_checkpoint_lost",
    ),
    pytest.param(
        restarting(phases={**RESTARTING, "rendezvous": (NOW - 901.0, None)}),
        POLLING,
        State.FAILED,
        [ForgetStops(), failed("the job did not resume within 900s")],
        {},
        id="restarting-resume_timeout-failed",
    ),
]


@pytest.mark.parametrize(("before", "obs", "state", "effects", "fields"), TRANSITIONS)
def test_transition(
    before: Action, obs: Observations, state: State, effects: list[Effect], fields: dict[str, Any]
) -> None:
    after, got = advance(before, obs, NOW, LIMITS)
    assert after.state is state
    assert got == effects
    for name, want in fields.items():
        assert getattr(after, name) == want, name
    assert after.id == before.id and after.node == before.node  # never another action or node


FINAL = [State.RESUMED, State.FAILED, State.DRAINED, State.REJECTED]


@pytest.mark.parametrize(
    "state", [s for s in State if s not in (State.RECOMMENDED, State.AWAITING_APPROVAL)]
)
@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_only_a_pending_action_is_approved_or_rejected(state: State, verb: str) -> None:
    done = "rejected" if verb == "reject" else "approved"
    with pytest.raises(Refused, match=f"is {state.value}; only a pending one can be {done}"):
        advance(act(state, phases=dict(RESTARTING)), replace(POLLING, verb=verb), NOW, LIMITS)


@pytest.mark.parametrize("state", FINAL)
def test_a_final_action_records_answers_and_never_moves(state: State) -> None:
    answer = {"id": 7, "event": "agent_stopping", "rank": 2, "jobId": "j0", "time": 999.0}
    after, effects = advance(act(state), replace(POLLING, answer=answer), NOW, LIMITS)
    assert (after.state, effects, after.updated_at) == (state, [], NOW)
    assert after.acks == ({"event": "agent_stopping", "rank": 2, "jobId": "j0", "time": 999.0,
                           "received": NOW},)  # fmt: skip


def test_a_stopped_answer_is_counted_not_recorded() -> None:
    stopped = {"id": 7, "event": "stopped", "rank": 1, "jobId": "j0", "time": 999.0}
    after, effects = advance(draining(), replace(POLLING, answer=stopped), NOW, LIMITS)
    assert (after.state, effects, after.acks, after.updated_at) == (
        State.DRAINING, [], (), NOW
    )  # fmt: skip


def test_a_rank_answer_completing_the_drain_moves_it_on_in_the_same_call() -> None:
    after, effects = advance(draining(), replace(ALL_STOPPED, answer={**CK, "id": 7}), NOW, LIMITS)
    assert after.acks[-1]["event"] == "checkpointed" and effects == [Verify("/c/ckpt.pt")]


def test_instructions_and_initial_states() -> None:
    assert initial_state("recommend") is State.RECOMMENDED
    assert initial_state("approve") is State.AWAITING_APPROVAL
    assert initial_state("automatic") is State.DECIDING
    told = {s: instruction(act(s)) for s in State}
    assert told[State.DRAINING] == Instruction(7, "stop", "n2", "j0", False, 3)
    assert told[State.REMOVING] == Instruction(7, "remove", "n2", "j0", False, 3)
    assert told[State.RESTARTING] == Instruction(7, "restart", "n2", "j0", False, 3)
    assert {s for s, i in told.items() if i is None} == set(State) - {
        State.DRAINING, State.REMOVING, State.RESTARTING
    }  # fmt: skip
    hung = instruction(act(State.REMOVING, reason="hang"))
    assert hung is not None and hung.force  # a hung rank cannot reach a step boundary
    # The node's ranks were lost: its workers of any attempt (the launcher restarts them there)
    # stop its agent, until the job has resumed without it.
    for s in (State.REMOVING, State.RESTARTING):
        assert instruction(act(s, checkpoint=LOST)) == Instruction(7, "remove", "n2", "", False, 3)


def test_states_keep_the_strings_stored_and_shown() -> None:
    assert [s.value for s in State] == [
        "recommended", "awaiting_approval", "deciding", "draining", "removing", "restarting",
        "resumed", "drained", "rejected", "failed",
    ]  # fmt: skip
    assert State("draining") is State.DRAINING and json.dumps(State.DRAINING) == '"draining"'


def test_only_effects_with_an_answer_ask_for_another_step() -> None:
    assert [asks(e) for e in (Actuate("drain"), Actuate("remove"), Verify("p"),
                              LookUpLastStep("j"), ForgetStops(), DRAIN)] == [
        False, True, True, True, False, False
    ]  # fmt: skip
