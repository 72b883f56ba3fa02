"""A lean reader of PyTorch profiler (Kineto) traces: Chrome-trace JSON, gzipped or not.

The whole file is decoded in one pass by msgspec into typed structs that declare only the fields
used here (name, category, phase, thread, time, duration and a handful of ``args``); everything
else in an event (input shapes, strides, flows' payloads, ``deviceProperties``) is
skipped by the decoder without building Python objects. The events are then turned into a few
numpy arrays, so a 100k-event trace costs tens of megabytes, not hundreds.

What comes out (:class:`KinetoTrace`), with times in microseconds on the trace's own clock:

* ``steps``: the ``ProfilerStep#N`` annotations on the CPU side (N, start, duration);
* ``device``: activity on the GPU: kernels, memory copies and sets, each classified as compute,
  communication, memory or other the way Holistic Trace Analysis (HTA) classifies them, with
  the CPU time of the call that launched it (joined on ``correlation``);
* ``comm_ops``: the CPU-side collective calls (``c10d::*``, ``nccl:*``, ``gloo:*``,
  ``record_param_comms``) used to name and size the collectives;
* ``groups``: the process groups the rank belongs to (``distributedInfo.pg_config``: each
  one's description and ranks), from which the job's parallel layout is read.

``to_unix(ts)`` turns a trace time into UNIX seconds: ``baseTimeNanoseconds`` + ts when the trace
has it (newer Kineto writes times relative to that base), the time itself when it already looks
like UNIX microseconds (older Kineto), and otherwise the trace-relative time (``clock ==
"trace"``): seconds since the profiler's own origin, which the importer reports.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from ..errors import TraceFormatError, TraceTooLarge

__all__ = [
    "COMM",
    "COMPUTE",
    "MEMORY",
    "OTHER",
    "DeviceEvents",
    "KinetoTrace",
    "TraceFormatError",
    "classify_kernel",
    "read_trace",
]

COMPUTE, COMM, MEMORY, OTHER = 0, 1, 2, 3
"""Device activity classes (the ``kind`` column of :class:`DeviceEvents`)."""

# HTA's rules (hta/utils/utils.py): communication = ^nccl.*Kernel, memory = ^Memcpy|^Memset|^dma,
# compute = none of those and not NCCL_COMPUTE_KERNEL_RE (names with Memcpy or Sync: "other").
_NCCL_KERNEL = re.compile(r"^nccl.*Kernel")
_MEMORY_KERNEL = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_COMM_OP_PREFIXES = ("c10d::", "nccl:", "gloo:", "record_param_comms")
# UNIX time in microseconds is past 1e15 since September 2001; trace-relative clocks are not.
_UNIX_US_THRESHOLD = 1e15

_Num = int | float | str | None


class _Args(msgspec.Struct):
    stream: _Num = None
    correlation: _Num = None
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: _Num = msgspec.field(default=None, name="In msg nelems")
    dtype: str | None = None
    pg_name: _Num = msgspec.field(default=None, name="Process Group Name")
    group_size: _Num = msgspec.field(default=None, name="Group size")


class _Event(msgspec.Struct):
    ph: str = ""
    cat: str | None = None
    name: str = ""
    tid: int | str = 0
    ts: float | str = 0.0
    dur: float | str = 0.0
    args: _Args | None = None


class _PgConfig(msgspec.Struct):
    pg_desc: str = ""
    ranks: list[int] | str = []  # a string ("all" in some releases) when the group is the world


class _DistInfo(msgspec.Struct):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: list[_PgConfig] | None = None


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] = []
    distributedInfo: _DistInfo | None = None
    baseTimeNanoseconds: _Num = None


_DECODER = msgspec.json.Decoder(_Trace)


def classify_kernel(name: str, cat: str) -> int:
    """COMPUTE, COMM, MEMORY or OTHER for one device event, by HTA's name rules."""
    if _NCCL_KERNEL.match(name):
        return COMM
    if cat in ("gpu_memcpy", "gpu_memset") or _MEMORY_KERNEL.match(name):
        return MEMORY
    if _NOT_COMPUTE.match(name):
        return OTHER
    return COMPUTE


