"""The JSON of the server's operational routes: the ingest acknowledgements, ``/healthz``, a
run's scalar series, the Flight Recorder import and the profiler-trace breakdown (beside
:mod:`fleetlens.api.models`, whose conventions these follow: camelCase on the wire, unknown
keys refused).

The ingest routes are answered by :class:`fleetlens.api.ingest.IngestApp`, ahead of
FastAPI: their models document the answer (tests/test_server.py and tests/test_routes.py
validate real ones against them). Their error bodies (``detail``, ``error``, ``field``) are
the app's error answers, not these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from .models import ApiModel

if TYPE_CHECKING:
    from ..analysis.flight_recorder import StuckCollective
    from ..collector.space import SpaceHealth
    from ..services.flight_recorder import FlightRecorderImport, GroupLastCompleted, RankHome
    from ..services.series import MetricName, SeriesPoint, SeriesRead
    from ..services.traces import TraceCollective, TraceKernel, TraceRank, TraceStep

__all__ = [
    "BATCHES_STORED",
    "INGEST_STORED",
    "FlightRecorderGroupOut",
    "FlightRecorderImportOut",
    "FlightRecorderRankOut",
    "FlightRecorderStuckOut",
    "HealthOut",
    "IngestAckOut",
    "IngestBatchesOut",
    "IngestFrameOut",
    "MetricNameOut",
    "MetricPointOut",
    "MetricsOut",
    "StorageHealthOut",
    "TraceCollectiveOut",
    "TraceFileOut",
    "TraceKernelOut",
    "TraceRankOut",
    "TraceStepOut",
    "TracesOut",
]


# ---- ingest -------------------------------------------------------------------------------
class IngestAckOut(ApiModel):
    """A batch stored durably (or already stored: batches are idempotent)."""

    batch_id: str
    rows: dict[str, int] = Field(description="rows stored, per record kind")
    status: Literal["stored"]
    rejected: dict[str, int] = Field(
        default_factory=dict,
        description="rows refused alone, by field; present only when some were",
    )
    errors: list[str] = Field(
        default_factory=list, description="why rows were refused; present with `rejected`"
    )
    clock_skew_s: float = Field(
        default=0.0,
        description="the sender's clock behind the server's (negative: ahead), seconds; "
        "present only when over the tolerance",
    )
    time_shift_s: float = Field(
        default=0.0, description="seconds added to the batch's times; present with clockSkewS"
    )
    flush_s: float = Field(description="the flush interval the server asks of its sender")


class IngestFrameOut(ApiModel):
    """One frame's answer in a relay's request: stored (200), refused (4xx) or not tried (429)."""

    status: int = Field(description="200: stored; 4xx: a bad batch; 429: send it again")
    batch_id: str | None = Field(default=None, description="200 only")
    rows: dict[str, int] = Field(default_factory=dict, description="200 only")
    rejected: dict[str, int] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    clock_skew_s: float = 0.0
    time_shift_s: float = 0.0
    error: str | None = Field(default=None, description="why the frame was refused (4xx, 429)")
    field: str | None = Field(default=None, description="the bad batch's field (4xx but 429)")


class IngestBatchesOut(ApiModel):
    """Every frame of a relay's request answered, in order."""

    results: list[IngestFrameOut]
    flush_s: float = Field(description="the flush interval the server asks of the relay")


INGEST_STORED: dict[str, Any] = {
    "model": IngestAckOut,
    "description": "Stored durably (or already stored: batches are idempotent); rows that "
    "broke a rule were refused alone: `rejected` counts them by field, `errors` says why",
}
"""The OpenAPI of ``POST /v1/ingest``'s 200 (the route answers it by itself)."""
BATCHES_STORED: dict[str, Any] = {
    "model": IngestBatchesOut,
    "description": "Every frame answered in `results`, in order: `status` 200 (stored "
    "durably, or already stored) with `batchId`, `rows`, `rejected`; a 4xx with `error` and "
    "`field` for a bad batch, refused alone; 429 for frames past the request's budget of rows "
    "or decoded bytes (send them again). `flushS`: the sender's interval",
}
"""The OpenAPI of ``POST /v1/ingest/batches``' 200 (the route answers it by itself)."""


# ---- health -------------------------------------------------------------------------------
class StorageHealthOut(ApiModel):
    """The data directory's free space."""

    path: str
    free_bytes: int = Field(description="-1 when the file system cannot be asked")
    min_free_bytes: int
    out_of_space: bool = Field(description="ingest is refused until space is freed")

    @classmethod
    def of(cls, h: SpaceHealth) -> StorageHealthOut:
        return cls(
            path=h.path,
            free_bytes=h.free_bytes,
            min_free_bytes=h.min_free_bytes,
            out_of_space=h.out_of_space,
        )


