"""The remediation state machine: pure, no I/O, no clock.

:func:`advance` takes an action (:class:`Action`, what is stored of it), what the controller
observed (:class:`Observations`: a person's answer, a rank's answer, the ranks polling, the ranks
stopped, and the answers to the effects that ask for one) and the time, and returns the action's
new value and the :data:`Effect` list the controller carries out::

    recommended ─┐ approve           ┌─ (hang) ────────────────────────┐
    awaiting_    ├──────────> begin ─┤                                 v
      approval ──┘ reject:           ├─> draining ── stopped + checkpoint verified ──> removing
                   rejected          │    │ (mismatch, failure, timeout): failed      ^
    deciding (automatic) ──> begin   │    └── the node's ranks lost (the attempt ended
                                     │        or ranks stopped polling) ───────────────┘
                                     └─> drained (no rank polling)
                                                        removing ── node's workers gone (or
                                                        timeout, or no remove actuator
                                                        pending) ──> restarting ── a new
                                                        attempt's first step ──> resumed
                                                                    (timeout): failed

A fatal fault that takes the GPU away (Xid 79: the GPU fell off the bus) kills the node's
workers: they cannot vote or checkpoint, and the others' collective fails, so the launcher
restarts the job on its own. A draining action that sees its job attempt end (another polls, or
none) or ranks of it stop polling marks the node's ranks *lost*: like a hang it goes on without a
drain checkpoint (the job resumes from its newest verified periodic one), and it tells ``remove``
to the node's workers of every attempt (``job_id`` ""), since the node's launcher agent, still
alive, restarts workers there until they stop it.

Effects that ask for an answer (:class:`Actuate` ``remove``, :class:`Verify`,
:class:`LookUpLastStep`) are answered by calling :func:`advance` again in the same pass with the
answer in the observations; the others (drain actuators, run events, forgetting the stopped
ranks) need none. States are :class:`State`, whose values are the strings stored in the
``remediations`` table and shown by the API.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from ..errors import Refused
from .ack_types import StoppedAck, Verification, ack_keys
from .positions import Instruction

__all__ = [
    "ACTIVE",
    "PENDING",
    "PHASES",
    "Action",
    "Actuate",
    "Effect",
    "Emit",
    "ForgetStops",
    "Limits",
    "LookUpLastStep",
    "Observations",
    "Refused",
    "State",
    "Verify",
    "advance",
    "asks",
    "initial_state",
    "instruction",
]


class State(str, enum.Enum):
    RECOMMENDED = "recommended"  # recommend mode: recorded, nothing done
    AWAITING_APPROVAL = "awaiting_approval"  # approve mode: waits for a person
    DECIDING = "deciding"  # automatic mode: begins at once
    DRAINING = "draining"  # the job stops at its next step boundary and checkpoints
    REMOVING = "removing"  # the launcher takes the node out
    RESTARTING = "restarting"  # the others re-form the job without it
    RESUMED = "resumed"  # the first step at the new world size ran
    DRAINED = "drained"  # node drained, the job not reachable (no control channel)
    REJECTED = "rejected"
    FAILED = "failed"


ACTIVE = (State.DRAINING, State.REMOVING, State.RESTARTING)
"""States in which the job is being told something."""
PENDING = (State.RECOMMENDED, State.AWAITING_APPROVAL)
"""States a person may approve or reject."""
PHASES = ("detection", "approval", "wait", "checkpoint", "verify", "remove", "rendezvous",
          "reload", "warmup")  # fmt: skip
"""Every timed phase of an action, in order."""
_CONTROL_PHASE = {State.DRAINING: "stop", State.REMOVING: "remove", State.RESTARTING: "restart"}
_ACKS_KEPT = 512

Phase = tuple[float | None, float | None]


@dataclass(frozen=True)
class Action:
    """One decision to take a node out of a run, as stored (``remediations`` rows)."""

    id: int
    tenant: str
    run_id: str
    node: str
    reason: str
    mode: str
    state: State
    decided_at: float
    updated_at: float
    job_id: str = ""
    ranks: tuple[int, ...] = ()
    summary: str = ""
    finding_key: str = ""
    alert_id: int | None = None
    incident_id: int | None = None
    approved_by: str = ""
    world_before: int = 0
    world_after: int = 0
    stop_step: int = -1
    resume_step: int = -1
    checkpoint: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, Phase] = field(default_factory=dict)
    acks: tuple[dict[str, Any], ...] = ()
    actuators: tuple[dict[str, Any], ...] = ()
    cost: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def phase_start(self, name: str) -> float:
        return float(self.phases[name][0] or 0.0)

    @property
    def lost(self) -> bool:
        """The node's ranks were lost (a fatal fault killed them): no drain, no vote."""
        return self.checkpoint.get("lost") is True

    @property
    def steps_lost(self) -> int | None:
        """Steps run before the action and not kept: the stop step minus the step resumed
        from."""
        if self.stop_step < 0 or self.resume_step < 0:
            return None
        return max(0, self.stop_step - self.resume_step)

    @property
    def recovery_s(self) -> float | None:
        """From the decision to the first step of the resumed job."""
        first = max((a["time"] for a in self.acks if a.get("event") == "resumed"), default=None)
        return float(first) - self.decided_at if first is not None else None


