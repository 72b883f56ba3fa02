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

A hung rank cannot reach a step boundary, so for a hang steps 2-3 are skipped (the job resumes
from its newest verified checkpoint) and the restart is forced on ranks stuck in a collective.
Every phase is timed and written to the run's events as ``remediation`` events with
``category=recovery``, so the goodput breakdown charges them to recovery.

Ranks report where they are with every control poll; a job whose ranks have all stopped
progressing for ``hang_s`` while some are behind the others is a live hang, and the ranks
behind name the node (a finding, ``hang``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from sqlalchemy import func, select

from ..alerts.models import Alert
from ..analysis.rootcause import Diagnosis
from ..errors import ConfigError, NotFound
from ..store.access import AccessStore
from ..store.findings import FindingsStore
from ..store.graph import sha256_of
from ..store.metadata import MetadataStore
from ..store.models import Run
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from .actuators import Actuator, Outcome
from .models import Remediation
from .policy import RemediationPolicy, RunContext, decide

__all__ = ["ACTIVE", "INFRA_KEYS", "PHASES", "Controller", "Position", "remediation_json"]

log = logging.getLogger("fleetlens.remediation")

ACTIVE = ("draining", "removing", "restarting")
FINAL = ("recommended", "rejected", "resumed", "drained", "failed")
_CONTROL_PHASE = {"draining": "stop", "removing": "remove", "restarting": "restart"}
PHASES = (
    "detection",
    "approval",
    "wait",
    "checkpoint",
    "verify",
    "remove",
    "rendezvous",
    "reload",
    "warmup",
)


@dataclass
class Position:
    """Where one rank is, from its last control poll."""

    job_id: str
    rank: int
    world: int
    node: str
    step: int
    seq: int
    progress_at: float
    seen_at: float
    pid: int = 0
    agent_pid: int = 0


@dataclass
class _RunPositions:
    ranks: dict[tuple[str, int], Position] = field(default_factory=dict)

    def current(self, now: float, stale_s: float) -> tuple[str, list[Position]]:
        """The newest job attempt and its ranks that polled within ``stale_s``."""
        fresh = [p for p in self.ranks.values() if now - p.seen_at <= stale_s]
        if not fresh:
            return "", []
        job = max(fresh, key=lambda p: p.seen_at).job_id
        return job, sorted((p for p in fresh if p.job_id == job), key=lambda p: p.rank)


INFRA_KEYS = ("id", "tenant", "runId", "node", "reason", "mode", "state", "decidedAt",
              "updatedAt", "approvedBy", "error")  # fmt: skip
"""What infrastructure on-call sees of an action: not the run's checkpoint path, summary or
cost (they come from the run's config: its steps left)."""


def _view(scope: Scope, r: Remediation) -> dict[str, Any]:
    """An action as this caller may see it: whole for the tenant's own roles, trimmed to
    :data:`INFRA_KEYS` for on-call, whose role reads no run contents."""
    out = remediation_json(r)
    return out if scope.can("read") else {k: out[k] for k in INFRA_KEYS}


def remediation_json(r: Remediation) -> dict[str, Any]:
    phases = {
        k: {"start": v[0], "end": v[1], "seconds": _span(v)}
        for k, v in sorted(r.phases.items(), key=lambda kv: _order(kv[0]))
    }
    first = max((a["time"] for a in r.acks if a.get("event") == "resumed"), default=None)
    return {
        "id": r.id,
        "tenant": r.tenant,
        "runId": r.run_id,
        "jobId": r.job_id,
        "node": r.node,
        "ranks": list(r.ranks),
        "reason": r.reason,
        "summary": r.summary,
        "findingKey": r.finding_key,
        "alertId": r.alert_id,
        "incidentId": r.incident_id,
        "mode": r.mode,
        "state": r.state,
        "decidedAt": r.decided_at,
        "updatedAt": r.updated_at,
        "approvedBy": r.approved_by or None,
        "worldBefore": r.world_before,
        "worldAfter": r.world_after or None,
        "stopStep": r.stop_step if r.stop_step >= 0 else None,
        "resumeStep": r.resume_step if r.resume_step >= 0 else None,
        "stepsLost": _steps_lost(r),
        "recoveryS": (first - r.decided_at) if first is not None else None,
        "checkpoint": dict(r.checkpoint),
        "phases": phases,
        "actuators": list(r.actuators),
        "cost": dict(r.cost),
        "error": r.error or None,
    }


def _span(v: list[float | None]) -> float | None:
    return v[1] - v[0] if v[0] is not None and v[1] is not None else None


def _start(r: Remediation, phase: str) -> float:
    return float(r.phases[phase][0] or 0.0)


def _order(phase: str) -> int:
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


def _steps_lost(r: Remediation) -> int | None:
    """Steps run before the action and not kept: the stop step minus the step resumed from."""
    if r.stop_step < 0 or r.resume_step < 0:
        return None
    return max(0, r.stop_step - r.resume_step)


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
        hang_s: float = 60.0,
        stale_s: float = 10.0,
        stop_timeout_s: float = 300.0,
        remove_timeout_s: float = 15.0,
        resume_timeout_s: float = 900.0,
    ) -> None:
        self._session = metadata._session
        self.telemetry = telemetry
        self.findings = findings
        self.access = access
        self.policy = policy
        self.actuators = actuators
        self.hang_s = hang_s
        self.stale_s = stale_s
        self.stop_timeout_s = stop_timeout_s
        self.remove_timeout_s = remove_timeout_s
        self.resume_timeout_s = resume_timeout_s
        # _lock serializes the actions' state changes (database work, actuators); _plock only
        # guards the in-memory positions and published instructions, so a rank's poll, answered
        # on the event loop, never waits behind an actuator.
        self._lock = threading.RLock()
        self._plock = threading.Lock()
        self._positions: dict[tuple[str, str], _RunPositions] = {}
        self._control: dict[tuple[str, str], dict[str, Any]] = {}
        # Ranks that answered "stopped", per action: kept here, not one row write per rank
        # (10,000 ranks answer within a second); the action records the count once all have.
        self._stopped: dict[int, tuple[set[int], float]] = {}
        self.errors = 0
        self._load_active()

    # -- the job's side: polls and answers --------------------------------------------------------

    def report(self, tenant: str, run_id: str, pos: Position) -> dict[str, Any] | None:
        """Record a rank's position; the instruction for its job attempt, if any."""
        with self._plock:
            rp = self._positions.setdefault((tenant, run_id), _RunPositions())
            rp.ranks[(pos.job_id, pos.rank)] = pos
            if len(rp.ranks) > 4 * max(pos.world, 1) + 64:  # forget attempts long gone
                for key in sorted(rp.ranks, key=lambda k: rp.ranks[k].seen_at)[: pos.world]:
                    del rp.ranks[key]
            c = self._control.get((tenant, run_id))
        if c is None or c.get("jobId") not in ("", pos.job_id):
            return None
        return c

    def ack(self, tenant: str, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """A rank's answer; the action moves on at once when it completes a phase."""
        now = time.time()
        aid = int(body.get("id", 0))
        if body.get("event") == "stopped" and aid:
            with self._plock:
                c = self._control.get((tenant, run_id))
                if c is None or c["id"] != aid or body.get("jobId") != c["jobId"]:
                    raise NotFound(f"remediation {aid} is not stopping run {run_id!r}")
                ranks, last = self._stopped.setdefault(aid, (set(), 0.0))
                ranks.add(int(body["rank"]))
                self._stopped[aid] = (ranks, max(last, float(body["time"])))
                if len(ranks) < int(c["world"]):
                    return {"id": aid, "state": "draining"}
        with self._lock, self._session() as s:
            if aid == 0:  # a restarted attempt resumed: it answers the action restarting it
                if body.get("event") != "resumed":
                    raise NotFound("an answer without an action id must be 'resumed'")
                r = s.scalars(
                    select(Remediation).where(
                        Remediation.tenant == tenant,
                        Remediation.run_id == run_id,
                        Remediation.state == "restarting",
                    )
                ).first()
                if r is None:
                    return {"id": None, "state": None}
            else:
                r = s.get(Remediation, aid)
            if r is None or r.tenant != tenant or r.run_id != run_id:
                raise NotFound(f"remediation {aid} does not exist for run {run_id!r}")
            if body.get("event") != "stopped":
                entry = {k: body[k] for k in sorted(body) if k != "id"}
                entry["received"] = now
                r.acks = [*r.acks, entry][-512:]
            r.updated_at = now
            self._advance(s, r, now)
            self._publish(r)
            return {"id": r.id, "state": r.state}

    # -- people: read, approve, reject -----------------------------------------------------------

    def actions(
        self, scope: Scope, run_id: str | None = None, state: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        with self._session() as s:
            q = select(Remediation)
            if not scope.cross_tenant_infra:
                q = q.where(Remediation.tenant == scope.tenant)
            if run_id:
                q = q.where(Remediation.run_id == run_id)
            if state:
                q = q.where(Remediation.state == state)
            rows = s.scalars(q.order_by(Remediation.decided_at.desc()).limit(limit)).all()
            return [_view(scope, r) for r in rows if self._visible(s, scope, r)]

    def for_incident(self, scope: Scope, incident_id: int) -> list[dict[str, Any]]:
        return self._linked(scope, Remediation.incident_id == incident_id)

    def for_alert(self, scope: Scope, alert_id: int) -> list[dict[str, Any]]:
        return self._linked(scope, Remediation.alert_id == alert_id)

    def _linked(self, scope: Scope, link: Any) -> list[dict[str, Any]]:
        with self._session() as s:
            rows = s.scalars(
                select(Remediation).where(Remediation.tenant == scope.tenant, link)
            ).all()
            return [remediation_json(r) for r in rows if self._visible(s, scope, r)]

    @staticmethod
    def _visible(s: Any, scope: Scope, r: Remediation) -> bool:
        if not scope.project:
            return True
        run = s.scalars(select(Run).where(Run.tenant == r.tenant, Run.run_id == r.run_id)).first()
        return run is not None and run.project == scope.project

    def _get(self, s: Any, scope: Scope, rid: int) -> Remediation:
        r: Remediation | None = s.get(Remediation, rid)
        mine = r is not None and (r.tenant == scope.tenant or scope.cross_tenant_infra)
        if r is None or not mine or not self._visible(s, scope, r):
            raise NotFound(f"remediation {rid} does not exist")
        return r

    def get(self, scope: Scope, rid: int) -> dict[str, Any]:
        with self._session() as s:
            return _view(scope, self._get(s, scope, rid))

    def approve(self, scope: Scope, rid: int) -> dict[str, Any]:
        """Carry out an action awaiting approval (or one only recommended)."""
        return self._settle(scope, rid, "approve")

    def reject(self, scope: Scope, rid: int) -> dict[str, Any]:
        return self._settle(scope, rid, "reject")

    def _settle(self, scope: Scope, rid: int, verb: str) -> dict[str, Any]:
        """A person's answer to a pending action, audited in the tenant whose run it touches
        (on-call acts across tenants)."""
        now = time.time()
        with self._lock, self._session() as s:
            r = self._get(s, scope, rid)
            if r.state not in ("awaiting_approval", "recommended"):
                raise ValueError(f"remediation {rid} is {r.state}; only a pending one is {verb}d")
            r.approved_by = scope.actor
            if verb == "approve":
                r.phases = {**r.phases, "approval": [r.decided_at, now]}
                self._begin(s, r, now)
                self._publish(r)
            else:
                r.state, r.updated_at = "rejected", now
            out = _view(scope, r)
        self.access.audit(out["tenant"], scope.actor, f"remediation.{verb}", f"remediation:{rid}",
                          {"run": out["runId"], "node": out["node"]}, scope.remote)  # fmt: skip
        return out

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
        with self._lock, self._session() as s:
            for r in s.scalars(select(Remediation).where(Remediation.state.in_(ACTIVE))).all():
                try:
                    self._advance(s, r, now)
                except Exception:
                    self.errors += 1
                    log.exception("remediation %s failed to advance", r.id)
                self._publish(r)

    def _hang_check(self, run: Run, now: float) -> None:
        with self._plock:
            rp = self._positions.get((run.tenant, run.run_id))
            job, ranks = rp.current(now, self.stale_s) if rp else ("", [])
        if not ranks or len(ranks) < ranks[0].world or ranks[0].world < 2:
            return
        if now - max(p.progress_at for p in ranks) < self.hang_s:
            return
        head = max((p.step, p.seq) for p in ranks)
        behind = [p for p in ranks if (p.step, p.seq) < head]
        nodes = sorted({p.node for p in behind})
        if not behind or len(behind) == len(ranks) or len(nodes) != 1:
            return  # everyone stuck in the same place: no node to blame
        step = min(p.step for p in behind)
        since = max(p.progress_at for p in ranks)
        d = Diagnosis(
            f"stuck:{job}:{step}",
            "hang",
            "hang",
            0.9,
            f"no progress for {now - since:.0f}s at step {step}: rank(s) "
            f"{[p.rank for p in behind]} on {nodes[0]} never reached the collective the others "
            "wait in",
            step=step,
            start_step=step,
            end_step=-1,
            time=now,
            ranks=[p.rank for p in behind],
            nodes=nodes,
            job_id=job,
            evidence=[
                {
                    "metric": "seconds without progress (every rank)",
                    "value": now - since,
                    "threshold": self.hang_s,
                },
                {
                    "metric": "position (step, collective seq) of each rank",
                    "value": {str(p.rank): [p.step, p.seq] for p in ranks},
                },
            ],
        )
        self.findings.upsert(run.tenant, run.run_id, [d])

    def _decide(self, run: Run, now: float) -> None:
        now = max(now, time.time())  # the analysis earlier in this pass took time
        scope = Scope(tenant=run.tenant, role="viewer", actor="remediation")
        acted_on = {*self.policy.fatal, *self.policy.stragglers, "hang"}
        findings = [f for f in self.findings.list(scope, run.run_id) if f["diagnosis"] in acted_on]
        if not findings:
            return
        with self._plock:
            rp = self._positions.get((run.tenant, run.run_id))
            job, ranks = rp.current(now, self.stale_s) if rp else ("", [])
        live_nodes = {p.node for p in ranks}
        with self._lock, self._session() as s:
            done = s.scalars(
                select(Remediation).where(
                    Remediation.tenant == run.tenant, Remediation.run_id == run.run_id
                )
            ).all()
            taken_nodes = {r.node for r in done if r.state != "failed"}
            taken_keys = {r.finding_key for r in done}
            measured = [
                float(r.phases["warmup"][1] or 0.0) - r.decided_at
                for r in done
                if r.state == "resumed" and r.phases.get("warmup", [0, None])[1] is not None
            ]
            step_s = self._step_time(run)
            ctx = RunContext(
                world=len(ranks) or run.world_size,
                last_step=run.last_step,
                step_time_s=step_s,
                config=dict(run.config or {}),
                measured_restart_s=measured,
                now=now,
            )
            if any(r.state in (*ACTIVE, "awaiting_approval", "deciding") for r in done):
                return  # one action at a time per run
            nodes_left = len(live_nodes) - 1
            min_nodes = run.config.get("min_nodes") if isinstance(run.config, dict) else None
            floor = int(min_nodes) if isinstance(min_nodes, (int, float)) else 1
            if live_nodes and nodes_left < max(1, floor):
                return  # taking a node out would leave the job below its minimum
            cands = []
            for f in findings:
                if f["key"] in taken_keys or (
                    f["kind"] == "straggler" and f.get("endStep") is not None
                ):
                    continue  # acted on already, or an episode that ended
                d = decide(self.policy, f, ctx)
                if d is None or d.node in taken_nodes:
                    continue
                if live_nodes and d.node not in live_nodes:
                    continue  # the node is no longer in the running job
                cands.append((d.priority, f, d))
            if not cands:
                return
            _, f, d = max(cands, key=lambda c: c[0])
            alert = s.scalars(
                select(Alert)
                .where(
                    Alert.tenant == run.tenant,
                    Alert.run_id == run.run_id,
                    Alert.finding_key == f["key"],
                )
                .order_by(Alert.starts_at.desc())
            ).first()
            mode = self.policy.mode
            r = Remediation(
                tenant=run.tenant,
                run_id=run.run_id,
                job_id=job or (f.get("jobId") or ""),
                node=d.node,
                ranks=d.ranks,
                reason=d.reason,
                summary=d.summary[:1000],
                finding_key=f["key"],
                alert_id=alert.id if alert else None,
                incident_id=alert.incident_id if alert else None,
                mode=mode,
                state={"recommend": "recommended", "approve": "awaiting_approval"}.get(
                    mode, "deciding"
                ),
                decided_at=now,
                updated_at=now,
                approved_by="",
                world_before=len(ranks) or run.world_size,
                world_after=0,
                stop_step=-1,
                resume_step=-1,
                checkpoint={},
                phases={"detection": [min(float(f.get("time") or f["firstSeen"]), now), now]},
                acks=[],
                actuators=[],
                cost=d.cost,
                error="",
            )
            s.add(r)
            s.flush()
            log.warning("remediation %s: %s (%s)", r.id, d.summary, r.state)
            if mode == "automatic":
                self._begin(s, r, now)
            self._publish(r)

    def _step_time(self, run: Run) -> float | None:
        t = self.telemetry.query(
            "SELECT quantileExact(0.5)(`end` - start) AS s FROM (SELECT start, `end` FROM "
            f"{self.telemetry.database}.steps_by_step WHERE tenant = {{tenant:String}} AND "
            "run_id = {run:String} ORDER BY step DESC LIMIT 50)",
            {"tenant": run.tenant, "run": run.run_id},
        ).to_pylist()
        v = t[0]["s"] if t else None
        return float(v) if v else None

    # -- the sequence ---------------------------------------------------------------------------

    def _begin(self, s: Any, r: Remediation, now: float) -> None:
        """Mark the node draining, then ask the job to stop at its next step boundary."""
        outcomes = [
            a.apply(r.node, f"fleetlens #{r.id}: {r.reason}")
            for a in self.actuators
            if a.stage == "drain"
        ]
        r.actuators = [*r.actuators, *(o.to_json() for o in outcomes)]
        self._event(
            r,
            "drain",
            now,
            {"planned": False, "remediation": r.id, "node": r.node, "reason": r.reason},
        )
        with self._plock:
            rp = self._positions.get((r.tenant, r.run_id))
            job, ranks = rp.current(now, self.stale_s) if rp else ("", [])
        r.updated_at = now
        if not ranks:
            r.state = "drained"  # the job is not reachable (gone, or no control channel)
            r.error = "the job is not polling its control channel: node drained, job untouched"
            return
        r.job_id, r.world_before = job, ranks[0].world
        if r.reason == "hang":
            r.checkpoint = {
                "source": "newest verified periodic checkpoint (a hung step cannot finish)"
            }
            self._remove(s, r, now)
            return
        r.state = "draining"
        r.phases = {**r.phases, "wait": [now, None]}

    def _remove(self, s: Any, r: Remediation, now: float) -> None:
        outcomes: list[Outcome] = [
            a.apply(r.node, f"fleetlens #{r.id}: {r.reason}")
            for a in self.actuators
            if a.stage == "remove"
        ]
        r.actuators = [*r.actuators, *(o.to_json() for o in outcomes)]
        r.updated_at = now
        if any(o.pending for o in outcomes):
            r.state = "removing"
            r.phases = {**r.phases, "remove": [now, None]}
        else:
            self._restart(r, now)

    def _restart(self, r: Remediation, now: float) -> None:
        r.state = "restarting"
        r.updated_at = now
        r.phases = {**r.phases, "rendezvous": [now, None]}

    def _advance(self, s: Any, r: Remediation, now: float) -> None:
        acks = [a for a in r.acks if a.get("jobId") == r.job_id]
        if r.state == "draining":
            failed = [a for a in acks if a.get("event") == "checkpoint_failed"]
            if failed:
                self._fail(r, now, f"checkpoint failed on rank 0: {failed[-1].get('error', '')}")
                return
            with self._plock:
                stopped, t_stop = self._stopped.get(r.id, (set(), 0.0))
            ck = [a for a in acks if a.get("event") == "checkpointed"]
            if len(stopped) >= r.world_before and ck:
                c = ck[-1]
                with self._plock:
                    self._stopped.pop(r.id, None)
                r.acks = [*r.acks, {"event": "stopped", "ranks": len(stopped), "time": t_stop,
                                    "jobId": r.job_id, "received": now}][-512:]  # fmt: skip
                t_ck = min(float(c.get("started", t_stop)), t_stop)
                r.phases = {
                    **r.phases,
                    "wait": [r.phases["wait"][0], t_stop],
                    "checkpoint": [t_ck, float(c["time"])],
                }
                r.stop_step = int(c["step"])
                man = dict(c.get("checkpoint") or {})
                t_v = time.time()
                verified_by = "rank 0 (read-back checksum)"
                path = str(man.get("path", ""))
                try:  # where the server can read it (a shared file system, an object store)
                    got: str | None = sha256_of(path)[0] if path else None
                except ConfigError:
                    got = None
                if got is not None:
                    if got != man.get("sha256"):
                        self._fail(
                            r,
                            now,
                            f"checkpoint {path} has sha256 {got}, the job wrote "
                            f"{man.get('sha256')}: not removing the node",
                        )
                        return
                    verified_by = "server (read-back checksum) and rank 0"
                r.checkpoint = {**man, "verifiedBy": verified_by}
                r.phases = {**r.phases, "verify": [float(c["time"]), time.time()]}
                log.info("remediation %s: checkpoint verified in %.3fs", r.id, time.time() - t_v)
                self._remove(s, r, now)
            elif now - _start(r, "wait") > self.stop_timeout_s:
                self._fail(r, now, f"the job did not stop within {self.stop_timeout_s:.0f}s")
        elif r.state == "removing":
            on_node = self._ranks_on(r, now)
            gone = {int(a["rank"]) for a in acks if a.get("event") == "agent_stopping"}
            started = _start(r, "remove")
            if (on_node and on_node <= gone) or now - started > self.remove_timeout_s:
                if not (on_node and on_node <= gone):
                    r.error = (
                        f"no answer from the node's workers in {self.remove_timeout_s:.0f}s"
                        "; restarting without it"
                    )
                r.phases = {**r.phases, "remove": [started, now]}
                self._restart(r, now)
        elif r.state == "restarting":
            resumed = [
                a for a in r.acks if a.get("event") == "resumed" and a.get("jobId") != r.job_id
            ]
            if resumed:
                self._finish(r, resumed[0], now)
            elif now - _start(r, "rendezvous") > self.resume_timeout_s:
                self._fail(r, now, f"the job did not resume within {self.resume_timeout_s:.0f}s")

    def _ranks_on(self, r: Remediation, now: float) -> set[int]:
        with self._plock:
            rp = self._positions.get((r.tenant, r.run_id))
            if rp is None:
                return set()
            return {
                p.rank for (job, _), p in rp.ranks.items() if job == r.job_id and p.node == r.node
            }

    def _finish(self, r: Remediation, a: dict[str, Any], now: float) -> None:
        t_first = float(a["time"])
        loaded = float(a.get("loadedAt", t_first))
        load_s = float(a.get("loadS", 0.0))
        # Contiguous and in order, whatever the clocks of the hosts say.
        t0 = _start(r, "rendezvous")
        t1 = max(t0, loaded - load_s)
        t2 = max(t1, loaded)
        r.phases = {
            **r.phases,
            "rendezvous": [t0, t1],
            "reload": [t1, t2],
            "warmup": [t2, max(t2, t_first)],
        }
        r.resume_step = int(a.get("step", -1))
        r.world_after = int(a.get("world", 0))
        if r.stop_step < 0 and r.resume_step >= 0:
            last = self._last_step(r)
            r.stop_step = last + 1 if last is not None else r.resume_step
        r.state, r.updated_at = "resumed", now
        new_job = str(a.get("jobId", ""))
        for name, (p0, p1) in r.phases.items():
            if p0 is None or p1 is None or name in ("detection", "approval"):
                continue  # training went on meanwhile: not a pause
            job = new_job if name in ("reload", "warmup") else r.job_id
            self._event(
                r,
                "remediation",
                p0,
                {
                    "remediation": r.id,
                    "phase": name,
                    "duration": max(0.0, p1 - p0),
                    "category": "recovery",
                    "node": r.node,
                },
                job,
            )
        log.warning(
            "remediation %s: resumed at step %s, world %s, %.1fs after the decision",
            r.id,
            r.resume_step,
            r.world_after,
            t_first - r.decided_at,
        )

    def _last_step(self, r: Remediation) -> int | None:
        t = self.telemetry.query(
            f"SELECT max(step) AS s FROM {self.telemetry.database}.steps_by_step WHERE "
            "tenant = {tenant:String} AND run_id = {run:String} AND job_id = {job:String}",
            {"tenant": r.tenant, "run": r.run_id, "job": r.job_id},
        ).to_pylist()
        v = t[0]["s"] if t else None
        return int(v) if v is not None else None

    def _fail(self, r: Remediation, now: float, why: str) -> None:
        r.state, r.error, r.updated_at = "failed", why[:1000], now
        with self._plock:
            self._stopped.pop(r.id, None)
        log.error("remediation %s failed: %s", r.id, why)
        self._event(
            r, "remediation", now, {"remediation": r.id, "phase": "failed", "error": why[:500]}
        )

    def _event(
        self, r: Remediation, kind: str, at: float, attrs: dict[str, Any], job: str | None = None
    ) -> None:
        try:
            table = pa.table(
                {
                    "time": pa.array([at]),
                    "kind": pa.array([kind]),
                    "step": pa.array([-1], pa.int64()),
                    "rank": pa.array([-1], pa.int32()),
                    "node_id": pa.array([r.node]),
                    "gpu": pa.array([-1], pa.int32()),
                    "message": pa.array([f"remediation #{r.id} ({r.reason}): {kind}"]),
                    "attrs": pa.array([json.dumps(attrs)]),
                }
            )
            with self._session() as s:
                run = s.scalars(
                    select(Run).where(Run.tenant == r.tenant, Run.run_id == r.run_id)
                ).first()
            ctx = {
                "tenant": r.tenant,
                "project": run.project if run else "",
                "run_id": r.run_id,
                "job_id": job if job is not None else r.job_id,
            }
            self.telemetry.insert(
                "event",
                table,
                {k: v for k, v in ctx.items() if v},
                f"remediation-{r.id}-{kind}-{attrs.get('phase', '')}",
            )
        except Exception:
            self.errors += 1
            log.exception("writing remediation event failed")

    # -- what the ranks are told ------------------------------------------------------------------

    def _publish(self, r: Remediation) -> None:
        key = (r.tenant, r.run_id)
        with self._plock:
            if r.state in ACTIVE:
                self._control[key] = {
                    "id": r.id,
                    "phase": _CONTROL_PHASE[r.state],
                    "node": r.node,
                    "jobId": r.job_id,
                    "force": r.reason == "hang",
                    "world": r.world_before,
                }
            elif self._control.get(key, {}).get("id") == r.id:
                del self._control[key]

    def _load_active(self) -> None:
        with self._session() as s:
            for r in s.scalars(select(Remediation).where(Remediation.state.in_(ACTIVE))).all():
                self._publish(r)

    def state_counts(self) -> dict[tuple[str, str], int]:
        """(tenant, state) -> how many actions, for /metrics."""
        with self._session() as s:
            rows = s.execute(
                select(Remediation.tenant, Remediation.state, func.count()).group_by(
                    Remediation.tenant, Remediation.state
                )
            ).all()
            return {(str(t), str(st)): int(n) for t, st, n in rows}