class HealthOut(ApiModel):
    """Liveness, and whether this server leads."""

    status: Literal["ok"]
    version: str
    leader: bool = Field(description="true unless another of several servers leads")
    storage: StorageHealthOut | None = Field(description="null: no local data directory")


# ---- scalar series ------------------------------------------------------------------------
class MetricNameOut(ApiModel):
    """One scalar a run logged."""

    name: str
    points: int = Field(description="values stored")
    from_step: int
    to_step: int

    @classmethod
    def of(cls, m: MetricName) -> MetricNameOut:
        return cls(name=m.name, points=m.points, from_step=m.from_step, to_step=m.to_step)


class MetricPointOut(ApiModel):
    """One point of a series: a step (or a bucket of steps, or of time) summarised.

    Non-finite values are strings ("nan", "inf"): a NaN loss is the signal."""

    step: int = Field(description="the bucket's first step")
    time: float | None = Field(
        default=None, description="UNIX seconds: the time bucket's start (rollups only)"
    )
    value: float | str | None = Field(description="the first step's value (the lowest rank's)")
    min: float | str | None
    max: float | str | None
    mean: float | str | None
    non_finite: int = Field(description="non-finite values in the bucket")

    @classmethod
    def of(cls, p: SeriesPoint) -> MetricPointOut:
        """``time`` is set for a bucket of time only (absent for a bucket of steps)."""
        if p.time is None:
            return cls(
                step=p.step,
                value=p.value,
                min=p.min,
                max=p.max,
                mean=p.mean,
                non_finite=p.non_finite,
            )
        return cls(
            step=p.step,
            time=p.time,
            value=p.value,
            min=p.min,
            max=p.max,
            mean=p.mean,
            non_finite=p.non_finite,
        )


class MetricsOut(ApiModel):
    """A run's scalar names (no ``name`` asked), or one downsampled series."""

    run_id: str
    metrics: list[MetricNameOut] = Field(
        default_factory=list, description="the run's scalars; only when no name was asked"
    )
    name: str | None = None
    from_step: int | None = None
    to_step: int | None = None
    resolution: Literal["raw", "10s", "1m"] | None = Field(
        default=None, description="raw rows, or the rollup the points were read from"
    )
    points: list[MetricPointOut] = Field(default_factory=list)

    @classmethod
    def of(cls, r: SeriesRead) -> MetricsOut:
        """One downsampled series (``metrics`` absent)."""
        return cls(
            run_id=r.run_id,
            name=r.name,
            from_step=r.from_step,
            to_step=r.to_step,
            resolution=r.resolution,
            points=[MetricPointOut.of(p) for p in r.points],
        )

    @classmethod
    def of_names(cls, run_id: str, names: list[MetricName]) -> MetricsOut:
        """The run's scalar names (only ``runId`` and ``metrics``)."""
        return cls(run_id=run_id, metrics=[MetricNameOut.of(m) for m in names])


# ---- flight recorder ----------------------------------------------------------------------
class FlightRecorderStuckOut(ApiModel):
    """A collective some members of a process group wait in."""

    group: str
    desc: str
    op: str
    seq: int
    members: list[int]
    missing: list[int] = Field(description="the members that never entered it")
    sizes: list[Any] = Field(description="its input sizes, as the dump holds them")
    dtypes: list[Any]

    @classmethod
    def of(cls, s: StuckCollective) -> FlightRecorderStuckOut:
        return cls(
            group=s.group,
            desc=s.desc,
            op=s.op,
            seq=s.seq,
            members=list(s.members),
            missing=list(s.missing),
            sizes=s.sizes,
            dtypes=s.dtypes,
        )


class FlightRecorderGroupOut(ApiModel):
    """The last collective each rank completed in a process group."""

    group: str
    desc: str
    min: int
    max: int
    behind: list[int] = Field(description="the ranks at the lowest (when not all equal)")
    last_completed: dict[str, int] = Field(description="rank -> its last completed collective")

    @classmethod
    def of(cls, g: GroupLastCompleted) -> FlightRecorderGroupOut:
        return cls(
            group=g.group,
            desc=g.desc,
            min=g.min,
            max=g.max,
            behind=g.behind,
            last_completed={str(r): n for r, n in g.last_completed.items()},
        )


class FlightRecorderRankOut(ApiModel):
    """A rank missing from a stuck collective, where the job placed it."""

    rank: int
    node: str | None
    gpu: int | None
    rack: str | None

    @classmethod
    def of(cls, h: RankHome) -> FlightRecorderRankOut:
        return cls(rank=h.rank, node=h.node, gpu=h.gpu, rack=h.rack)