@dataclass(frozen=True)
class Limits:
    """How long each phase that waits on the job may take before the action fails."""

    stop_timeout_s: float = 300.0
    remove_timeout_s: float = 15.0
    resume_timeout_s: float = 900.0


@dataclass(frozen=True)
class Observations:
    """What the controller saw, for one call of :func:`advance`."""

    verb: str = ""  # a person's answer: "approve" or "reject"
    actor: str = ""  # ... and who
    run_ended: str = ""  # the run's status when it has ended (FINISHED, FAILED, STOPPED)
    answer: dict[str, Any] | None = None  # a rank's answer (the control channel's POST body)
    job_id: str = ""  # the job attempt whose ranks poll now ("": none does)
    world: int = 0  # ... its world size
    stopped: int = 0  # ranks that answered "stopped" to this action
    stopped_at: float = 0.0  # ... the latest of their stop times
    ranks_on_node: frozenset[int] = frozenset()  # ranks of the action's job on its node
    # Answers to the effects that ask for one, in the same pass:
    actuated: str = ""  # the stage whose actuators just ran
    pending: bool = False  # ... and whether one of them completes later (the job's answers)
    verified: bool = False  # the server tried to read the checkpoint
    server_sha256: str | None = None  # ... and its digest (None: it cannot read the file)
    verified_at: float = 0.0
    looked_up: bool = False  # the last step of the action's job was looked up
    last_step: int | None = None  # ... (None: it ran no step)
    polling: int | None = None  # ranks of ``job_id`` polling (None: not counted)
    nodes: frozenset[str] = frozenset()  # ... and their nodes


@dataclass(frozen=True)
class Actuate:
    """Run the actuators of ``stage`` on the action's node; ``remove`` asks for an answer."""

    stage: str


@dataclass(frozen=True)
class Verify:
    """Checksum the checkpoint at ``path`` where the server can read it (answer:
    ``verified``, ``server_sha256``, ``verified_at``)."""

    path: str


@dataclass(frozen=True)
class LookUpLastStep:
    """The last step the action's job attempt ran (answer: ``looked_up``, ``last_step``);
    ``job_id`` "" : any attempt but ``exclude`` (the node's ranks were lost, and with them the
    attempt the action began on may not be the one that ran the steps)."""

    job_id: str
    exclude: str = ""


@dataclass(frozen=True)
class Emit:
    """Write a run event (``kind``: ``drain`` or ``remediation``) for job attempt ``job_id``."""

    kind: str
    at: float
    attrs: dict[str, Any]
    job_id: str


