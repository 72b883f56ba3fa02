"""Per-rank collectives from a Kineto trace: one row per communication kernel (or gloo call).

A collective's name, size and process group come from, in order: the kernel's own ``args``
(``Collective name``, ``In msg nelems``, ``dtype``, ``Process Group Name``: newer PyTorch), the
CPU-side call that launched it (``record_param_comms`` carries the same keys; ``c10d::*`` and
``nccl:*`` name it), and last the kernel name (``ncclKernel_AllReduce_RING_LL_Sum_float`` ->
``all_reduce``). ``enter``/``exit`` are the kernel's start and end on the device; ``seq`` numbers
the collectives of one process group in the order the rank issued them (launch time), which is
the order every rank of the group issues them in, so ``seq`` joins one collective across ranks.
When a trace has no communication kernels (a CPU-only gloo trace, or a world of one where NCCL
launches none) the ``gloo:*`` / ``nccl:*`` CPU calls are the collectives and their CPU span is
enter/exit; their size is not known then (``bytes`` 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .breakdown import assign_steps
from .kineto import COMM, CommOp, KinetoTrace

__all__ = ["DTYPE_BYTES", "Collectives", "extract_collectives", "normalize_op"]

DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "bfloat16": 2, "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2,
    "char": 1, "byte": 1, "int8": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "complexfloat": 8, "complexdouble": 16,
}  # fmt: skip

_OPS = {
    "allreduce": "all_reduce",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "allgather": "all_gather",
    "allgatherintotensor": "all_gather",
    "allgatherintotensorcoalesced": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescattertensor": "reduce_scatter",
    "reducescattertensorcoalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "send_recv",
    "send": "send",
    "recv": "recv",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
}
_KERNEL_OP = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")


def normalize_op(name: str) -> str:
    """``c10d::_allgather_base_``, ``nccl:all_gather``, ``allgather`` -> ``all_gather``."""
    base = name.rsplit("::", 1)[-1].rsplit(":", 1)[-1].lower()
    key = base.replace("_", "")
    key = key.removesuffix("base")
    return _OPS.get(key, base.strip("_") or name)


def _kernel_op(name: str) -> str:
    m = _KERNEL_OP.match(name)
    return normalize_op(m.group(1)) if m else name.split("(", 1)[0]


def _nbytes(nelems: int, dtype: str | None) -> int:
    if nelems < 0 or not dtype:
        return 0
    size = DTYPE_BYTES.get(dtype.lower().removeprefix("c10::"))
    return nelems * size if size else 0


@dataclass
class Collectives:
    """Columns of the ``collective`` table for one rank; times in trace microseconds."""

    step: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    op: list[str] = field(default_factory=list)
    group: list[str] = field(default_factory=list)
    enter: list[float] = field(default_factory=list)
    exit: list[float] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    unattributed: int = 0  # collectives outside every ProfilerStep window (not stored)

    def __len__(self) -> int:
        return len(self.step)


class _OpIndex:
    """CPU collective calls per thread, to find the ones enclosing a kernel's launch."""

    def __init__(self, ops: list[CommOp]) -> None:
        by_tid: dict[int | str, list[CommOp]] = {}
        for op in ops:
            by_tid.setdefault(op.tid, []).append(op)
        self.ops = {t: sorted(v, key=lambda o: o.start) for t, v in by_tid.items()}
        self.starts = {t: np.array([o.start for o in v]) for t, v in self.ops.items()}

    def enclosing(self, tid: int | str, ts: float) -> list[CommOp]:
        """Calls on ``tid`` whose span holds ``ts``, innermost (latest start) first."""
        starts = self.starts.get(tid)
        if starts is None:
            return []
        i = int(np.searchsorted(starts, ts, side="right"))
        ops = self.ops[tid]
        return [ops[j] for j in range(i - 1, max(i - 16, -1), -1) if ops[j].end >= ts]


def extract_collectives(trace: KinetoTrace) -> Collectives:
    d = trace.device
    rows: list[tuple[float, int, str, str, float, float, int]] = []  # order, step, op, group, ...
    comm_idx = np.flatnonzero(d.kind == COMM)
    if len(comm_idx):
        index = _OpIndex(trace.comm_ops)
        order_t = np.where(np.isnan(d.launch), d.start, d.launch)
        step_idx = assign_steps(order_t, trace.step_start, trace.step_dur)
        for i in comm_idx:
            coll, nelems, dtype, group = d.coll[i], int(d.nelems[i]), d.dtype[i], d.group[i]
            named: str | None = None
            if not np.isnan(d.launch[i]):
                for op in index.enclosing(d.launch_tid[i], float(d.launch[i])):
                    if op.coll and coll is None:
                        coll, nelems, dtype = op.coll, op.nelems, op.dtype
                    if op.group is not None and group is None:
                        group = op.group
                    if named is None and not op.name.startswith("record_param_comms"):
                        named = op.name
            label = coll or named
            op_name = normalize_op(label) if label else _kernel_op(d.names[i])
            rows.append(
                (
                    float(order_t[i]),
                    int(step_idx[i]),
                    op_name,
                    group or "",
                    float(d.start[i]),
                    float(d.end[i]),
                    _nbytes(nelems, dtype),
                )
            )
    else:
        # No communication kernels: a CPU-only (gloo) trace, or a world of one where NCCL
        # launches nothing. The CPU calls are the collectives, their CPU span enter/exit.
        calls = [o for o in trace.comm_ops if o.name.startswith(("gloo:", "nccl:"))]
        t = np.array([o.start for o in calls])
        step_idx = assign_steps(t, trace.step_start, trace.step_dur)
        for o, s in zip(calls, step_idx, strict=False):
            rows.append((o.start, int(s), normalize_op(o.name), o.group or "", o.start, o.end, 0))
    rows.sort(key=lambda r: r[0])
    out = Collectives()
    seq: dict[str, int] = {}
    for _, s, op_name, group, enter, exit_, nbytes in rows:
        n = seq.get(group, 0)
        seq[group] = n + 1
        if s < 0:
            out.unattributed += 1
            continue
        out.step.append(int(trace.steps[s]))
        out.seq.append(n)
        out.op.append(op_name)
        out.group.append(group)
        out.enter.append(enter)
        out.exit.append(exit_)
        out.bytes.append(nbytes)
    return out
