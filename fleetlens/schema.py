"""The run graph schema: identifiers and record kinds, in one place.

Every record carries the identifiers that join it to the rest of the run graph. Identifiers that
are constant for a batch (tenant, project, run, job) travel once in the batch's ``ctx``; the
rest are columns. Rank placement (rank -> node, GPU, rack, switch) is its own record kind, sent
once per job attempt and joined later, so a per-rank step record stays small.

This module is imported by the SDK, so it uses the standard library only. The store derives its
DDL from these definitions and the collector its validation; nothing else lists the columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum

from .dcgm_fields import DCGM_FIELDS
from .errors import ConfigError

__all__ = [
    "CTX_KEYS",
    "DTYPES",
    "EVENT_KINDS",
    "HEARTBEAT_PHASES",
    "IDENTIFIERS",
    "KINDS",
    "LOG_LEVELS",
    "P0_EVENT_KINDS",
    "WIRE_VERSION",
    "Column",
    "Priority",
    "RecordKind",
]

WIRE_VERSION = 1
"""The wire version this code writes and reads. A batch with any other version is refused."""


class Priority(IntEnum):
    """Under pressure P3 is dropped first and P0 last (never while the spool has room)."""

    P0 = 0  # failure events
    P1 = 1  # run health: step timing, lifecycle, placement
    P2 = 2  # detailed metrics: scalars, collectives, device samples
    P3 = 3  # debug


IDENTIFIERS: dict[str, str] = {
    "tenant": "organisation that owns the data; every record belongs to exactly one",
    "project": "project inside the tenant",
    "experiment_id": "a family of runs compared with each other",
    "run_id": "one training run; survives restarts",
    "job_id": "one scheduler allocation (job attempt) of a run; each restart is a new one",
    "step": "optimizer step number, global across attempts",
    "rank": "global rank in the job's process group",
    "node_id": "host name of the node",
    "gpu": "GPU index on the node (as NVML and DCGM number it)",
    "gpu_uuid": "GPU UUID as NVML reports it",
    "checkpoint_id": "a saved checkpoint",
    "model_id": "a model family",
    "model_version": "a registered version of a model",
    "dataset_version": "content-addressed version of a dataset",
    "evaluation_id": "one evaluation of a model version or checkpoint",
}

CTX_KEYS = ("tenant", "project", "experiment_id", "run_id", "job_id")
"""Identifiers that may travel once per batch instead of once per row."""

DTYPES: dict[str, tuple[str, str, str]] = {
    # name: (array.array typecode, numpy dtype, ClickHouse type)
    "int64": ("q", "<i8", "Int64"),
    "int32": ("i", "<i4", "Int32"),
    "float64": ("d", "<f8", "Float64"),
    "float32": ("f", "<f4", "Float32"),
    "string": ("", "", "LowCardinality(String)"),
}

_NAN = math.nan


@dataclass(frozen=True)
class Column:
    """One column of a record kind. ``default`` fills an optional column a batch left out."""

    name: str
    dtype: str
    doc: str
    required: bool = False
    default: float | int | str | None = None
    codec: str = ""
    low_cardinality: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"column {self.name}: unknown dtype {self.dtype!r}")

    @property
    def fill(self) -> float | int | str:
        if self.default is not None:
            return self.default
        if self.dtype == "string":
            return ""
        if self.dtype.startswith("float"):
            return _NAN
        return 0


@dataclass(frozen=True)
class RecordKind:
    """A kind of record: its wire name, its table, its columns and its default priority."""

    name: str
    table: str
    doc: str
    ctx: tuple[str, ...]
    ctx_required: tuple[str, ...]
    columns: tuple[Column, ...]
    order_by: tuple[str, ...]
    priority: Priority
    engine: str = "MergeTree"
    by_name: dict[str, Column] = field(init=False, repr=False, compare=False)
    column_names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {c.name: c for c in self.columns})
        object.__setattr__(self, "column_names", tuple(c.name for c in self.columns))

    def stored_columns(self) -> tuple[str, ...]:
        """Column order in the table: context identifiers first, then the record's columns."""
        return self.ctx + self.column_names


def _c(name: str, dtype: str, doc: str, **kw: object) -> Column:
    return Column(name, dtype, doc, **kw)  # type: ignore[arg-type]


_RUN_CTX = ("tenant", "project", "run_id", "job_id")
_T = _c("time", "float64", "UNIX time in seconds (the emitting host's clock)", required=True)

