"""The request bodies real producers send, for bench/ingest_cost.py.

:func:`capture` runs a real SDK ``Run`` (``fleetlens.init``, default settings) for a few steps,
each a step record with 4 phases and 10 scalars as bench/fleet_load.py records them, and keeps
the bodies its exporter sends: the first (placement, ``job_start``, heartbeat) and a steady one
(one step row, ten scalar rows). :class:`Bodies` rewrites them per rank and step (the rank,
step and time columns, a new batch id, a rank slowed by 15% from a step on) and encodes them as
the SDK does (MessagePack, gzip level 1, the same headers); :func:`envelope` puts a node's
bodies in one relay request, as :class:`fleetlens.agent.relay.Relay` forwards them.

:func:`remote_write` is the same samples as a Prometheus remote-write request (protobuf,
snappy), one series per figure of a rank-step: the receiver Prometheus measures with.
"""

from __future__ import annotations

import gzip
import struct
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

import fleetlens
from fleetlens.sdk.transport import Ack
from fleetlens.wire import BATCHES_CONTENT_TYPE, Batch, BatchFrame, Table, encode_frames

__all__ = ["PHASES", "SCALARS", "Bodies", "capture", "envelope", "remote_write"]

SCALARS = {f"metric_{k}": 0.1 * k for k in range(10)}
PHASES = {"data": 0.02, "forward": 0.3, "backward": 0.45, "optimizer": 0.05, "comm": 0.1}
_ENC = msgspec.msgpack.Encoder()


class _Capture:
    """A transport that keeps what the exporter sends and acknowledges it."""

    def __init__(self) -> None:
        self.bodies: list[tuple[bytes, dict[str, str]]] = []

    def send(self, body: bytes, headers: dict[str, str]) -> Ack | None:
        self.bodies.append((body, dict(headers)))
        return Ack()

    def close(self) -> None:
        pass


def _decode(body: bytes) -> Batch:
    raw = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body
    return msgspec.msgpack.decode(raw, type=Batch)


def capture(steps: int = 3) -> tuple[Batch, Batch, dict[str, str]]:
    """A real SDK run's first body, a steady body (1 step row, 10 scalars) and its headers."""
    cap = _Capture()
    with tempfile.TemporaryDirectory() as spool:
        run = fleetlens.init(
            project="load", run_id="capture", job_id="a0", server="http://127.0.0.1:9",
            rank=0, local_rank=0, world_size=8, node_id="node-00000", gpu=0,
            spool_dir=spool, install_signal_handler=False, transport=cap,
        )  # fmt: skip
        for k in range(steps):
            now = time.time()
            run.record_step(k, time=now - 0.92, duration=0.92, tokens=4096, phases=PHASES)
            run.log(k, **SCALARS)
            time.sleep(0.7)  # past the exporter's 0.5 s flush
        run.finish()
    batches = [(_decode(b), h) for b, h in cap.bodies]
    first = batches[0][0]
    steady = [(b, h) for b, h in batches if set(b.tables) == {"step", "scalar"}]
    assert steady, f"no steady body among {[sorted(b.tables) for b, _ in batches]}"
    return first, steady[-1][0], steady[-1][1]


def _col(table: Table, name: str, values: np.ndarray[Any, Any]) -> Table:
    cols = dict(table.cols)
    cols[name] = values.tobytes()
    return msgspec.structs.replace(table, cols=cols)


_STEP = np.array([0x5EED5EED5EED0001], "<i8")
_TIME = np.array([1.2345678901234e300], "<f8")
_SCALAR_STEP = np.array([0x5EED5EED5EED0002], "<i8")
_SCALAR_TIME = np.array([2.3456789e300], "<f8")
_BID = "b" * 31 + "x"  # a batch id the encoded bytes hold once
_SENT = 3.4567890123e300


@dataclass
class _Template:
    """A body encoded once with sentinel values, and where each lies in its bytes."""

    raw: bytes
    at: dict[str, list[int]]


