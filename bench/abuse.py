"""Hostile and careless clients as a load (issue 22), against a real server while a
well-behaved SDK job ingests.

The probes, all at once, from tenant ``bolt`` (the attacker) while tenant ``acme``'s job runs:
slow chunked bodies, concurrent gzip bombs, batches with huge ranks, batch ids that collide with
acme's, an SDK job whose batches the server refuses, a flood of concurrent requests, and the
privilege and file probes (an ``oncall`` token, local files as artifacts, ``/metrics``).

Keys (goal in brackets):
  acked_lost               batches answered 200 whose rows are not stored [0]
  cross_tenant_effects     things bolt did that acme can see or that reached acme's data [0]
  server_down_s            seconds /healthz did not answer within 2 s [0]
  peak_rss_mb              the server process's peak resident memory, /proc VmHWM [< 1500]
  good_client_ingest_ratio acme's steps stored / steps its job recorded [>= 0.9]
Also: probe-by-probe figures (``probes``), and ``ok``. ``--quick`` is a smaller, shorter load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit

import fleetlens
from fleetlens.store.access import AccessStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.testing import free_port
from fleetlens.wire import TableBuilder, encode_batch


def _request(
    url: str, method: str, path: str, token: str, body: Any = None, raw: bytes | None = None,
    headers: dict[str, str] | None = None, timeout: float = 30.0,
) -> tuple[int, Any]:  # fmt: skip
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json" if raw is None else "application/msgpack")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            payload, status = r.read(), r.status
    except urllib.error.HTTPError as exc:
        payload, status = exc.read(), exc.code
    except OSError as exc:
        return 0, repr(exc)
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode(errors="replace")


def step_body(run_id: str, ranks: list[int], steps: range, batch_id: str | None = None) -> bytes:
    n = len(ranks) * len(steps)
    tb = TableBuilder("step")
    tb.add("step", [s for s in steps for _ in ranks]).add("rank", ranks * len(steps))
    t0 = time.time() - 60
    tb.add("time", [t0 + s for s in steps for _ in ranks]).add("duration", [0.4] * n)
    ctx = {"run_id": run_id, "job_id": f"{run_id}-j", "project": "p"}
    return encode_batch({"step": tb.build()}, ctx, batch_id=batch_id)[1]


class Server:
    def __init__(self, data: str) -> None:
        self.data = data
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(data, "server.log"), "ab")  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "serve", "--data", data, "--port",
             str(self.port), "--auth", "required"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/healthz", timeout=1),
            ):
                return
            if self.proc.poll() is not None:
                raise RuntimeError("server exited during start")
            time.sleep(0.2)
        raise RuntimeError("server did not start")

    def peak_rss_mb(self) -> float:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return -1.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class Health(threading.Thread):
    """Polls /healthz; adds up the time it did not answer within 2 s."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.down_s, self.stop = url, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2):
                    pass
            except OSError:
                self.down_s += time.monotonic() - t0
            self.stop.wait(max(0.0, 0.25 - (time.monotonic() - t0)))


def good_job(url: str, token: str, seconds: float, spool: str, out: dict[str, Any]) -> None:
    run = fleetlens.init(
        server=url, token=token, run_id="good-run", project="p", spool_dir=spool,
        install_signal_handler=False, exit_flush_timeout=60.0,
    )  # fmt: skip
    steps = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = time.time()
        run.record_step(steps, time=now - 0.01, duration=0.01)
        run.log(steps, loss=1.0 / (steps + 1))
        steps += 1
        time.sleep(0.01)
    run.finish()
    out.update(steps=steps, stats=run.stats())


def poisoned_job(url: str, token: str, spool: str, out: dict[str, Any]) -> None:
    """A careless job: values the server refuses, then good steps that must still get in."""
    run = fleetlens.init(
        server=url, token=token, run_id="careless-run", project="p", spool_dir=spool,
        install_signal_handler=False, exit_flush_timeout=30.0, world_size=16_000_000, rank=0,
    )  # fmt: skip
    run.event("checkpoint_end", 1, uri="s3://b/c", size_bytes=2**70)
    run.log(-1, loss=1.0)
    run.event("note", message="x" * 70_000)
    for s in range(200):
        run.record_step(s, time=time.time(), duration=0.01)
    run.finish()
    out.update(steps=200, stats=run.stats())