STEP = RecordKind(
    name="step",
    table="steps",
    doc="Per-rank timing of one optimizer step. Phases are NaN when not measured.",
    ctx=_RUN_CTX,
    ctx_required=("run_id",),
    columns=(
        _c("step", "int64", "optimizer step", required=True, codec="Delta, ZSTD(1)"),
        _c("rank", "int32", "global rank", required=True),
        _c("time", "float64", "UNIX time at step start, seconds", required=True),
        _c("duration", "float64", "wall time of the step on this rank, seconds", required=True),
        _c("data_wait", "float64", "time waiting for the input pipeline, seconds"),
        _c("forward", "float64", "forward pass, seconds"),
        _c("backward", "float64", "backward pass, seconds"),
        _c("optimizer", "float64", "optimizer step, seconds"),
        _c("comm", "float64", "communication not overlapped with compute, seconds"),
        _c("tokens", "int64", "tokens this rank processed in the step", default=0),
    ),
    order_by=("tenant", "run_id", "step", "rank"),
    priority=Priority.P1,
)

SCALAR = RecordKind(
    name="scalar",
    table="scalars",
    doc="Training scalars of any name (loss, lr, grad_norm, loss_scale, ...).",
    ctx=_RUN_CTX,
    ctx_required=("run_id",),
    columns=(
        _c("step", "int64", "optimizer step", required=True),
        _c("rank", "int32", "rank that logged it", default=0),
        _T,
        _c("name", "string", "scalar name", required=True),
        _c("value", "float64", "value (NaN and Inf are kept: they are signals)", required=True),
    ),
    order_by=("tenant", "run_id", "name", "step", "rank"),
    priority=Priority.P2,
)

COLLECTIVE = RecordKind(
    name="collective",
    table="collectives",
    doc="One collective as one rank saw it: when it entered and when it left.",
    ctx=_RUN_CTX,
    ctx_required=("run_id",),
    columns=(
        _c("step", "int64", "optimizer step", required=True),
        _c("rank", "int32", "global rank", required=True),
        _c("seq", "int64", "sequence number of the collective in its process group", required=True),
        _c(
            "op", "string", "all_reduce, all_gather, reduce_scatter, all_to_all, ...", required=True
        ),
        _c("group", "string", "process group name", default=""),
        _c("enter", "float64", "UNIX time the rank entered, seconds (its clock)", required=True),
        _c("exit", "float64", "UNIX time the rank left, seconds (its clock)", required=True),
        _c("bytes", "int64", "message size in bytes", default=0),
    ),
    order_by=("tenant", "run_id", "step", "seq", "rank"),
    priority=Priority.P2,
)

GPU = RecordKind(
    name="gpu",
    table="gpu_samples",
    doc="A device sample under DCGM field names (see DCGM_FIELDS); NaN where not sampled.",
    ctx=("tenant",),
    ctx_required=(),
    columns=(
        _T,
        _c("node_id", "string", "host name", required=True),
        _c("gpu", "int32", "GPU index on the node", required=True),
        _c("gpu_uuid", "string", "GPU UUID", default=""),
        *(_c(col, "float64", f"{dcgm}") for col, dcgm in DCGM_FIELDS.items()),
    ),
    order_by=("tenant", "node_id", "gpu", "time"),
    priority=Priority.P2,
)

NODE = RecordKind(
    name="node",
    table="node_samples",
    doc="A host sample: CPU, memory, disk, network and InfiniBand counters.",
    ctx=("tenant",),
    ctx_required=(),
    columns=(
        _T,
        _c("node_id", "string", "host name", required=True),
        _c("cpu_util", "float64", "CPU busy fraction 0..1"),
        _c("load1", "float64", "1-minute load average"),
        _c("mem_used_bytes", "float64", "host memory in use"),
        _c("mem_total_bytes", "float64", "host memory installed"),
        _c("disk_read_bytes", "float64", "cumulative bytes read"),
        _c("disk_write_bytes", "float64", "cumulative bytes written"),
        _c("net_rx_bytes", "float64", "cumulative bytes received"),
        _c("net_tx_bytes", "float64", "cumulative bytes sent"),
        _c("nic_errors", "float64", "cumulative NIC errors and drops"),
        _c("tcp_retransmits", "float64", "cumulative TCP retransmitted segments"),
        _c("ib_tx_bytes", "float64", "cumulative InfiniBand/RoCE bytes sent, all ports"),
        _c("ib_rx_bytes", "float64", "cumulative InfiniBand/RoCE bytes received, all ports"),
        _c(
            "ib_errors",
            "float64",
            "cumulative InfiniBand port errors (symbol, receive, link "
            "recovery, link downed, discards, integrity, overrun)",
        ),
        _c(
            "rdma_retries",
            "float64",
            "cumulative RDMA retries (ack timeouts, RNR NAK retries, sequence errors)",
        ),
    ),
    order_by=("tenant", "node_id", "time"),
    priority=Priority.P2,
)

