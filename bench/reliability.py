"""Nothing lost and nothing stuck (issue 38): crashes, bombs, an unwritable spool, wide runs and
slow clients against a real ``fleetlens serve``, each probe on a server of its own.

Keys (goal in brackets):
  acked_lost                  batches answered 200 and not stored after a SIGKILL mid-stream [0]
  duplicates                  batches stored twice once every batch is sent again [0]
  restart_after_kill_s_max    SIGKILL inside a 200,000-row insert, then seconds until the
                              restarted server answers /healthz [< 30]
  sdk_spool_unwritable_lost   steps an SDK job lost through an outage with a spool it cannot
                              write (within its memory bound) [0]
  peak_rss_mb                 the server's peak resident memory under every bomb: JSON bodies of
                              256 MiB, gzip bombs (4 MB -> 4 GiB) alone and in relay envelopes of
                              10 and 15 frames [< 1500]
  timeline_10k_metrics_s      a timeline of a run with 10,000 metric names [< 2]
  slow_client_good_ratio      requests of a good client answered within 5 s while 50 clients
                              send headers and bodies a byte at a time [>= 0.9]
  slow_clients_cut_off        of those 50, the connections the server closed [50]
  disk_full_5xx_without_retry_after  refusals of ingest on a full disk (256 MiB tmpfs, filled
                              below the free-space floor, then to 16 KiB) without Retry-After [0]
  disk_full_read_hang_s       how much longer than 1 s the slowest read took meanwhile [0]
  disk_full_sdk_lost          steps an SDK job lost through the outage, once space returned [0]
``--quick`` makes every probe smaller (a 50,000-row insert, 2 bombs of 1 GiB expanded, 2,000
metric names, 10 slow clients, 10 posts on the full disk) and keeps the same goals. The
disk-full probe mounts a tmpfs: it needs root, as CI has.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import errno
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit

import fleetlens
from fleetlens.testing import Server, free_port, scalar_grid, step_batch, wait_until
from fleetlens.wire import (
    BATCHES_CONTENT_TYPE,
    BatchFrame,
    TableBuilder,
    encode_batch,
    encode_frames,
)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _peak_mb(server: Server) -> float:
    assert server.proc is not None
    with open(f"/proc/{server.proc.pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024


def _steps(server: Server, run: str, upto: int) -> set[int]:
    ranks = server.get(f"/v1/runs/{run}/ranks?fromStep=0&toStep={upto}")["ranks"]
    return {r["steps"] for r in ranks} or {0}


def kill_mid_stream(root: str, senders: int, per_sender: int) -> dict[str, Any]:
    """SIGKILL while senders stream; every acknowledged batch must be there after the restart,
    and every batch sent again must be stored once."""
    server = Server(os.path.join(root, "kill")).start()
    bodies = {
        (s, i): step_batch(f"k{s}", range(i, i + 1), 8, batch_id=f"k-{s}-{i}", t0=1.7e9 + i)[1]
        for s in range(senders)
        for i in range(per_sender)
    }
    acked: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def send(s: int) -> None:
        for i in range(per_sender):
            try:
                status = server.post(bodies[(s, i)])[0]
            except OSError:
                return
            if status == 200:
                with lock:
                    acked.add((s, i))

    threads = [threading.Thread(target=send, args=(s,)) for s in range(senders)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= senders * per_sender // 3, 120)
    server.kill()
    for t in threads:
        t.join()
    server = Server(server.data_dir, port=server.port).start()
    try:
        lost = 0
        for s in range(senders):
            stored = min(_steps(server, f"k{s}", per_sender))
            lost += max(0, sum(1 for (x, _) in acked if x == s) - stored)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda b: server.post(b)[0], bodies.values()))
        doubled = sum(
            max(0, max(_steps(server, f"k{s}", per_sender)) - per_sender) for s in range(senders)
        )
        return {
            "acked": len(acked),
            "acked_lost": lost,
            "duplicates": doubled,
            "resent_not_200": sum(c != 200 for c in codes),
        }
    finally:
        server.stop()


def _big_batch(run: str, rows: int) -> bytes:
    tb = TableBuilder("step")
    tb.add_packed("step", np.arange(rows, dtype="<i8").tobytes())
    tb.add_packed("rank", np.zeros(rows, dtype="<i4").tobytes())
    tb.add_packed("time", (time.time() - 3 * 86400 + np.arange(rows) * 0.5).astype("<f8").tobytes())
    tb.add_packed("duration", np.full(rows, 0.5, dtype="<f8").tobytes())
    return encode_batch({"step": tb.build()}, {"run_id": run}, compress=True)[1]


def kill_inside_insert(root: str, rows: int, trials: int) -> dict[str, Any]:
    """SIGKILL while one large insert is in flight, then the time until the restarted server
    answers; the batch sent again is stored once. The insert's intent goes to the ledger before
    the engine writes and its commit after; a warm-up insert of the same size times that
    interval, and the trials kill at spread fractions of it (early, when nothing reached the
    table yet, to late, when the table and its views hold it and only the commit is missing)."""
    data = os.path.join(root, "insert")
    server = Server(data).start()
    try:
        span = _insert_span(server, data, _big_batch("warm", rows))
    finally:
        server.stop()
    fractions = _FRACTIONS[:trials]
    results = [_kill_one_insert(data, f"big{k}", rows, f * span) for k, f in enumerate(fractions)]
    return {
        "insert_s": round(span, 3),
        "kill_at_fraction": fractions,
        "restart_after_kill_s": [round(t, 2) for t, _ in results],
        "stored_once": all(once for _, once in results),
    }


_FRACTIONS = (0.5, 0.8, 0.3, 0.95)  # of the insert's span, measured before the commit (on the
# code before this bench, all four landed inside the insert and its restart took 232-276 s)


def _ledger(data: str) -> str:
    found = [os.path.join(d, "ingest.ledger") for d, _, f in os.walk(data) if "ingest.ledger" in f]
    return found[0]


def _last_line(path: str, offset: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        lines = fh.read().splitlines()
    return lines[-1] if lines else b""


def _insert_span(server: Server, data: str, body: bytes) -> float:
    """Seconds from the ledger's intent of ``body``'s insert to its commit."""
    ledger = _ledger(data)
    size = os.path.getsize(ledger)
    threading.Thread(target=_quiet_post, args=(server, body), daemon=True).start()
    wait_until(lambda: _last_line(ledger, size).startswith(b"I "), 120, every=0.001)
    start = time.monotonic()
    wait_until(lambda: _last_line(ledger, size).startswith(b"C"), 120, every=0.001)
    return time.monotonic() - start


def _kill_one_insert(data: str, run: str, rows: int, after_s: float) -> tuple[float, bool]:
    body = _big_batch(run, rows)
    server = Server(data).start()
    ledger = _ledger(data)
    size = os.path.getsize(ledger)
    threading.Thread(target=_quiet_post, args=(server, body), daemon=True).start()
    wait_until(lambda: _last_line(ledger, size).startswith(b"I "), 120, every=0.001)
    time.sleep(after_s)
    server.kill()
    uncommitted = _last_line(ledger, size).startswith(b"I ")
    start = time.monotonic()
    server = Server(data, port=server.port).start(timeout=900)
    took = time.monotonic() - start
    try:
        assert server.post(body, encoding="gzip")[0] == 200
        once = _steps(server, run, rows) == {rows}
    finally:
        server.stop()
    _log(
        f"  killed {after_s:.2f} s into a {rows}-row insert ({'not ' if not uncommitted else ''}"
        f"before its commit): listening again after {took:.1f} s"
    )
    return took, once


def _quiet_post(server: Server, body: bytes) -> None:
    with contextlib.suppress(OSError):
        server.post(body, encoding="gzip")


def _bomb(expanded_mb: int) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\x00" * (16 << 20)
    return b"".join(z.compress(chunk) for _ in range(expanded_mb // 16)) + z.flush()


def _post_json(port: int, path: str, body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except OSError:
        return -1
    finally:
        conn.close()


def bombs(root: str, json_mb: int, envelopes: int, expanded_mb: int = 4096) -> dict[str, Any]:
    """Every bomb, one after the other on one server: three JSON bodies of ``json_mb`` at once
    on a JSON route, four gzip bombs expanding to ``expanded_mb`` (4 MB -> 4 GiB) at once on
    ``/v1/ingest``, relay envelopes of ten such frames, and one of fifteen (62.6 MB at 4 GiB,
    under the 64 MiB body limit): the server's peak memory, every answer, and that it still
    ingests."""
    server = Server(os.path.join(root, "bombs")).start()
    try:
        assert server.post(step_batch("bombed", range(0, 3), 2)[1])[0] == 200
        huge = b'{"config": {"pad": "' + b"x" * (json_mb << 20) + b'"}}'
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            json_codes = list(
                pool.map(
                    lambda _: _post_json(server.port, "/v1/runs/bombed/describe", huge), range(3)
                )
            )
            bomb = _bomb(expanded_mb)
            gzip_codes = list(pool.map(lambda _: server.post(bomb, encoding="gzip")[0], range(4)))
        frame = BatchFrame(body=bomb, encoding="gzip")
        frame_codes = []
        for frames in [10] * envelopes + [15]:
            status, answer, _ = server.post(
                encode_frames([frame] * frames), BATCHES_CONTENT_TYPE, path="/v1/ingest/batches"
            )
            frame_codes += [r["status"] for r in answer.get("results", [])] or [status]
        after = server.post(step_batch("bombed", range(3, 6), 2)[1])[0]
        return {
            "peak_rss_mb": round(_peak_mb(server), 1),
            "json_codes": sorted(set(json_codes)),
            "gzip_codes": sorted(set(gzip_codes)),
            "frame_codes": sorted(set(frame_codes)),
            "ingest_after": after,
        }
    finally:
        server.stop()


def spool_unwritable(root: str, steps: int) -> dict[str, Any]:
    """An SDK job whose collector is away and whose spool cannot be written: the steps of the
    outage are kept in memory and arrive once the collector is back."""
    blocked = os.path.join(root, "blocked")
    Path(blocked).write_text("a file where the spool's directory should be")
    port = free_port()
    run = fleetlens.init(
        project="rel",
        run_id="unwritable",
        server=f"http://127.0.0.1:{port}",
        spool_dir=os.path.join(blocked, "spool"),
        flush_interval=0.05,
        backoff_base=0.05,
        backoff_max=0.5,
        install_signal_handler=False,
    )
    for i in range(steps):
        with run.step(i):
            pass
        run.log(i, loss=1.0 / (i + 1))
        if i % 50 == 49:
            run.flush(0.01)
    server = Server(os.path.join(root, "spool-server"), port=port).start()
    try:
        run.finish()
        stats = run.stats()
        wait_until(lambda: server.get("/v1/runs/unwritable").get("steps", 0) >= steps, 60)
        stored = server.get("/v1/runs/unwritable")["steps"]
        return {
            "steps": steps,
            "sdk_spool_unwritable_lost": steps - stored,
            "in_memory_batches": stats.get("spool_in_memory_batches"),
            "dropped": stats.get("dropped"),
        }
    except TimeoutError:
        stored = server.get("/v1/runs/unwritable").get("steps", 0)
        return {"steps": steps, "sdk_spool_unwritable_lost": steps - stored}
    finally:
        server.stop()


def wide_timeline(root: str, names: int, steps: int) -> dict[str, Any]:
    """The timeline of a run that logged ``names`` metric names at each of ``steps`` steps."""
    server = Server(os.path.join(root, "wide")).start()
    try:
        t0 = time.time() - 3600
        assert server.post(step_batch("wide", range(steps), 1, t0=t0)[1])[0] == 200
        values = np.random.default_rng(0).uniform(1.0, 1.5, (steps, names))
        values[-1, -1] = 100.0  # one spike, at the last step of the last name
        body = scalar_grid("wide", [f"layers.{i}.grad_norm" for i in range(names)], values, t0)
        assert server.post(body, encoding="gzip")[0] == 200
        took = []
        for _ in range(3):
            start = time.perf_counter()
            items = server.get(f"/v1/runs/wide/timeline?fromStep=0&toStep={steps}")["items"]
            took.append(time.perf_counter() - start)
        spikes = sum(1 for i in items if i.get("kind") == "spike")
        return {"timeline_s": round(statistics.median(took), 3), "spikes": spikes}
    finally:
        server.stop()


def slow_clients(root: str, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` connections sending headers or a JSON body a byte every 0.5 s, while a good
    client reads the run list: how many of its requests were answered within 5 s, and how
    many slow connections the server closed."""
    server = Server(
        os.path.join(root, "slow"),
        env={"FLEETLENS_HEADER_TIMEOUT_S": "5", "FLEETLENS_BODY_GRACE_S": "5"},
    ).start()
    closed = 0
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def slow(k: int) -> None:
        nonlocal closed
        head = b"GET /v1/runs HTTP/1.1\r\nHost: x\r\n"
        if k % 2:
            head = (
                b"POST /v1/runs/slow/describe HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
            )
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                sock.sendall(head)
                sock.settimeout(0.5)
                while time.monotonic() < stop:
                    sock.sendall(b"a")
                    try:
                        sock.recv(4096)  # the server's 408, or its close: cut off either way
                    except TimeoutError:
                        continue
                    with lock:
                        closed += 1
                    return
        except OSError:
            with lock:
                closed += 1

    try:
        assert server.post(step_batch("slow", range(0, 3), 2)[1])[0] == 200
        threads = [threading.Thread(target=slow, args=(k,), daemon=True) for k in range(clients)]
        for t in threads:
            t.start()
        good = total = 0
        while time.monotonic() < stop:
            total += 1
            start = time.monotonic()
            try:
                server.get("/v1/runs")
                good += time.monotonic() - start < 5.0
            except OSError:
                pass
            time.sleep(0.2)
        for t in threads:
            t.join(10)
        return {
            "slow_client_good_ratio": round(good / max(total, 1), 3),
            "slow_clients_cut_off": closed,
            "slow_clients": clients,
        }
    finally:
        server.stop()