@dataclass
class DeviceEvents:
    """Device activity, one entry per kernel / copy / set, sorted by start."""

    start: np.ndarray  # float64 us
    end: np.ndarray  # float64 us
    kind: np.ndarray  # int8: COMPUTE, COMM, MEMORY, OTHER
    launch: np.ndarray  # float64 us: CPU time of the launching call; NaN when not found
    launch_tid: list[int | str]
    names: list[str]
    coll: list[str | None]  # "Collective name" on the kernel (newer traces)
    nelems: np.ndarray  # int64, -1 when unknown
    dtype: list[str | None]
    group: list[str | None]

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class CommOp:
    """A CPU-side collective call: its name, thread and span, and what it says about itself."""

    name: str
    tid: int | str
    start: float
    end: float
    coll: str | None
    nelems: int
    dtype: str | None
    group: str | None


@dataclass
class KinetoTrace:
    path: str
    rank: int | None
    world_size: int | None
    backend: str | None
    base_ns: int | None
    steps: np.ndarray  # int64 step numbers, sorted by start
    step_start: np.ndarray  # float64 us
    step_dur: np.ndarray  # float64 us
    device: DeviceEvents
    comm_ops: list[CommOp]
    events: int
    groups: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (description, ranks) of its groups

    @property
    def clock(self) -> str:
        """``unix`` when times convert to UNIX time, ``trace`` when they are trace-relative."""
        if self.base_ns is not None:
            return "unix"
        first = float(self.step_start[0]) if len(self.step_start) else 0.0
        if not first and len(self.device):
            first = float(self.device.start[0])
        return "unix" if first >= _UNIX_US_THRESHOLD else "trace"

    def to_unix(self, ts_us: np.ndarray) -> np.ndarray:
        """Trace times (us) to UNIX seconds; trace-relative seconds when ``clock == 'trace'``."""
        base = (self.base_ns or 0) / 1e9
        return base + np.asarray(ts_us, dtype=np.float64) / 1e6


def _num(v: _Num, what: str, path: str) -> float:
    if v is None:
        return float("nan")
    try:
        return float(v)
    except ValueError:
        raise TraceFormatError(f"{path}: {what} {v!r} is not a number") from None


def _int_or(v: _Num, default: int) -> int:
    if v is None:
        return default
    try:
        return int(v)
    except ValueError:
        return default


def _str_or_none(v: _Num) -> str | None:
    return None if v is None else str(v)


