"""End-to-end ingest rate: batches -> HTTP -> durable in the embedded store.

Bulk: batches of 200k rank-step rows, compared in the same run and on the same machine with a
direct bulk insert of the same rows into the same engine (no HTTP, no decoding). Keys:
rows_per_s, direct_rows_per_s, ratio. Goal: at least 1,000,000 rows/s end to end and at least a
quarter of the direct rate.

SDK-shaped: what real ranks send, one request per flush: the bodies are made by real SDK runs
(their own encoder, gzip and headers; one step with 4 phases and 10 scalars per flush, one run per
rank) and posted over ``--sdk-connections`` concurrent connections, as many ranks do. Keys:
sdk_shaped_rows_per_s, sdk_shaped_requests_per_s; the bulk rate is the ceiling beside it.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, start_server, stop_server

import fleetlens
from fleetlens.collector.decode import decode_batch
from fleetlens.sdk.transport import Ack
from fleetlens.wire import TableBuilder, encode_batch

Body = tuple[bytes, dict[str, str]]


def make_batches(total_rows: int, rows_per_batch: int, ranks: int) -> list[bytes]:
    bodies = []
    rng = np.random.default_rng(0)
    steps_per_batch = rows_per_batch // ranks
    for b in range(total_rows // rows_per_batch):
        first = b * steps_per_batch
        step = np.repeat(np.arange(first, first + steps_per_batch, dtype="<i8"), ranks)
        rank = np.tile(np.arange(ranks, dtype="<i4"), steps_per_batch)
        dur = 0.4 + 0.012 * rng.standard_normal(len(step))
        t = 1.7e9 + step * 0.5
        tb = TableBuilder("step")
        tb.add_packed("step", step.tobytes()).add_packed("rank", rank.tobytes())
        tb.add_packed("time", t.astype("<f8").tobytes())
        tb.add_packed("duration", dur.astype("<f8").tobytes())
        tb.add_packed("data_wait", np.abs(0.01 * rng.standard_normal(len(step))).tobytes())
        tb.add_packed("comm", np.full(len(step), 0.05).tobytes())
        tb.add_packed("tokens", np.full(len(step), 4096, dtype="<i8").tobytes())
        _, body = encode_batch({"step": tb.build()}, {"run_id": "bench", "job_id": "a0"})
        bodies.append(body)
    return bodies


class _Capture:
    """A transport that keeps what the SDK would send: its bodies and headers."""

    def __init__(self) -> None:
        self.sent: list[Body] = []

    def send(self, body: bytes, headers: dict[str, str]) -> Ack | None:
        self.sent.append((body, dict(headers)))
        return Ack()


def sdk_bodies(ranks: int, flushes: int, spool: str) -> list[Body]:
    """Requests as real SDK runs make them: one run per rank, one flush per step."""
    out: list[Body] = []
    scalars = {f"metric_{k}": 0.1 * k for k in range(10)}
    for r in range(ranks):
        capture = _Capture()
        run = fleetlens.init(
            project="bench", run_id="sdk-shaped", job_id="a0", server="http://127.0.0.1:9",
            rank=r, world_size=ranks, spool_dir=f"{spool}/{r}", install_signal_handler=False,
            transport=capture,
        )  # fmt: skip
        for k in range(flushes):
            phases = {"data": 0.02, "forward": 0.3, "backward": 0.45, "optimizer": 0.05}
            run.record_step(k, time=1.7e9 + k, duration=0.9, tokens=4096, phases=phases)
            run.log(k, **scalars)
            run.flush(timeout=5)
        run.finish()
        out += capture.sent
    return out


def _rows(body: bytes) -> int:
    raw = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body
    return sum(n for n, _ in decode_batch(raw).tables.values())


def post_all(url: str, bodies: Iterable[Body], connections: int) -> float:
    """Post every body over ``connections`` concurrent connections, each taking the next body when
    it is free (``bodies`` may be a generator: a bench can stream more than fits in memory);
    a 429 or 503 is retried after its Retry-After / 10. Returns the seconds it took."""
    u = urllib.parse.urlparse(url)
    queue = enumerate(bodies)
    lock = threading.Lock()
    errors: list[str] = []

    def worker() -> None:
        try:
            send(http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=120))
        except Exception as e:  # a body that could not be made or sent stops the run, named
            errors.append(repr(e))

    def send(conn: http.client.HTTPConnection) -> None:
        while not errors:
            with lock:
                item = next(queue, None)
            if item is None:
                break
            i, (body, headers) = item
            while True:
                conn.request("POST", "/v1/ingest", body, headers)
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    break
                if resp.status in (429, 503):
                    time.sleep(float(resp.getheader("Retry-After") or 0.1) / 10)
                    continue
                errors.append(f"batch {i}: HTTP {resp.status}")
                break
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError("; ".join(errors[:5]))
    return elapsed


def direct_insert(data_dir: str, bodies: list[bytes]) -> float:
    from fleetlens.store.chdb_store import ChdbStore
    from fleetlens.store.telemetry import batch_tables

    store = ChdbStore(data_dir)
    prepared = []
    for body in bodies:
        batch = decode_batch(body)
        prepared.append((batch, batch_tables(batch)))
    try:
        t0 = time.perf_counter()
        for batch, tables in prepared:
            for kind, table in tables.items():
                store.insert(kind, table, dict(batch.ctx, tenant="default"), batch.batch_id)
        return time.perf_counter() - t0
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small run for CI")
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--batch-rows", type=int, default=200_000)
    ap.add_argument("--connections", type=int, default=2)
    ap.add_argument("--sdk-ranks", type=int, default=128)
    ap.add_argument("--sdk-flushes", type=int, default=16)
    ap.add_argument("--sdk-connections", type=int, default=32)
    args = ap.parse_args()
    rows = 600_000 if args.quick else args.rows
    ranks = 1024
    batch_rows = (args.batch_rows // ranks) * ranks
    bodies = make_batches(rows, batch_rows, ranks)
    rows = len(bodies) * batch_rows
    mb = sum(len(b) for b in bodies) / 1e6
    print(f"{len(bodies)} batches of {batch_rows} rank-step rows, {mb:.0f} MB", file=sys.stderr)
    sdk_ranks, flushes = (32, 8) if args.quick else (args.sdk_ranks, args.sdk_flushes)
    headers = {"Content-Type": "application/msgpack"}
    with tempfile.TemporaryDirectory() as tmp:
        small = sdk_bodies(sdk_ranks, flushes, f"{tmp}/spool")
        small_rows = sum(_rows(b) for b, _ in small)
        proc, url = start_server(f"{tmp}/server")
        try:
            post_all(url, [(bodies[0], headers)], 1)  # warm up: first insert creates parts
            e2e = post_all(url, [(b, headers) for b in bodies[1:]], args.connections)
            e2e_small = post_all(url, small, args.sdk_connections)
        finally:
            stop_server(proc)
        direct = direct_insert(f"{tmp}/direct", bodies[1:])
    measured = rows - batch_rows
    rows_per_s = measured / e2e
    direct_rows_per_s = measured / direct
    print(
        f"end to end {rows_per_s:,.0f} rows/s; direct insert {direct_rows_per_s:,.0f} rows/s; "
        f"SDK-shaped {small_rows / e2e_small:,.0f} rows/s in {len(small) / e2e_small:,.0f} "
        f"requests/s ({len(small)} requests of {small_rows / len(small):.1f} rows)",
        file=sys.stderr,
    )
    emit(
        {
            "rows_per_s": round(rows_per_s),
            "direct_rows_per_s": round(direct_rows_per_s),
            "ratio": round(rows_per_s / direct_rows_per_s, 3),
            "rows": measured,
            "batch_rows": batch_rows,
            "connections": args.connections,
            "sdk_shaped_rows_per_s": round(small_rows / e2e_small),
            "sdk_shaped_requests_per_s": round(len(small) / e2e_small, 1),
            "sdk_shaped_rows_per_request": round(small_rows / len(small), 1),
            "sdk_connections": args.sdk_connections,
            "goal_rows_per_s": 1_000_000,
            "ok": rows_per_s >= 1_000_000 and rows_per_s / direct_rows_per_s >= 0.25,
        }
    )


if __name__ == "__main__":
    main()
