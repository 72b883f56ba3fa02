"""The JSON of triggered trace captures (:mod:`fleetlens.api.captures`): the request that asks
one and the capture as the routes answer it (:mod:`fleetlens.store.captures`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from ..services.captures import MAX_RANKS, MAX_STEPS
from ..store.captures import Capture, CapturedRank, CaptureEvidence
from ..traces.summary import RankSummary
from .models import ApiModel

__all__ = [
    "CaptureEvidenceOut",
    "CaptureIn",
    "CaptureOut",
    "CapturedRankOut",
    "CapturesOut",
    "TopCollectiveOut",
    "TopKernelOut",
]


class CaptureIn(ApiModel):
    """Ask the job's ranks for a short profiler trace (ranks that offer capture)."""

    ranks: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(
        min_length=1, max_length=MAX_RANKS, description="the ranks to profile, compared in order"
    )
    steps: int = Field(3, ge=1, le=MAX_STEPS, description="profiled steps, after one warm-up")


class CaptureOut(ApiModel):
    """A capture: what asked it, its state, and each rank's breakdown once its trace is in."""

    capture_id: int
    run_id: str
    job_id: str
    ranks: list[int] = Field(description="the lagging (or first named) rank first")
    from_step: int = Field(description="the step the ranks start profiling at (warm-up first)")
    steps: int
    warmup: int
    reason: str
    finding_key: str = Field(description="the finding that asked for it; empty when a person did")
    state: str = Field(description="requested, partial, done or expired")
    message: str
    requested_at: float
    updated_at: float
    evidence: dict[str, Any] = Field(
        description="the side-by-side the finding shows (signal trace_capture): per rank, the "
        "mean step, compute, communication, idle and memory-copy milliseconds a step, the "
        "heaviest kernels and collectives"
    )

    @classmethod
    def of(cls, c: Capture) -> CaptureOut:
        return cls(
            capture_id=c.id,
            run_id=c.run_id,
            job_id=c.job_id,
            ranks=list(c.ranks),
            from_step=c.from_step,
            steps=c.steps,
            warmup=c.warmup,
            reason=c.reason,
            finding_key=c.finding_key,
            state=c.state,
            message=c.message,
            requested_at=c.requested_at,
            updated_at=c.updated_at,
            evidence=CaptureEvidenceOut.of(CaptureEvidence.of(c)).model_dump(
                mode="json", by_alias=True, exclude_unset=True
            ),
        )


class CapturesOut(ApiModel):
    run_id: str
    captures: list[CaptureOut] = Field(description="newest first")


class TopKernelOut(ApiModel):
    """One of the heaviest kernels of a rank's captured steps (summed over them)."""

    name: str
    category: str
    calls: int
    total_ms: float


class TopCollectiveOut(ApiModel):
    """One of the collectives of a rank's captured steps with the most time."""

    op: str
    calls: int
    total_ms: float


class CapturedRankOut(ApiModel):
    """A rank of a capture's evidence (:func:`fleetlens.traces.capture.rank_summary`): the
    mean milliseconds a step per line, once its trace is in; ``missing`` until then."""

    rank: int
    role: str = Field(description="lagging, peer, or named (a person asked)")
    missing: bool = False
    steps: int | None = None
    from_step: int | None = None
    to_step: int | None = None
    clock: str | None = None
    host_only: bool = False
    step_ms: float | None = None
    compute_ms: float | None = None
    comm_ms: float | None = None
    exposed_comm_ms: float | None = None
    memcpy_ms: float | None = None
    idle_ms: float | None = None
    kernels: int | None = None
    collectives: int | None = None
    top_kernels: list[TopKernelOut] = Field(default_factory=list)
    top_collectives: list[TopCollectiveOut] = Field(default_factory=list)

    @classmethod
    def of(cls, r: CapturedRank) -> CapturedRankOut:
        s = r.summary
        if s is None:
            return cls(rank=r.rank, role=r.role, missing=True)
        if not s.steps:
            return cls(rank=r.rank, role=r.role, steps=0)
        return cls(rank=r.rank, role=r.role, **_summary_fields(s))


def _summary_fields(s: RankSummary) -> dict[str, Any]:
    return {
        "steps": s.steps,
        "from_step": s.from_step,
        "to_step": s.to_step,
        "clock": s.clock,
        "host_only": s.host_only,
        "step_ms": s.step_ms,
        "compute_ms": s.compute_ms,
        "comm_ms": s.comm_ms,
        "exposed_comm_ms": s.exposed_comm_ms,
        "memcpy_ms": s.memcpy_ms,
        "idle_ms": s.idle_ms,
        "kernels": s.kernels,
        "collectives": s.collectives,
        "top_kernels": [
            TopKernelOut(name=k.name, category=k.category, calls=k.calls, total_ms=k.total_ms)
            for k in s.top_kernels
        ],
        "top_collectives": [
            TopCollectiveOut(op=k.op, calls=k.calls, total_ms=k.total_ms) for k in s.top_collectives
        ],
    }


class CaptureEvidenceOut(ApiModel):
    """A capture as a finding's evidence item (signal ``trace_capture``) and as
    :attr:`CaptureOut.evidence`: its captured steps and each rank's breakdown, lagging first
    (:class:`fleetlens.store.captures.CaptureEvidence`). The answers carry it as a plain
    object; this is its shape, for readers (the CLI)."""

    signal: str
    capture_id: int
    state: str
    from_step: int | None
    to_step: int | None
    ranks: list[CapturedRankOut]

    @classmethod
    def of(cls, ev: CaptureEvidence) -> CaptureEvidenceOut:
        return cls(
            signal=ev.signal,
            capture_id=ev.capture_id,
            state=ev.state,
            from_step=ev.from_step,
            to_step=ev.to_step,
            ranks=[CapturedRankOut.of(r) for r in ev.ranks],
        )