def _template(batch: Batch) -> _Template:
    raw = _ENC.encode(batch)
    marks = {
        "step": _STEP.tobytes(), "time": _TIME.tobytes(), "scalar_step": _SCALAR_STEP.tobytes(),
        "scalar_time": _SCALAR_TIME.tobytes(), "bid": _BID.encode(),
        "sent": struct.pack(">d", _SENT),  # msgpack writes a float64 big-endian
    }  # fmt: skip
    at: dict[str, list[int]] = {}
    for name, mark in marks.items():
        i = raw.find(mark)
        while i >= 0:
            at.setdefault(name, []).append(i)
            i = raw.find(mark, i + len(mark))
    return _Template(raw, at)


@dataclass
class Bodies:
    """Bodies of ``run_id`` for each rank and step, as the SDK encodes them (MessagePack, gzip
    level 1, its headers); each encoded once per rank with sentinels, then patched."""

    first: Batch
    steady: Batch
    headers: dict[str, str]
    run_id: str
    world: int
    slow_rank: int = -1
    slow_from: int = 1 << 62

    def __post_init__(self) -> None:
        self._kept: dict[tuple[int, int], _Template] = {}
        self._prefix = uuid.uuid4().hex[:16]
        self._count = 0

    def _finish(self, raw: bytearray, tpl: _Template) -> tuple[bytes, dict[str, str]]:
        self._count += 1
        bid = f"{self._prefix}{self._count:016x}"  # unique, as the SDK's random ids are
        now = time.time()
        for i in tpl.at.get("bid", []):
            raw[i : i + 32] = bid.encode()
        for i in tpl.at.get("sent", []):
            raw[i : i + 8] = struct.pack(">d", now)
        body = gzip.compress(bytes(raw), compresslevel=1)
        headers = {**self.headers, "X-Fleetlens-Batch-Id": bid, "X-Fleetlens-Sent-At": f"{now:.3f}"}
        return body, headers

    def hello(self, rank: int, t: float) -> tuple[bytes, dict[str, str]]:
        """Rank ``rank``'s first body (placement, job start), its times at ``t``."""
        tables = {}
        for kind, table in self.first.tables.items():
            if kind in ("step", "scalar"):  # its first steps: sent as steady bodies
                continue
            n = table.n
            table = _col(table, "time", np.full(n, t, "<f8"))
            if "rank" in table.cols:
                table = _col(table, "rank", np.full(n, rank, "<i4"))
            if kind == "placement":
                table = _col(table, "world_size", np.full(n, self.world, "<i4"))
                table = _col(table, "local_rank", np.full(n, rank % 8, "<i4"))
                table = _col(table, "gpu", np.full(n, rank % 8, "<i4"))
                node = [f"node-{rank // 8:05d}"]
                col = msgspec.structs.replace(table.cols["node_id"], dict=node)
                table = msgspec.structs.replace(table, cols={**table.cols, "node_id": col})
            tables[kind] = table
        batch = msgspec.structs.replace(
            self.first, tables=tables, batch_id=_BID, sent_at=_SENT,
            ctx={**self.first.ctx, "run_id": self.run_id},
        )  # fmt: skip
        tpl = _template(batch)
        return self._finish(bytearray(tpl.raw), tpl)

    def _steady(self, rank: int, slowed: bool) -> _Template:
        """Rank ``rank``'s steady body with sentinels: 15% slower compute for the slow rank once
        ``slowed``, the others waiting as long for it in the all-reduce."""
        key = (rank, int(slowed))
        got = self._kept.get(key)
        if got is not None:
            return got
        slow = 1.15 if slowed and rank == self.slow_rank else 1.0
        compute = {k: PHASES[k] * slow for k in ("forward", "backward", "optimizer")}
        late = 0.15 * sum(PHASES[k] for k in ("forward", "backward", "optimizer"))
        comm = PHASES["comm"] + (late if slowed and rank != self.slow_rank else 0.0)
        dur = PHASES["data"] + sum(compute.values()) + comm
        st = self.steady.tables["step"]
        st = _col(st, "step", _STEP)
        st = _col(st, "rank", np.array([rank], "<i4"))
        st = _col(st, "time", _TIME)
        st = _col(st, "duration", np.array([dur], "<f8"))
        for k, v in compute.items():
            st = _col(st, k, np.array([v], "<f8"))
        st = _col(st, "comm", np.array([comm], "<f8"))
        sc = self.steady.tables["scalar"]
        n = sc.n
        sc = _col(sc, "step", np.repeat(_SCALAR_STEP, n))
        sc = _col(sc, "rank", np.full(n, rank, "<i4"))
        sc = _col(sc, "time", np.repeat(_SCALAR_TIME, n))
        batch = msgspec.structs.replace(
            self.steady, tables={"step": st, "scalar": sc}, batch_id=_BID, sent_at=_SENT,
            ctx={**self.steady.ctx, "run_id": self.run_id},
        )  # fmt: skip
        tpl = self._kept[key] = _template(batch)
        self._dur = dur
        return tpl

    def step(self, rank: int, step: int, t: float) -> tuple[bytes, dict[str, str]]:
        """Rank ``rank``'s body of step ``step``, its scalars logged at ``t``, the step ended
        about then."""
        tpl = self._steady(rank, step >= self.slow_from)
        raw = bytearray(tpl.raw)
        s8, t8 = struct.pack("<q", step), struct.pack("<d", t - 1.0)
        for i in tpl.at["step"]:
            raw[i : i + 8] = s8
        for i in tpl.at["time"]:
            raw[i : i + 8] = t8
        st8 = struct.pack("<d", t)
        for i in tpl.at["scalar_step"]:
            raw[i : i + 8] = s8
        for i in tpl.at["scalar_time"]:
            raw[i : i + 8] = st8
        return self._finish(raw, tpl)