@dataclass(frozen=True)
class ForgetStops:
    """Drop the in-memory count of the ranks that stopped for the action."""


Effect = Actuate | Verify | LookUpLastStep | Emit | ForgetStops


def asks(e: Effect) -> bool:
    """Whether the effect is answered through the observations of another call."""
    return isinstance(e, (Verify, LookUpLastStep)) or (
        isinstance(e, Actuate) and e.stage == "remove"
    )


def initial_state(mode: str) -> State:
    """The state a new action starts in, by the policy's mode."""
    return {"recommend": State.RECOMMENDED, "approve": State.AWAITING_APPROVAL}.get(
        mode, State.DECIDING
    )


def instruction(a: Action) -> Instruction | None:
    """What the action tells its job's ranks now, if anything."""
    if a.state not in ACTIVE:
        return None
    if a.lost:  # whichever attempt has workers on the node: they stop its agent
        return Instruction(a.id, "remove", a.node, "", False, a.world_before)
    return Instruction(
        a.id, _CONTROL_PHASE[a.state], a.node, a.job_id, a.reason == "hang", a.world_before
    )


def advance(
    a: Action, obs: Observations, now: float, limits: Limits = Limits()
) -> tuple[Action, list[Effect]]:
    """The action's next value and what to do, given what was observed at ``now``."""
    if obs.verb:
        if a.state not in PENDING:
            raise Refused(
                f"remediation {a.id} is {a.state.value}; only a pending one can be "
                f"{'rejected' if obs.verb == 'reject' else 'approved'}"
            )
        if obs.verb == "approve" and obs.run_ended:
            # Carried out, it would add a drain to a run that is over (and its time to the
            # run's wall clock): a pending action of an ended run may only be declined.
            raise Refused(
                f"run {a.run_id} has ended ({obs.run_ended}): there is no job left to take "
                f"{a.node} out of; reject the action instead"
            )
        a = replace(a, approved_by=obs.actor)
        if obs.verb == "reject":
            return replace(a, state=State.REJECTED, updated_at=now), []
        return _begin(replace(a, phases={**a.phases, "approval": (a.decided_at, now)}), obs, now)
    if obs.answer is not None:
        a = replace(a, updated_at=now)
        if obs.answer.get("event") != "stopped":  # counted in memory, recorded once all are in
            entry = {k: obs.answer[k] for k in sorted(obs.answer) if k != "id"}
            a = replace(a, acks=(*a.acks, {**entry, "received": now})[-_ACKS_KEPT:])
    if a.state is State.DECIDING:
        return _begin(a, obs, now)
    if a.state is State.DRAINING:
        return _draining(a, obs, now, limits)
    if a.state in (State.REMOVING, State.RESTARTING) and _back(a, obs):
        # A later attempt has a rank on the node being taken out: its agent is alive and
        # restarted workers there after its ranks were lost. They are told to stop it.
        a = _mark_lost(a, {**a.checkpoint})
    if a.state is State.REMOVING:
        return _removing(a, obs, now, limits)
    if a.state is State.RESTARTING:
        return _restarting(a, obs, now, limits)
    return a, []  # pending (only a person moves it) or final


def _begin(a: Action, obs: Observations, now: float) -> tuple[Action, list[Effect]]:
    """Mark the node draining, then ask the job to stop at its next step boundary."""
    attrs = {"planned": False, "remediation": a.id, "node": a.node, "reason": a.reason}
    effects: list[Effect] = [Actuate("drain"), Emit("drain", now, attrs, a.job_id)]
    a = replace(a, updated_at=now)
    if not obs.job_id:
        error = "the job is not polling its control channel: node drained, job untouched"
        return replace(a, state=State.DRAINED, error=error), effects
    a = replace(a, job_id=obs.job_id, world_before=obs.world)
    if a.reason == "hang":  # a hung step cannot finish: no stop, no drain checkpoint
        source = "newest verified periodic checkpoint (a hung step cannot finish)"
        return _remove(replace(a, checkpoint={"source": source}), now, effects)
    return replace(a, state=State.DRAINING, phases={**a.phases, "wait": (now, None)}), effects