def disk_full(root: str, posts: int) -> dict[str, Any]:
    """A server whose data directory fills up (a 256 MiB tmpfs filled by another process):
    below the free-space floor, then with a few KiB left that the engine's own insert needs
    more than. Every refusal must carry Retry-After, reads must keep answering, and an SDK job
    that ran through the outage must lose nothing."""
    out: dict[str, Any] = {"no_retry_after": 0, "read_s_max": 0.0, "lost": 0, "codes": []}
    for floor, leave in ((64 << 20, 32 << 20), (0, 16 << 10)):
        mount = os.path.join(root, f"disk-{floor}")
        os.makedirs(mount)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", mount], check=True)
        try:
            _disk_full_once(mount, floor, leave, posts, out)
        finally:
            subprocess.run(["umount", "-l", mount], check=False)
    return out


def _disk_full_once(mount: str, floor: int, leave: int, posts: int, out: dict[str, Any]) -> None:
    server = Server(os.path.join(mount, "data"), env={"FLEETLENS_MIN_FREE_BYTES": str(floor)})
    server.start()
    run = fleetlens.init(
        project="rel",
        run_id="through-full",
        server=server.url,
        spool_dir=os.path.join(mount + "-spool"),
        flush_interval=0.05,
        install_signal_handler=False,
    )
    try:
        ballast = os.path.join(mount, "ballast")
        _fill(mount, ballast, leave)
        time.sleep(1.1)
        for i in range(posts):
            with run.step(i):
                pass
            status, _, headers = server.post(step_batch("full", range(i * 10, i * 10 + 10), 64)[1])
            out["codes"].append(status)
            out["no_retry_after"] += status >= 500 and "retry-after" not in headers
            start = time.monotonic()
            server.get("/v1/runs")
            out["read_s_max"] = max(out["read_s_max"], round(time.monotonic() - start, 3))
        os.unlink(ballast)
        wait_until(lambda: run.flush(1.0) and run.stats()["spool_files"] == 0, 60)
        run.finish()
        out["lost"] += posts - server.get("/v1/runs/through-full").get("steps", 0)
    finally:
        server.stop()