def envelope(
    bodies: list[tuple[bytes, dict[str, str]]],
) -> tuple[bytes, dict[str, str], tuple[BatchFrame, ...]]:
    """A node relay's request carrying ``bodies`` (each as its sender encoded it), and its
    frames."""
    frames = tuple(
        BatchFrame(body=b, type=h["Content-Type"], encoding=h.get("Content-Encoding", ""))
        for b, h in bodies
    )
    return encode_frames(frames), {"Content-Type": BATCHES_CONTENT_TYPE}, frames


# -- Prometheus remote write: protobuf by hand (prompb.WriteRequest), snappy in literals


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _series(labels: list[tuple[str, str]], value: float, ts_ms: int) -> bytes:
    out = b"".join(_field(1, _field(1, k.encode()) + _field(2, v.encode())) for k, v in labels)
    sample = b"\x09" + struct.pack("<d", value) + b"\x10" + _varint(ts_ms)
    return out + _field(2, sample)


def _snappy(raw: bytes) -> bytes:
    """Snappy's block format with every byte a literal: valid, and what a decoder reads."""
    out = bytearray(_varint(len(raw)))
    for i in range(0, len(raw), 60):
        chunk = raw[i : i + 60]
        out.append((len(chunk) - 1) << 2)
        out += chunk
    return bytes(out)


def remote_write(run_id: str, ranks: list[int], step: int, t: float) -> bytes:
    """The rank-steps of ``ranks`` at ``step`` as one remote-write request: per rank a series
    for the step's duration, each phase and each scalar, labelled by run and rank."""
    ts = int(t * 1000)
    figures = {"step_duration_seconds": sum(PHASES.values()), **{
        f"step_{k}_seconds": v for k, v in PHASES.items() if k != "data"}, **SCALARS}  # fmt: skip
    series = b"".join(
        _field(1, _series([("__name__", name), ("rank", str(r)), ("run", run_id)], v, ts))
        for r in ranks
        for name, v in figures.items()
    )
    return _snappy(series)


REMOTE_WRITE_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