EVENT_KINDS: dict[str, str] = {
    "job_start": "a job attempt started (processes launched)",
    "gang_complete": "every rank of the job is up",
    "first_step": "the first step of the attempt began",
    "checkpoint_begin": "a checkpoint save began",
    "checkpoint_end": "a checkpoint save ended (attrs: duration_s, size_bytes, sync, ok)",
    "checkpoint_load": "a checkpoint was loaded (attrs: step, duration)",
    "data_shard": "a rank began reading a dataset shard (attrs: shard, version)",
    "failure": "the job attempt failed",
    "restart": "the run restarted from a checkpoint",
    "preemption": "the scheduler preempted the job",
    "drain": "a node was drained or cordoned",
    "remediation": "a phase of a remediation action (attrs: action, phase, duration, category)",
    "maintenance": "planned maintenance took capacity",
    "hardware_fault": "a device or host fault (attrs: xid, ecc, ...)",
    "nan": "a NaN or Inf appeared in loss or gradients",
    "oom": "out of device memory",
    "hang": "no progress",
    "config_change": "a configuration value changed (attrs: key, old, new)",
    "exception": "an exception left the training loop",
    "signal": "the process received a fatal signal",
    "finish": "the run ended normally",
    "custom": "anything else; put details in attrs",
}

P0_EVENT_KINDS = frozenset(
    {"failure", "hardware_fault", "nan", "oom", "hang", "exception", "signal", "preemption"}
)

EVENT = RecordKind(
    name="event",
    table="events",
    doc="Lifecycle and fault events of a run (kinds in EVENT_KINDS).",
    ctx=_RUN_CTX,
    ctx_required=("run_id",),
    columns=(
        _T,
        _c("kind", "string", "one of EVENT_KINDS", required=True),
        _c("step", "int64", "step it happened at, -1 if none", default=-1),
        _c("rank", "int32", "rank it happened on, -1 if all or none", default=-1),
        _c("node_id", "string", "node, if one", default=""),
        _c("gpu", "int32", "GPU index, -1 if none", default=-1),
        _c("message", "string", "human-readable detail", default="", low_cardinality=False),
        _c("attrs", "string", "JSON object with details", default="{}", low_cardinality=False),
    ),
    order_by=("tenant", "run_id", "time"),
    priority=Priority.P1,
)

PLACEMENT = RecordKind(
    name="placement",
    table="placement",
    doc="Where a rank ran in one job attempt; recorded once and joined later.",
    ctx=_RUN_CTX,
    ctx_required=("run_id",),
    columns=(
        _T,
        _c("rank", "int32", "global rank", required=True),
        _c("local_rank", "int32", "rank on the node", default=-1),
        _c("world_size", "int32", "ranks in the job", default=0),
        _c("node_id", "string", "host name", required=True),
        _c("gpu", "int32", "GPU index, -1 on CPU", default=-1),
        _c("gpu_uuid", "string", "GPU UUID", default=""),
        _c("rack", "string", "rack", default=""),
        _c("switch", "string", "leaf switch", default=""),
        _c("nvlink_domain", "string", "NVLink domain", default=""),
    ),
    order_by=("tenant", "run_id", "job_id", "rank"),
    priority=Priority.P1,
    engine="ReplacingMergeTree(time)",
)

SCHED_ALLOC = RecordKind(
    name="sched_alloc",
    table="sched_allocations",
    doc="A scheduler allocation: submit, start, gang complete, release (NaN if not yet).",
    ctx=("tenant",),
    ctx_required=(),
    columns=(
        _c("pool", "string", "pool or partition", required=True),
        _c("job_id", "string", "scheduler job id", required=True),
        _c("run_id", "string", "run it belongs to, if known", default=""),
        _c("gpus", "int32", "GPUs requested", required=True),
        _c("submit", "float64", "UNIX time submitted", required=True),
        _c("start", "float64", "UNIX time the allocation began"),
        _c("gang_complete", "float64", "UNIX time every GPU of the gang was held"),
        _c("end", "float64", "UNIX time released"),
        _c("state", "string", "COMPLETED, FAILED, CANCELLED, PREEMPTED, RUNNING, ...", default=""),
    ),
    order_by=("tenant", "pool", "submit", "job_id"),
    priority=Priority.P1,
    engine="ReplacingMergeTree",
)

SCHED_POOL = RecordKind(
    name="sched_pool",
    table="sched_pool",
    doc="Capacity of a pool over time: installed and in-service GPUs.",
    ctx=("tenant",),
    ctx_required=(),
    columns=(
        _c("pool", "string", "pool or partition", required=True),
        _T,
        _c("capacity_gpus", "int32", "GPUs installed", required=True),
        _c("in_service_gpus", "int32", "GPUs in service (not down or drained)", required=True),
    ),
    order_by=("tenant", "pool", "time"),
    priority=Priority.P1,
)

