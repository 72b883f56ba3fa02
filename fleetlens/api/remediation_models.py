"""The JSON of the remediation routes (:mod:`fleetlens.api.remediation`): the job's control
channel and the actions people read, approve or reject (beside :mod:`fleetlens.api.models`,
whose conventions these follow: camelCase on the wire, unknown keys refused).

An action as a caller sees it (:func:`fleetlens.api.remediation.action_view`) is whole for the
tenant's own roles and trimmed to :data:`~fleetlens.api.remediation.INFRA_KEYS` for
infrastructure on-call: the keys on-call does not see have defaults here and the routes answer
with ``response_model_exclude_unset``, so the JSON carries exactly the keys the view kept. An
alert, an incident and the portal's pages list actions in the same shape (:class:`ActionOut`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from .models import ApiModel

if TYPE_CHECKING:
    from ..services.captures import CaptureInstruction

__all__ = [
    "ActionOut",
    "ActionState",
    "ActuatorOutcomeOut",
    "ControlAckOut",
    "ControlCaptureOut",
    "ControlInstructionOut",
    "ControlPollOut",
    "PhaseOut",
    "RemediationCostOut",
    "RemediationListOut",
    "RemediationMode",
]

ActionState = Literal[
    "recommended",
    "awaiting_approval",
    "deciding",
    "draining",
    "removing",
    "restarting",
    "resumed",
    "drained",
    "rejected",
    "failed",
]
"""The states of :class:`fleetlens.remediation.machine.State`, as stored and shown."""
RemediationMode = Literal["off", "recommend", "approve", "automatic"]
"""The remediation policy's modes (:data:`fleetlens.remediation.policy.MODES`)."""


# ---- actions ------------------------------------------------------------------------------
class PhaseOut(ApiModel):
    """One timed phase of an action (UNIX seconds)."""

    start: float | None
    end: float | None
    seconds: float | None = Field(description="end - start; null until both are known")


class ActuatorOutcomeOut(ApiModel):
    """What one actuator did (or failed to do) at one stage of an action."""

    actuator: str
    stage: str = Field(description="drain or remove")
    node: str
    ok: bool
    detail: str
    at: float
    pending: bool = Field(description="completed later, by the job's own answers")


class RemediationCostOut(ApiModel):
    """Why the action was taken: the rule, and for a straggler the trade it weighed."""

    rule: str = Field(
        default="", description="fatal hardware fault, hung node, or the straggler trade"
    )
    wait_per_step_s: float | None = Field(
        default=None, description="straggler: the wall-clock every step waits for it"
    )
    remaining_steps: float | None = None
    remaining_basis: str | None = Field(default=None, description="where the steps left come from")
    expected_loss_s: float | None = Field(default=None, description="wait per step x steps left")
    restart_cost_s: float | None = None
    restart_cost_basis: str | None = None
    margin: float | None = Field(default=None, description="act when loss > margin x restart")


class ActionOut(ApiModel):
    """A remediation action as the caller may see it: whole for the tenant's own roles; for
    infrastructure on-call only its identity, node, reason, mode, state, times, approver, error
    and whether its run ended (the keys with defaults here are then absent)."""

    id: int
    tenant: str
    run_id: str
    job_id: str = ""
    node: str
    ranks: list[int] = Field(default_factory=list)
    reason: str = Field(description="the diagnosis that raised it")
    summary: str = ""
    finding_key: str = ""
    alert_id: int | None = None
    incident_id: int | None = None
    mode: RemediationMode = Field(description="the policy's mode when it was decided")
    state: ActionState
    decided_at: float
    updated_at: float
    approved_by: str | None
    world_before: int = 0
    world_after: int | None = None
    stop_step: int | None = None
    resume_step: int | None = None
    steps_lost: int | None = Field(
        default=None, description="steps run before the action and not kept"
    )
    recovery_s: float | None = Field(
        default=None, description="from the decision to the resumed job's first step"
    )
    checkpoint: dict[str, Any] = Field(
        default_factory=dict,
        description="the drain checkpoint as the ranks reported it (their manifest), and how "
        "it was verified",
    )
    phases: dict[str, PhaseOut] = Field(
        default_factory=dict, description="phase name -> its times, in order"
    )
    actuators: list[ActuatorOutcomeOut] = Field(default_factory=list)
    cost: RemediationCostOut = Field(default_factory=RemediationCostOut)
    error: str | None
    run_ended: str | None = Field(
        default=None,
        description="the run's status once it has ended (a pending action of it may only be "
        "rejected); null while it runs. The remediation routes and the on-call page only",
    )


# ---- the job's control channel ------------------------------------------------------------
class ControlInstructionOut(ApiModel):
    """What the ranks of a job attempt are told to do now."""

    id: int = Field(description="the action")
    phase: Literal["stop", "remove", "restart"] = Field(
        description="stop at the next step boundary; remove: the node's workers stop their "
        "agent; restart"
    )
    node: str
    job_id: str = Field(description='the job attempt told; "": every attempt (remove)')
    force: bool = Field(description="a hung job: restart ranks stuck in a collective")
    world: int = Field(description="the job's world size before the action")


class ControlCaptureOut(ApiModel):
    """A trace capture the rank is part of: from which step, how many, after a warm-up."""

    id: int
    steps: int
    warmup: int
    ranks: list[int]
    from_step: int = Field(description="a rank that hears of it later starts at once")

    @classmethod
    def of(cls, i: CaptureInstruction) -> ControlCaptureOut:
        return cls(
            id=i.id, steps=i.steps, warmup=i.warmup, ranks=list(i.ranks), from_step=i.from_step
        )


class ControlPollOut(ApiModel):
    """A rank's control poll answered: the instruction for its job, a capture, the pace."""

    action: ControlInstructionOut | None = Field(description="null: nothing to do")
    capture: ControlCaptureOut | None = Field(description="null: no capture asked of the rank")
    min_interval_s: float = Field(description="poll no more often than this (seconds)")


class ControlAckOut(ApiModel):
    """What a rank's answer moved: the action and its state (both null: no action waited)."""

    id: int | None
    state: ActionState | None


class RemediationListOut(ApiModel):
    """Remediation actions, newest first, and the policy's mode."""

    remediations: list[ActionOut]
    mode: RemediationMode