def _fill(mount: str, ballast: str, leave: int) -> None:
    """Grow `ballast` until `leave` bytes of `mount` are free. The server writes to the same
    file system meanwhile (the run's registration, the engine's parts), so the free space read
    a moment ago may be gone: a refused extension is retried on a fresh reading, in smaller
    pieces, until what is left is within a page of the aim."""
    with open(ballast, "wb") as fh:
        size = 0
        for _ in range(64):
            st = os.statvfs(mount)
            want = st.f_bavail * st.f_frsize - leave
            if want < 4096:
                return
            try:
                os.posix_fallocate(fh.fileno(), size, want)
                size += want
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                leave += 4096
        raise RuntimeError(f"could not fill {mount} to {leave} bytes free")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller probes, same goals (CI)")
    args = ap.parse_args()
    q = args.quick
    root = tempfile.mkdtemp(prefix="fleetlens-reliability-")
    t0 = time.monotonic()
    _log("== kill mid-stream")
    kill = kill_mid_stream(root, 6 if q else 12, 20 if q else 40)
    _log(f"  {kill}")
    _log("== kill inside one large insert")
    insert = kill_inside_insert(root, 50_000 if q else 200_000, 1 if q else 3)
    _log("== bombs")
    bomb = bombs(root, 64 if q else 256, 1 if q else 2, 1024 if q else 4096)
    _log(f"  {bomb}")
    _log("== SDK spool that cannot be written")
    spool = spool_unwritable(root, 300 if q else 2000)
    _log(f"  {spool}")
    _log("== a run with many metric names")
    wide = wide_timeline(root, 2000 if q else 10_000, 50)
    _log(f"  {wide}")
    _log("== a full disk")
    full = disk_full(root, 10 if q else 40)
    _log(f"  {full}")
    _log("== slow clients")
    slow = slow_clients(root, 10 if q else 50, 12 if q else 20)
    _log(f"  {slow}")
    figures: dict[str, Any] = {
        "acked_lost": kill["acked_lost"],
        "duplicates": kill["duplicates"],
        "restart_after_kill_s_max": max(insert["restart_after_kill_s"]),
        "sdk_spool_unwritable_lost": spool["sdk_spool_unwritable_lost"],
        "peak_rss_mb": bomb["peak_rss_mb"],
        "timeline_10k_metrics_s": wide["timeline_s"],
        "slow_client_good_ratio": slow["slow_client_good_ratio"],
        "slow_clients_cut_off": slow["slow_clients_cut_off"],
        "disk_full_5xx_without_retry_after": full["no_retry_after"],
        "disk_full_read_hang_s": round(max(0.0, full["read_s_max"] - 1.0), 3),
        "disk_full_sdk_lost": full["lost"],
    }
    measured_ok = (
        figures["acked_lost"] == 0
        and figures["duplicates"] == 0
        and kill["resent_not_200"] == 0
        and figures["restart_after_kill_s_max"] < 30
        and insert["stored_once"]
        and figures["sdk_spool_unwritable_lost"] == 0
        and figures["peak_rss_mb"] < 1500
        and bomb["json_codes"] == [413]
        and bomb["gzip_codes"] == [413]
        and bomb["frame_codes"] == [413]
        and bomb["ingest_after"] == 200
        and figures["timeline_10k_metrics_s"] < 2
        and wide["spikes"] == 1
        and figures["slow_client_good_ratio"] >= 0.9
        and figures["slow_clients_cut_off"] == slow["slow_clients"]
        and figures["disk_full_5xx_without_retry_after"] == 0
        and figures["disk_full_read_hang_s"] == 0
        and figures["disk_full_sdk_lost"] == 0
        and set(full["codes"]) == {503}
    )
    emit(
        {
            "bench": "reliability",
            "quick": q,
            **figures,
            "probes": {
                "kill": kill,
                "insert": insert,
                "bombs": bomb,
                "spool": spool,
                "wide": wide,
                "slow": slow,
                "disk_full": {k: v for k, v in full.items() if k != "codes"},
            },
            "ok": measured_ok,
            "wall_s": round(time.monotonic() - t0, 1),
        }
    )


if __name__ == "__main__":
    main()