def slow_bodies(url: str, n: int, hold_s: float, out: dict[str, Any]) -> None:
    host, port = url.split("//")[1].split(":")
    socks = []
    for _ in range(n):
        with contextlib.suppress(OSError):
            s = socket.create_connection((host, int(port)), timeout=hold_s + 60)
            s.sendall(b"POST /v1/ingest HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                      + out["token"].encode() + b"\r\nContent-Type: application/msgpack\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n1\r\n\x93\r\n")  # fmt: skip
            socks.append(s)
    time.sleep(hold_s)
    answers: dict[str, int] = {}
    for s in socks:
        try:
            s.settimeout(1.0)
            head = s.recv(64).split(b" ")[1].decode()
        except (OSError, IndexError):
            head = "none"
        answers[head] = answers.get(head, 0) + 1
        s.close()
    out["slow_bodies"] = {"sent": len(socks), "answers": answers}


def gzip_bomb(expanded: int) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\x00" * (8 << 20)
    parts = [comp.compress(chunk) for _ in range(expanded // len(chunk))]
    return b"".join(parts) + comp.flush()


def bombs(url: str, token: str, n: int, expanded: int, out: dict[str, Any]) -> None:
    body = gzip_bomb(expanded)
    results: list[int] = []

    def one() -> None:
        status, _ = _request(url, "POST", "/v1/ingest", token, raw=body,
                             headers={"Content-Encoding": "gzip"}, timeout=120)  # fmt: skip
        results.append(status)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["bombs"] = {"compressed_bytes": len(body), "expanded_bytes": expanded, "answers": results}


async def _flood(host: str, port: int, token: str, n: int) -> dict[str, int]:
    request = (f"GET /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
               "Connection: close\r\n\r\n").encode()  # fmt: skip
    answers: dict[str, int] = {}

    async def one() -> None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
            writer.write(request)
            line = await asyncio.wait_for(reader.readline(), 60)
            code = line.split(b" ")[1].decode() if line else "none"
            writer.close()
        except (OSError, TimeoutError, IndexError):
            code = "error"
        answers[code] = answers.get(code, 0) + 1

    await asyncio.gather(*(one() for _ in range(n)))
    return answers


def flood(url: str, token: str, n: int, out: dict[str, Any]) -> None:
    host, port = url.split("//")[1].split(":")
    out["flood"] = {"requests": n, "answers": asyncio.run(_flood(host, int(port), token, n))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    quick = args.quick
    seconds = 25.0 if quick else 70.0
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        meta = MetadataStore(f"sqlite:///{data}/metadata.db")
        access = AccessStore(meta)
        tok = {name: access.create_token(t, role, name=name)[0] for name, (t, role) in {
            "acme-ingest": ("acme", "ingest"), "acme-admin": ("acme", "admin"),
            "bolt-ingest": ("bolt", "ingest"), "bolt-admin": ("bolt", "admin"),
        }.items()}  # fmt: skip
        meta.close()
        server = Server(data)
        health = Health(server.url)
        health.start()
        probes: dict[str, Any] = {"token": tok["bolt-ingest"]}
        good: dict[str, Any] = {}
        careless: dict[str, Any] = {}
        url = server.url
        try:
            # Duplicate batch ids: bolt reuses the id of one of acme's batches, different rows.
            dup = uuid.uuid4().hex
            acked: list[tuple[str, str, int]] = []  # (token, run, steps) answered 200
            for who, run in (("acme-ingest", "acme-dup"), ("bolt-ingest", "bolt-dup")):
                status, _ = _request(url, "POST", "/v1/ingest", tok[who],
                                     raw=step_body(run, [0, 1], range(10), dup))  # fmt: skip
                if status == 200:
                    acked.append((who.replace("ingest", "admin"), run, 10))
            workers = [
                threading.Thread(target=good_job, args=(url, tok["acme-ingest"], seconds,
                                                        os.path.join(tmp, "good"), good)),
                threading.Thread(target=poisoned_job, args=(url, tok["bolt-ingest"],
                                                            os.path.join(tmp, "bad"), careless)),
                threading.Thread(target=slow_bodies, args=(url, 8 if quick else 32,
                                                           seconds / 2, probes)),
                threading.Thread(target=bombs, args=(url, tok["bolt-ingest"], 4,
                                                     (256 << 20) if quick else (4 << 30), probes)),
                threading.Thread(target=flood, args=(url, tok["bolt-admin"],
                                                     200 if quick else 1000, probes)),
            ]  # fmt: skip
            for w in workers:
                w.start()
            # Huge ranks, and the privilege and file probes, while the load runs.
            ranks = {}
            for rank in (2_147_483_647, 16_000_000):
                ranks[str(rank)] = _request(
                    url,
                    "POST",
                    "/v1/ingest",
                    tok["bolt-ingest"],
                    raw=step_body(f"huge-{rank}", [rank], range(1)),
                )[0]
            probes["huge_ranks"] = ranks
            effects: list[str] = []
            status, _ = _request(url, "POST", "/v1/tokens", tok["bolt-admin"], {"role": "oncall"})
            if status == 201:
                effects.append("bolt's admin minted an oncall token")
            for uri in ("local:///etc/passwd", "simplecache::file:///etc/passwd",
                        f"file://{data}/metadata.db", "local:///dev/zero"):  # fmt: skip
                _request(url, "POST", "/v1/ingest", tok["bolt-ingest"],
                         raw=step_body("bolt-files", [0], range(1)))  # fmt: skip
                status, _ = _request(url, "POST", "/v1/runs/bolt-files/artifacts",
                                          tok["bolt-admin"], {"name": "x", "uri": uri},
                                          timeout=10)  # fmt: skip
                if status == 200:
                    effects.append(f"the server read {uri} for bolt")
            for w in workers:
                w.join()
            time.sleep(3)  # the run registry is written every 2 s
            status, metrics = _request(url, "GET", "/metrics", tok["bolt-admin"])
            if status == 200 and ("acme" in str(metrics) or "good-run" in str(metrics)):
                effects.append("bolt's /metrics shows acme")
            if _request(url, "GET", "/metrics", tok["bolt-ingest"])[0] == 200:
                effects.append("an ingest token reads /metrics")
            for path in ("/v1/runs/good-run", "/v1/runs/acme-dup"):
                if _request(url, "GET", path, tok["bolt-admin"])[0] == 200:
                    effects.append(f"bolt reads {path}")
            # What was acknowledged is there.
            lost = 0
            for token_name, run, steps in acked:
                status, body = _request(url, "GET", f"/v1/runs/{run}", tok[token_name])
                if status != 200 or body.get("steps") != steps:
                    lost += 1
                    if token_name.startswith("acme"):
                        effects.append(f"acme's acknowledged batch in {run} is gone")
            status, body = _request(url, "GET", "/v1/runs/good-run", tok["acme-admin"])
            stored = body.get("steps", 0) if status == 200 else 0
            ratio = stored / good["steps"] if good.get("steps") else 0.0
            lost += int(good.get("stats", {}).get("records_sent", 0) > 0 and stored == 0)
            probes["good_job"] = {"steps": good.get("steps"), "stored": stored,
                                  "stats": {k: good.get("stats", {}).get(k) for k in
                                            ("batches_sent", "send_failures", "spooled_batches",
                                             "rejected_batches", "quarantined_batches",
                                             "spool_files")}}  # fmt: skip
            status, body = _request(url, "GET", "/v1/runs/careless-run", tok["bolt-admin"])
            probes["careless_job"] = {
                "stored_steps": body.get("steps") if status == 200 else status,
                "stats": {k: careless.get("stats", {}).get(k) for k in
                          ("batches_sent", "rejected_batches", "quarantined_batches",
                           "spool_files")},
            }  # fmt: skip
            probes["effects"] = effects
            probes.pop("token")
        finally:
            health.stop.set()
            health.join()
            peak = server.peak_rss_mb()
            server.stop()
    print(json.dumps(probes, indent=1), file=sys.stderr)
    result = {
        "acked_lost": lost,
        "cross_tenant_effects": len(effects),
        "server_down_s": round(health.down_s, 2),
        "peak_rss_mb": round(peak, 1),
        "good_client_ingest_ratio": round(ratio, 4),
        "probes": probes,
    }
    result["ok"] = (
        lost == 0 and not effects and health.down_s == 0 and 0 < peak < 1500 and ratio >= 0.9
    )
    emit(result)


if __name__ == "__main__":
    main()