def read_bytes(path: str | Path, max_bytes: int | None = None) -> bytes:
    """The file's bytes, decompressed when gzip; TraceTooLarge past ``max_bytes`` (checked as
    it decompresses: a small file cannot make a large buffer)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace {p}: {exc.strerror}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw) if max_bytes is None else _gunzip(raw, max_bytes)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"{p}: corrupt gzip ({exc})") from exc
    if max_bytes is not None and len(raw) > max_bytes:
        raise TraceTooLarge(f"{p}: the trace is over {max_bytes} bytes decompressed")
    return raw


def _gunzip(raw: bytes, max_bytes: int) -> bytes:
    """Every gzip member of ``raw``, stopping past ``max_bytes`` of output."""
    out: list[bytes] = []
    size = 0
    while raw:
        d = zlib.decompressobj(wbits=31)
        chunk = d.decompress(raw, max_bytes + 1 - size)
        size += len(chunk)
        out.append(chunk)
        if size > max_bytes or d.unconsumed_tail:
            raise TraceTooLarge(f"the trace is over {max_bytes} bytes decompressed")
        if not d.eof:
            raise TraceFormatError("a truncated gzip stream")
        raw = d.unused_data
    return b"".join(out)


def read_trace(path: str | Path, max_bytes: int | None = None) -> KinetoTrace:
    """Read one Kineto trace file (``.json`` or ``.json.gz``), at most ``max_bytes`` of JSON."""
    p = str(path)
    raw = read_bytes(path, max_bytes)
    try:
        doc = _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(
            f"{p}: not a Kineto trace this reader understands ({exc}); expected a Chrome-trace "
            "JSON object with `traceEvents`"
        ) from exc
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{p}: not valid JSON ({exc})") from exc
    del raw
    return _index(p, doc)


def _index(path: str, doc: _Trace) -> KinetoTrace:
    steps: dict[int, tuple[float, float]] = {}
    dev: list[tuple[float, float, int, _Event]] = []
    launches: dict[int, tuple[float, int | str]] = {}
    comm_ops: list[CommOp] = []
    for ev in doc.traceEvents:
        if ev.ph != "X":
            continue
        cat = (ev.cat or "").lower()
        if cat in _DEVICE_CATS:
            ts = _num(ev.ts, "ts", path)
            dev.append((ts, ts + _num(ev.dur, "dur", path), classify_kernel(ev.name, cat), ev))
            continue
        if cat == "gpu_user_annotation":
            continue  # a range drawn on the GPU timeline, not activity
        name = ev.name
        if name.startswith("ProfilerStep"):
            m = _STEP.match(name)
            if m and int(m.group(1)) not in steps:
                steps[int(m.group(1))] = (_num(ev.ts, "ts", path), _num(ev.dur, "dur", path))
            continue
        a = ev.args
        if a is not None and a.correlation is not None and cat in ("cuda_runtime", "cuda_driver"):
            corr = _int_or(a.correlation, -1)
            if corr >= 0:
                launches[corr] = (_num(ev.ts, "ts", path), ev.tid)
        if name.startswith(_COMM_OP_PREFIXES):
            ts = _num(ev.ts, "ts", path)
            comm_ops.append(
                CommOp(
                    name=name,
                    tid=ev.tid,
                    start=ts,
                    end=ts + _num(ev.dur, "dur", path),
                    coll=a.collective if a else None,
                    nelems=_int_or(a.in_nelems, -1) if a else -1,
                    dtype=a.dtype if a else None,
                    group=_str_or_none(a.pg_name) if a else None,
                )
            )
    dev.sort(key=lambda d: d[0])
    n = len(dev)
    launch = np.full(n, np.nan)
    launch_tid: list[int | str] = [0] * n
    for i, (_, _, _, ev) in enumerate(dev):
        a = ev.args
        if a is not None and a.correlation is not None:
            hit = launches.get(_int_or(a.correlation, -1))
            if hit is not None:
                launch[i], launch_tid[i] = hit
    device = DeviceEvents(
        start=np.fromiter((d[0] for d in dev), np.float64, n),
        end=np.fromiter((d[1] for d in dev), np.float64, n),
        kind=np.fromiter((d[2] for d in dev), np.int8, n),
        launch=launch,
        launch_tid=launch_tid,
        names=[d[3].name for d in dev],
        coll=[d[3].args.collective if d[3].args else None for d in dev],
        nelems=np.fromiter(
            (_int_or(d[3].args.in_nelems, -1) if d[3].args else -1 for d in dev), np.int64, n
        ),
        dtype=[d[3].args.dtype if d[3].args else None for d in dev],
        group=[_str_or_none(d[3].args.pg_name) if d[3].args else None for d in dev],
    )
    order = sorted(steps, key=lambda s: steps[s][0])
    info = doc.distributedInfo
    base = doc.baseTimeNanoseconds
    return KinetoTrace(
        path=path,
        rank=info.rank if info else None,
        world_size=info.world_size if info else None,
        backend=info.backend if info else None,
        base_ns=_int_or(base, 0) or None,
        steps=np.array(order, dtype=np.int64),
        step_start=np.array([steps[s][0] for s in order], dtype=np.float64),
        step_dur=np.array([steps[s][1] for s in order], dtype=np.float64),
        device=device,
        comm_ops=comm_ops,
        events=len(doc.traceEvents),
        groups=tuple(
            (g.pg_desc, tuple(g.ranks))
            for g in (info.pg_config or [] if info else [])
            if g.pg_desc and isinstance(g.ranks, list)
        ),
    )
