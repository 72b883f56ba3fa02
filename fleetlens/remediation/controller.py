"""The remediation controller: decide to take a node out of a run, then carry out the sequence.

The sequence, in order, each step waiting for the one before (002_7c0864670257b5f6.txt):

1. **decide** (the monitoring pass): a finding justifies it (:mod:`.policy`). In ``recommend``
   mode the action is recorded and stops there; in ``approve`` mode it waits for someone with
   write access to approve it; in ``automatic`` mode it goes on at once.
2. **drain**: the scheduler actuators mark the node draining (no new work lands on it), a
   ``drain`` event is written for the attempt, and the run's control channel says ``stop``: the
   ranks agree on the next step boundary through a collective, so nobody stops mid-step.
3. **checkpoint**: rank 0 writes a synchronous checkpoint and verifies it by read-back
   checksum; the server verifies the checksum again where it can read the file. Nothing else
   changes before that.
4. **remove**: the launcher actuator takes the node out (torchrun: the node's workers stop their
   agent).
5. **restart**: every other rank exits with the drain status; the launcher re-forms the process
   group without the node and the job resumes from exactly the drained step. The first step at
   the new world size ends the action (``resumed``).

A fatal fault that kills the node's workers (the GPU fell off the bus) leaves nobody to agree on a
stop: the others' collective fails and the launcher restarts the job on its own. The draining
action sees the attempt end and goes on as for a hang, telling the node's workers of any attempt
to stop their agent (:mod:`.machine`).

A hung rank cannot reach a step boundary, so for a hang steps 2-3 are skipped (the job resumes
from its newest verified checkpoint) and the restart is forced on ranks stuck in a collective.
Every phase is timed and written to the run's events as ``remediation`` events with
``category=recovery``, so the goodput breakdown charges them to recovery.

Ranks report where they are with every control poll (:mod:`.positions`); a job whose ranks have
all stopped progressing is hung by the one hang rule (:mod:`fleetlens.analysis.hangs`, with the
server's ``[analyzer]`` settings) and the ranks behind the others name the node (a finding,
``hang``).

The controller only orchestrates: it reads observations (positions, stopped ranks, a person's or
a rank's answer), calls the pure state machine (:func:`.machine.advance`), and carries out its
effects through the actuators and the repository (:mod:`.repository`, all the SQL). It returns
:class:`~.machine.Action` values; their JSON is the API's (:mod:`fleetlens.api.remediation`).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..analysis.hangs import RECENT_STEPS, HangRule, live_hang, recent_step_time
from ..errors import ConfigError, NotFound
from ..store.access import AccessStore
from ..store.findings import FindingsStore
from ..store.graph_files import server_read_refusal, sha256_of
from ..store.metadata import MetadataStore
from ..store.models import Run
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from .ack_types import ack_keys
from .actuators import Actuator
from .machine import (
    ACTIVE as ACTIVE_STATES,
)
from .machine import (
    PHASES,
    Action,
    Actuate,
    Emit,
    ForgetStops,
    Limits,
    LookUpLastStep,
    Observations,
    State,
    Verify,
    advance,
    asks,
    initial_state,
    instruction,
)
from .policy import RemediationPolicy, RunContext, choose
from .positions import Instruction, Position, Positions, stuck_ranks
from .repository import Repository

__all__ = ["ACTIVE", "PHASES", "Answer", "Controller"]

log = logging.getLogger("fleetlens.remediation")

ACTIVE = tuple(s.value for s in ACTIVE_STATES)
"""The states of actions under way, as stored."""
_BUSY = (*ACTIVE_STATES, State.AWAITING_APPROVAL, State.DECIDING)  # one action at a time per run


@dataclass(frozen=True)
class Answer:
    """What a rank's answer moved: the action and its state (None, None: no action waited)."""

    id: int | None
    state: State | None