def _acks(a: Action, event: str) -> list[dict[str, Any]]:
    return [x for x in a.acks if ack_keys(x).job() == a.job_id and x.get("event") == event]


_LOST = "newest verified periodic checkpoint (the node's ranks were lost: no drain checkpoint)"


def _back(a: Action, obs: Observations) -> bool:
    return not a.lost and obs.job_id not in ("", a.job_id) and a.node in obs.nodes


def _mark_lost(a: Action, checkpoint: dict[str, Any]) -> Action:
    return replace(a, checkpoint={"source": _LOST, **checkpoint, "lost": True})


def _draining(
    a: Action, obs: Observations, now: float, limits: Limits
) -> tuple[Action, list[Effect]]:
    if obs.job_id != a.job_id or (obs.polling is not None and obs.polling < obs.world):
        # The attempt being stopped ended (the launcher restarted it: a rank died and took the
        # collective with it) or ranks of it are gone: nobody is left to agree on a stop step.
        lost = replace(_mark_lost(a, {}), phases={**a.phases, "wait": (a.phase_start("wait"), now)})
        return _remove(lost, now, [ForgetStops()])
    failed = _acks(a, "checkpoint_failed")
    if failed:
        return _fail(a, now, f"checkpoint failed on rank 0: {failed[-1].get('error', '')}", [])
    ck = _acks(a, "checkpointed")
    if obs.stopped >= a.world_before and ck:
        c = ck[-1]
        man = dict(c.get("checkpoint") or {})
        if not obs.verified:
            return a, [Verify(str(man.get("path", "")))]
        t_stop = obs.stopped_at
        stopped = msgspec.to_builtins(StoppedAck("stopped", obs.stopped, t_stop, a.job_id, now))
        t_ck = min(float(c.get("started", t_stop)), t_stop)
        a = replace(
            a,
            acks=(*a.acks, stopped)[-_ACKS_KEPT:],
            phases={
                **a.phases,
                "wait": (a.phases["wait"][0], t_stop),
                "checkpoint": (t_ck, float(c["time"])),
            },
            stop_step=int(c["step"]),
        )
        effects: list[Effect] = [ForgetStops()]
        verified_by = "rank 0 (read-back checksum)"
        if obs.server_sha256 is not None:  # the server can read it too (shared FS, object store)
            if obs.server_sha256 != man.get("sha256"):
                why = (
                    f"checkpoint {man.get('path', '')} has sha256 {obs.server_sha256}, the job "
                    f"wrote {man.get('sha256')}: not removing the node"
                )
                return _fail(a, now, why, [])  # forgets the stops too
            verified_by = "server (read-back checksum) and rank 0"
        a = replace(
            a,
            checkpoint={**man, **msgspec.to_builtins(Verification(verified_by))},
            phases={**a.phases, "verify": (float(c["time"]), obs.verified_at)},
        )
        return _remove(a, now, effects)
    if now - a.phase_start("wait") > limits.stop_timeout_s:
        return _fail(a, now, f"the job did not stop within {limits.stop_timeout_s:.0f}s", [])
    return a, []


def _remove(a: Action, now: float, effects: list[Effect]) -> tuple[Action, list[Effect]]:
    """Ask the launcher to take the node out; the answer says whether to wait for it."""
    a = replace(a, state=State.REMOVING, updated_at=now, phases={**a.phases, "remove": (now, None)})
    return a, [*effects, Actuate("remove")]