class FlightRecorderImportOut(ApiModel):
    """The dumps' analysis, and the keys of the ``hang`` findings stored."""

    run_id: str
    job_id: str | None
    world: int
    ranks_with_dump: list[int]
    missing_ranks: list[int]
    stuck: list[FlightRecorderStuckOut]
    groups: list[FlightRecorderGroupOut]
    missing: list[FlightRecorderRankOut]
    findings: list[str]

    @classmethod
    def of(cls, r: FlightRecorderImport) -> FlightRecorderImportOut:
        return cls(
            run_id=r.run_id,
            job_id=r.job_id,
            world=r.world,
            ranks_with_dump=r.ranks_with_dump,
            missing_ranks=r.missing_ranks,
            stuck=[FlightRecorderStuckOut.of(s) for s in r.stuck],
            groups=[FlightRecorderGroupOut.of(g) for g in r.groups],
            missing=[FlightRecorderRankOut.of(h) for h in r.missing],
            findings=r.findings,
        )


# ---- traces -------------------------------------------------------------------------------
class TraceStepOut(ApiModel):
    """One rank's ProfilerStep: its time and where the device time went (ms)."""

    step: int
    rank: int
    time: float
    duration_ms: float | None
    compute_ms: float | None
    comm_ms: float | None
    exposed_comm_ms: float | None
    overlap_ms: float | None
    memcpy_ms: float | None
    idle_ms: float | None
    kernels: int
    source: str

    @classmethod
    def of(cls, t: TraceStep) -> TraceStepOut:
        ms = t.ms
        return cls(
            step=t.step,
            rank=t.rank,
            time=t.time,
            duration_ms=t.duration_ms,
            compute_ms=ms.compute,
            comm_ms=ms.comm,
            exposed_comm_ms=ms.exposed_comm,
            overlap_ms=ms.overlap,
            memcpy_ms=ms.memcpy,
            idle_ms=ms.idle,
            kernels=t.kernels,
            source=t.source,
        )


class TraceRankOut(ApiModel):
    """One rank's totals over the window, each line also as a % of step time."""

    rank: int
    steps: int
    duration_ms: float | None
    mean_step_ms: float | None
    compute_ms: float | None
    compute_pct: float | None
    comm_ms: float | None
    comm_pct: float | None
    exposed_comm_ms: float | None
    exposed_comm_pct: float | None
    overlap_ms: float | None
    overlap_pct: float | None
    memcpy_ms: float | None
    memcpy_pct: float | None
    idle_ms: float | None
    idle_pct: float | None
    kernels: int
    collectives: int
    file_bytes: int | None = Field(description="the rank's kept trace file; null: none")

    @classmethod
    def of(cls, r: TraceRank, file_bytes: int | None) -> TraceRankOut:
        ms, pct = r.ms, r.pct
        return cls(
            rank=r.rank,
            steps=r.steps,
            duration_ms=r.duration_ms,
            mean_step_ms=r.mean_step_ms,
            compute_ms=ms.compute,
            compute_pct=pct.compute,
            comm_ms=ms.comm,
            comm_pct=pct.comm,
            exposed_comm_ms=ms.exposed_comm,
            exposed_comm_pct=pct.exposed_comm,
            overlap_ms=ms.overlap,
            overlap_pct=pct.overlap,
            memcpy_ms=ms.memcpy,
            memcpy_pct=pct.memcpy,
            idle_ms=ms.idle,
            idle_pct=pct.idle,
            kernels=r.kernels,
            collectives=r.collectives,
            file_bytes=file_bytes,
        )


class TraceKernelOut(ApiModel):
    """A kernel with much device time, every traced rank summed."""

    name: str
    category: str
    calls: int
    total_ms: float | None
    pct_of_step_time: float | None
    ranks: int

    @classmethod
    def of(cls, k: TraceKernel) -> TraceKernelOut:
        return cls(
            name=k.name,
            category=k.category,
            calls=k.calls,
            total_ms=k.total_ms,
            pct_of_step_time=k.pct_of_step_time,
            ranks=k.ranks,
        )


class TraceCollectiveOut(ApiModel):
    """A collective operation with much time between enter and exit, every rank summed."""

    op: str
    calls: int
    total_ms: float | None
    bytes: int
    ranks: int

    @classmethod
    def of(cls, c: TraceCollective) -> TraceCollectiveOut:
        return cls(op=c.op, calls=c.calls, total_ms=c.total_ms, bytes=c.bytes, ranks=c.ranks)


class TracesOut(ApiModel):
    """A run's imported profiler traces over a window of steps."""

    run_id: str
    from_step: int | None = Field(description="null: nothing imported and no window asked")
    to_step: int | None
    ranks: list[TraceRankOut]
    top_kernels: list[TraceKernelOut]
    top_collectives: list[TraceCollectiveOut]
    steps: list[TraceStepOut]


class TraceFileOut(ApiModel):
    """A rank's trace file kept."""

    run_id: str
    rank: int
    bytes: int