TRACE_STEP = RecordKind(
    name="trace_step",
    table="trace_steps",
    doc="One rank's step as a profiler (Kineto) trace saw it on the device: where its time went.",
    ctx=_RUN_CTX,
    ctx_required=("run_id",),
    columns=(
        _c("step", "int64", "optimizer step (ProfilerStep#N)", required=True),
        _c("rank", "int32", "global rank", required=True),
        _c("time", "float64", "UNIX time at step start, seconds (trace clock)", required=True),
        _c("duration", "float64", "step wall time, seconds", required=True),
        _c("compute", "float64", "device time in compute kernels, seconds (union)"),
        _c("comm", "float64", "device time in communication kernels, seconds (union)"),
        _c("exposed_comm", "float64", "communication not overlapped by compute, seconds"),
        _c("overlap", "float64", "communication overlapped by compute, seconds"),
        _c("memcpy", "float64", "memory copies and sets not under compute or comm, seconds"),
        _c("idle", "float64", "device idle within the step, seconds"),
        _c("kernels", "int64", "device kernels launched in the step", default=0),
        _c("source", "string", "trace file it came from", default=""),
    ),
    order_by=("tenant", "run_id", "step", "rank"),
    priority=Priority.P3,
)

TRACE_KERNEL = RecordKind(
    name="trace_kernel",
    table="trace_kernels",
    doc="The heaviest device kernels of one rank's step in a profiler (Kineto) trace: the ten "
    "with the most device time, by name.",
    ctx=_RUN_CTX,
    ctx_required=("run_id",),
    columns=(
        _c("step", "int64", "optimizer step (ProfilerStep#N)", required=True),
        _c("rank", "int32", "global rank", required=True),
        _c("time", "float64", "UNIX time at step start, seconds (trace clock)", required=True),
        _c("name", "string", "kernel name (first 200 characters)", required=True),
        _c("category", "string", "compute, comm, memcpy or other", default=""),
        _c("calls", "int64", "launches of the kernel in the step", default=0),
        _c("total", "float64", "device time of those launches, seconds (summed)", required=True),
        _c("source", "string", "trace file it came from", default=""),
    ),
    order_by=("tenant", "run_id", "step", "rank"),
    priority=Priority.P3,
)

HEARTBEAT_PHASES = (
    "idle",
    "step",
    "data",
    "forward",
    "backward",
    "optimizer",
    "comm",
    "checkpoint",
)
"""Where a rank is: between steps (``idle``, after step ``step``), inside step ``step`` (``step``
or the phase it is timing), or saving a checkpoint."""

HEARTBEAT = RecordKind(
    name="heartbeat",
    table="heartbeats",
    doc="A live rank's position, sent while the process runs even when no step completes: the "
    "run's own clock, and who stopped moving. Only the newest per rank is kept.",
    ctx=_RUN_CTX,
    ctx_required=("run_id",),
    columns=(
        _c("time", "float64", "UNIX time the heartbeat was taken, seconds", required=True),
        _c("rank", "int32", "global rank", required=True),
        _c(
            "step",
            "int64",
            "the step the rank is in, or (idle) the last one it finished",
            default=-1,
        ),
        _c("phase", "string", "one of HEARTBEAT_PHASES", default="idle"),
        _c("since", "float64", "UNIX time the rank reached this step and phase", required=True),
    ),
    order_by=("tenant", "run_id", "job_id", "rank"),
    priority=Priority.P1,
    engine="ReplacingMergeTree(time)",
)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""A log line's level: the Python logging record's, ``INFO`` for a line of stdout and ``ERROR``
for one of stderr (where tracebacks go)."""

LOG = RecordKind(
    name="log",
    table="logs",
    doc="A line a rank wrote (a Python logging record, a line of its stdout or stderr) with the "
    "step it was at: searchable by run, rank and step.",
    ctx=_RUN_CTX,
    ctx_required=("run_id",),
    columns=(
        _T,
        _c("rank", "int32", "global rank", required=True),
        _c(
            "step",
            "int64",
            "the step the rank was in, or (between steps) the last one it finished; -1 before",
            default=-1,
        ),
        _c("level", "string", "one of LOG_LEVELS", default="INFO"),
        _c("source", "string", "the logger's name, or stdout or stderr", default=""),
        _c("message", "string", "the line, at most 2,000 characters", required=True),
    ),
    order_by=("tenant", "run_id", "time", "rank"),
    priority=Priority.P3,
)

KINDS: dict[str, RecordKind] = {
    k.name: k
    for k in (
        STEP,
        SCALAR,
        COLLECTIVE,
        GPU,
        NODE,
        EVENT,
        PLACEMENT,
        SCHED_ALLOC,
        SCHED_POOL,
        TRACE_STEP,
        TRACE_KERNEL,
        HEARTBEAT,
        LOG,
    )
}