def _removing(
    a: Action, obs: Observations, now: float, limits: Limits
) -> tuple[Action, list[Effect]]:
    if obs.actuated == "remove":
        if obs.pending:
            return a, []  # the node's workers stop their agent and answer
        phases = {k: v for k, v in a.phases.items() if k != "remove"}
        return _restart(replace(a, phases=phases), now), []  # done already: nothing to wait for
    if a.lost:  # one answer is enough: the node's agent (and every worker it started) stops
        gone = {
            int(x["rank"])
            for x in a.acks
            if x.get("event") == "agent_stopping" and x.get("node") == a.node
        }
        all_gone = bool(gone)
    else:
        gone = {int(x["rank"]) for x in _acks(a, "agent_stopping")}
        all_gone = bool(obs.ranks_on_node) and obs.ranks_on_node <= gone
    started = a.phase_start("remove")
    if not all_gone and now - started <= limits.remove_timeout_s:
        return a, []
    if not all_gone:
        error = (
            f"no answer from the node's workers in {limits.remove_timeout_s:.0f}s; "
            "restarting without it"
        )
        a = replace(a, error=error)
    return _restart(replace(a, phases={**a.phases, "remove": (started, now)}), now), []


def _restart(a: Action, now: float) -> Action:
    return replace(
        a, state=State.RESTARTING, updated_at=now, phases={**a.phases, "rendezvous": (now, None)}
    )


def _restarting(
    a: Action, obs: Observations, now: float, limits: Limits
) -> tuple[Action, list[Effect]]:
    resumed = [x for x in a.acks if x.get("event") == "resumed" and ack_keys(x).job() != a.job_id]
    if resumed:
        first = resumed[0]
        if a.stop_step < 0 and int(first.get("step", -1)) >= 0 and not obs.looked_up:
            if a.lost:  # where the job stopped, in whichever attempt ran steps before this one
                return a, [LookUpLastStep("", exclude=str(ack_keys(first).job("")))]
            return a, [LookUpLastStep(a.job_id)]  # a hang: where the job stopped
        return _finish(a, first, obs.last_step, now)
    if now - a.phase_start("rendezvous") > limits.resume_timeout_s:
        return _fail(a, now, f"the job did not resume within {limits.resume_timeout_s:.0f}s", [])
    return a, []


def _finish(
    a: Action, first: dict[str, Any], last_step: int | None, now: float
) -> tuple[Action, list[Effect]]:
    t_first = float(first["time"])
    keys = ack_keys(first)
    loaded = keys.loaded(t_first)
    load_s = keys.load_seconds()
    # Contiguous and in order, whatever the clocks of the hosts say.
    t0 = a.phase_start("rendezvous")
    t1 = max(t0, loaded - load_s)
    t2 = max(t1, loaded)
    phases = {
        **a.phases,
        "rendezvous": (t0, t1),
        "reload": (t1, t2),
        "warmup": (t2, max(t2, t_first)),
    }
    resume_step = int(first.get("step", -1))
    stop_step = a.stop_step
    if stop_step < 0 and resume_step >= 0:
        stop_step = last_step + 1 if last_step is not None else resume_step
    new_job = str(keys.job(""))
    effects: list[Effect] = []
    for name, (p0, p1) in phases.items():
        if p0 is None or p1 is None or name in ("detection", "approval"):
            continue  # training went on meanwhile: not a pause
        attrs = {
            "remediation": a.id,
            "phase": name,
            "duration": max(0.0, p1 - p0),
            "category": "recovery",
            "node": a.node,
        }
        effects.append(
            Emit("remediation", p0, attrs, new_job if name in ("reload", "warmup") else a.job_id)
        )
    a = replace(
        a,
        phases=phases,
        resume_step=resume_step,
        world_after=int(first.get("world", 0)),
        stop_step=stop_step,
        state=State.RESUMED,
        updated_at=now,
    )
    return a, effects


def _fail(a: Action, now: float, why: str, effects: list[Effect]) -> tuple[Action, list[Effect]]:
    attrs = {"remediation": a.id, "phase": "failed", "error": why[:500]}
    a = replace(a, state=State.FAILED, error=why[:1000], updated_at=now)
    return a, [*effects, ForgetStops(), Emit("remediation", now, attrs, a.job_id)]