class Controller:
    def __init__(
        self,
        metadata: MetadataStore,
        telemetry: TelemetryStore,
        findings: FindingsStore,
        access: AccessStore,
        policy: RemediationPolicy,
        actuators: list[Actuator],
        *,
        hang_rule: HangRule | None = None,
        stale_s: float = 10.0,
        stop_timeout_s: float = 300.0,
        remove_timeout_s: float = 15.0,
        resume_timeout_s: float = 900.0,
        readable_roots: Sequence[str] = (),
    ) -> None:
        self.repo = Repository(metadata, telemetry)
        self.telemetry = telemetry
        self.findings = findings
        self.access = access
        self.policy = policy
        self.actuators = actuators
        self.hang_rule = hang_rule or HangRule()
        self.limits = Limits(stop_timeout_s, remove_timeout_s, resume_timeout_s)
        self.readable_roots = tuple(readable_roots)  # where the server may open a job's files
        # _lock serializes the actions' state changes (database work, actuators); the positions
        # have their own lock, so a rank's poll, answered on the event loop, never waits here.
        self._lock = threading.RLock()
        self.positions = Positions(stale_s)
        self.errors = 0
        for a in self.repo.active():
            self._publish(a)

    def take_over(self) -> None:
        """This server has become the leader (fleetlens.store.leader): what it told jobs when
        it led before is stale, so it starts again from the actions under way in the database.
        Stopped ranks counted by the old leader are lost; the ranks' polls rebuild positions."""
        with self._lock:
            self.positions = Positions(self.positions.stale_s)
            for a in self.repo.active():
                self._publish(a)

    # -- the job's side: polls and answers --------------------------------------------------------

    def report(self, tenant: str, run_id: str, pos: Position) -> Instruction | None:
        """Record a rank's position; the instruction for its job attempt, if any."""
        return self.positions.report(tenant, run_id, pos)

    def ack(self, tenant: str, run_id: str, body: dict[str, Any]) -> Answer:
        """A rank's answer; the action moves on at once when it completes a phase."""
        now = time.time()
        aid = int(body.get("id", 0))
        if body.get("event") == "stopped" and aid:
            n, world = self.positions.stopped(
                tenant,
                run_id,
                aid,
                str(ack_keys(body).job()),
                int(body["rank"]),
                float(body["time"]),
            )
            if n < world:
                return Answer(aid, State.DRAINING)
        with self._lock:
            if aid == 0:  # a restarted attempt resumed: it answers the action restarting it
                if body.get("event") != "resumed":
                    raise NotFound("an answer without an action id must be 'resumed'")
                a = self.repo.restarting(tenant, run_id)
                if a is None:
                    return Answer(None, None)
            else:
                a = self.repo.get(tenant, aid)
            if a is None or a.run_id != run_id:
                raise NotFound(f"remediation {aid} does not exist for run {run_id!r}")
            a = self._drive(a, self._observe(a, now, answer=body), now)
            return Answer(a.id, a.state)

    # -- people: read, approve, reject -----------------------------------------------------------

    def actions(
        self, scope: Scope, run_id: str | None = None, state: str | None = None, limit: int = 100
    ) -> list[Action]:
        return self.repo.find(scope, run_id, state, limit)

    def for_incident(self, scope: Scope, incident_id: int) -> list[Action]:
        return self.repo.linked(scope.tenant, scope.project, incident_id=incident_id)

    def for_alert(self, scope: Scope, alert_id: int) -> list[Action]:
        return self.repo.linked(scope.tenant, scope.project, alert_id=alert_id)

    def get(self, scope: Scope, rid: int) -> Action:
        a = self.repo.get(scope, rid)
        if a is None or not self._visible(scope, a):
            raise NotFound(f"remediation {rid} does not exist")
        return a

    def _visible(self, scope: Scope, a: Action) -> bool:
        return not scope.project or self.repo.project_of(a.tenant, a.run_id) == scope.project

    def approve(self, scope: Scope, rid: int) -> Action:
        """Carry out an action awaiting approval (or one only recommended)."""
        return self._settle(scope, rid, "approve")

    def reject(self, scope: Scope, rid: int) -> Action:
        return self._settle(scope, rid, "reject")

    def _settle(self, scope: Scope, rid: int, verb: str) -> Action:
        """A person's answer to a pending action (:class:`~.machine.Refused` otherwise), audited
        in the tenant whose run it touches (on-call acts across tenants)."""
        now = time.time()
        with self._lock:
            a = self.get(scope, rid)
            ended = self.repo.ended(a.tenant, a.run_id, now) if verb == "approve" else None
            seen = self._observe(a, now, verb=verb, actor=scope.actor, run_ended=ended or "")
            a = self._drive(a, seen, now)
        self.access.audit(
            a.tenant,
            scope.actor,
            f"remediation.{verb}",
            f"remediation:{rid}",
            {"run": a.run_id, "node": a.node},
            scope.remote,
        )
        return a

    # -- the monitoring pass -------------------------------------------------------------------

    def tick(self, runs: list[Run], now: float | None = None) -> None:
        """Live hang checks, new decisions for the runs given, timeouts of actions under way."""
        now = time.time() if now is None else now
        if self.policy.mode == "off":
            return
        for run in runs:
            try:
                self._hang_check(run, now)
                self._decide(run, now)
            except Exception:
                self.errors += 1
                log.exception("remediation pass failed for run %s", run.run_id)
        with self._lock:  # an automatic action whose start failed is started again
            for a in self.repo.active((*ACTIVE_STATES, State.DECIDING)):
                try:
                    self._drive(a, self._observe(a, now), now)
                except Exception:
                    self.errors += 1
                    log.exception("remediation %s failed to advance", a.id)
                    self._publish(a)

    def _hang_check(self, run: Run, now: float) -> None:
        job, ranks = self.positions.current(run.tenant, run.run_id, now)
        if not ranks or len(ranks) < ranks[0].world or ranks[0].world < 2:
            return
        since = max(p.progress_at for p in ranks)
        if now - since <= self.hang_rule.floor_s:
            return  # no threshold is below the floor: spare the step-time query
        if any(now - p.seen_at > (now - since) / 2 for p in ranks):
            return  # a rank that stopped polling when the job stopped is dead, not hung
        steps = self.repo.step_durations(run.tenant, run.run_id, RECENT_STEPS)
        hang = live_hang(since, now, self.hang_rule.threshold(recent_step_time(steps)))
        d = stuck_ranks(job, ranks, hang, now) if hang is not None else None
        if d is not None:
            self.findings.upsert(run.tenant, run.run_id, [d])

    def _decide(self, run: Run, now: float) -> None:
        now = max(now, time.time())  # the analysis earlier in this pass took time
        scope = Scope(tenant=run.tenant, role="viewer", actor="remediation")
        acted_on = {*self.policy.fatal, *self.policy.stragglers, "hang"}
        findings = [f for f in self.findings.rows(scope, run.run_id) if f.diagnosis in acted_on]
        if not findings:
            return
        job, ranks = self.positions.current(run.tenant, run.run_id, now)
        with self._lock:
            done = self.repo.for_run(run.tenant, run.run_id)
            if any(a.state in _BUSY for a in done):
                return
            measured = [
                float(a.phases["warmup"][1] or 0.0) - a.decided_at
                for a in done
                if a.state is State.RESUMED and a.phases.get("warmup", (0, None))[1] is not None
            ]
            steps = self.repo.step_durations(run.tenant, run.run_id, 50)
            ctx = RunContext(
                world=len(ranks) or run.world_size,
                last_step=run.last_step,
                step_time_s=statistics.median(steps) if steps else None,
                config=dict(run.config or {}),
                measured_restart_s=measured,
                now=now,
            )
            chosen = choose(
                self.policy,
                findings,
                ctx,
                # every attempt's: a job re-forming after a fatal fault has the faulted node's
                # workers polling before the others
                live_nodes=self.positions.nodes(run.tenant, run.run_id, now),
                taken_nodes={a.node for a in done if a.state is not State.FAILED},
                taken_keys={a.finding_key for a in done},
            )
            if chosen is None:
                return
            f, d = chosen
            alert, incident = self.repo.alert_for(run.tenant, run.run_id, f.key) or (None, None)
            a = self.repo.add(
                Action(
                    id=0,
                    tenant=run.tenant,
                    run_id=run.run_id,
                    job_id=job or (f.job_id or ""),
                    node=d.node,
                    ranks=tuple(d.ranks),
                    reason=d.reason,
                    summary=d.summary[:1000],
                    finding_key=f.key,
                    alert_id=alert,
                    incident_id=incident,
                    mode=self.policy.mode,
                    state=initial_state(self.policy.mode),
                    decided_at=now,
                    updated_at=now,
                    world_before=len(ranks) or run.world_size,
                    phases={"detection": (min(f.time or f.first_seen, now), now)},
                    cost=d.cost.stored(),
                )
            )
            log.warning("remediation %s: %s (%s)", a.id, d.summary, a.state.value)
            if a.state is State.DECIDING:
                self._drive(a, self._observe(a, now), now)

    # -- carrying out what the machine says -------------------------------------------------

    def _observe(self, a: Action, now: float, **seen: Any) -> Observations:
        job, ranks = self.positions.current(a.tenant, a.run_id, now)
        stopped, stopped_at = self.positions.stops(a.id)
        on_node = (
            self.positions.on_node(a.tenant, a.run_id, a.job_id, a.node)
            if a.state is State.REMOVING
            else frozenset()
        )
        return Observations(
            job_id=job if ranks else "",
            world=ranks[0].world if ranks else 0,
            polling=len(ranks),
            nodes=frozenset(p.node for p in ranks),
            stopped=stopped,
            stopped_at=stopped_at,
            ranks_on_node=on_node,
            **seen,
        )

    def _drive(self, a: Action, obs: Observations, now: float) -> Action:
        """Advance the action, carry out the effects (answering those that ask, in another
        step of the machine), store it and tell the job."""
        start = a
        for _ in range(8):  # each answered effect is one more step; a sequence has at most three
            a, effects = advance(a, obs, now, self.limits)
            answers: dict[str, Any] = {}
            for e in effects:
                if isinstance(e, Actuate):
                    why = f"fleetlens #{a.id}: {a.reason}"
                    done = [x.apply(a.node, why) for x in self.actuators if x.stage == e.stage]
                    a = replace(a, actuators=(*a.actuators, *(o.to_json() for o in done)))
                    answers.update(actuated=e.stage, pending=any(o.pending for o in done))
                elif isinstance(e, Verify):
                    digest = self._sha256(e.path, self.readable_roots)
                    answers.update(verified=True, server_sha256=digest)
                    answers["verified_at"] = time.time()
                elif isinstance(e, LookUpLastStep):
                    last = self.repo.last_step(a.tenant, a.run_id, e.job_id, e.exclude)
                    answers.update(looked_up=True, last_step=last)
                elif isinstance(e, Emit):
                    self._emit(a, e)
                elif isinstance(e, ForgetStops):
                    self.positions.forget_stops(a.id)
            if not any(asks(e) for e in effects):
                break
            obs = replace(obs, verb="", answer=None, **answers)
        if a != start:
            self.repo.save(a)
        self._publish(a)
        if a.state is not start.state:
            self._log(a)
        return a

    @staticmethod
    def _sha256(path: str, roots: Sequence[str]) -> str | None:
        """The checkpoint's digest where the server may and can read it (DATA/artifacts on a
        shared file system, an object store: the API's rule for URIs); None where it cannot.
        The path comes from the job, so the server never opens one outside that rule."""
        if not path or server_read_refusal(path, roots) is not None:
            return None
        try:
            return sha256_of(path)[0]
        except ConfigError:
            return None

    def _emit(self, a: Action, e: Emit) -> None:
        try:
            self.repo.write_event(a, e.kind, e.at, e.attrs, e.job_id)
        except Exception:
            self.errors += 1
            log.exception("writing remediation event failed")

    def _publish(self, a: Action) -> None:
        self.positions.publish(a.tenant, a.run_id, a.id, instruction(a))

    @staticmethod
    def _log(a: Action) -> None:
        if a.state is State.FAILED:
            log.error("remediation %s failed: %s", a.id, a.error)
        elif a.state is State.RESUMED:
            log.warning(
                "remediation %s: resumed at step %s, world %s, %.1fs after the decision",
                a.id,
                a.resume_step,
                a.world_after,
                a.recovery_s or 0.0,
            )
        else:
            log.info("remediation %s: %s", a.id, a.state.value)

    def state_counts(self) -> dict[tuple[str, str], int]:
        """(tenant, state) -> how many actions, for /metrics."""
        return self.repo.state_counts()
