"""A noisy tenant over its ingest quota must not slow another tenant's ingest.

Tenant "quiet" (no quota) ingests alone, then again while tenant "noisy" (quota 2 MB/s) runs
eight senders that each try to push 4x its quota and back off as the server's Retry-After says
(what the SDK does). Key: rate_ratio = quiet's rows/s with the noise over its rows/s alone, in
the same run. Goal: at least 0.95.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, start_server, stop_server
from ingest import make_batches

from fleetlens.store.access import AccessStore
from fleetlens.store.metadata import MetadataStore


def sender(
    url: str,
    token: str,
    bodies: list[bytes],
    stop: threading.Event,
    counts: list[int],
    rows_per_batch: int,
) -> None:
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    headers = {"Content-Type": "application/msgpack", "Authorization": f"Bearer {token}"}
    i = 0
    while not stop.is_set():
        conn.request("POST", "/v1/ingest", bodies[i % len(bodies)], headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status == 200:
            counts[0] += rows_per_batch
            i += 1
        elif resp.status in (429, 503):
            counts[1] += 1
            stop.wait(float(resp.getheader("Retry-After") or 1))
        else:
            raise RuntimeError(f"HTTP {resp.status}")
    conn.close()


def measure(url: str, token: str, bodies: list[bytes], rows: int, seconds: float) -> float:
    stop = threading.Event()
    counts = [0, 0]
    th = threading.Thread(target=sender, args=(url, token, bodies, stop, counts, rows))
    t0 = time.perf_counter()
    th.start()
    time.sleep(seconds)
    stop.set()
    th.join()
    return counts[0] / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    seconds = 4.0 if args.quick else args.seconds
    rows = 1024 * 50
    bodies = make_batches(rows * 8, rows, 1024)
    quota = 2_000_000
    with tempfile.TemporaryDirectory() as tmp:
        data = f"{tmp}/data"
        os.makedirs(data)
        meta = MetadataStore(f"sqlite:///{data}/metadata.db")
        access = AccessStore(meta)
        quiet, _ = access.create_token("quiet", "ingest")
        noisy, _ = access.create_token("noisy", "ingest")
        access.create_token("ops", "admin")
        from fleetlens.store.scope import Scope

        access.set_quotas(
            Scope("noisy", "admin", actor="bench"), "noisy", {"ingest_bytes_per_s": quota}
        )
        meta.close()
        proc, url = start_server(data, {"FLEETLENS_AUTH": "required"})
        try:
            measure(url, quiet, bodies, rows, 1.0)  # warm up
            alone = measure(url, quiet, bodies, rows, seconds)
            stop = threading.Event()
            noise = [0, 0]
            senders = [
                threading.Thread(target=sender, args=(url, noisy, bodies, stop, noise, rows))
                for _ in range(8)
            ]
            for th in senders:
                th.start()
            time.sleep(1.0)
            with_noise = measure(url, quiet, bodies, rows, seconds)
            stop.set()
            for th in senders:
                th.join()
        finally:
            stop_server(proc)
    ratio = with_noise / alone
    noisy_bytes_per_s = noise[0] / rows * len(bodies[0]) / (seconds + 1.0)
    print(
        f"quiet alone {alone:,.0f} rows/s, with noise {with_noise:,.0f} rows/s; noisy got "
        f"{noisy_bytes_per_s / 1e6:.2f} MB/s of its 2 MB/s quota, {noise[1]} 429s",
        file=sys.stderr,
    )
    emit(
        {
            "quiet_rows_per_s_alone": round(alone),
            "quiet_rows_per_s_with_noise": round(with_noise),
            "rate_ratio": round(ratio, 3),
            "noisy_bytes_per_s": round(noisy_bytes_per_s),
            "noisy_quota_bytes_per_s": quota,
            "noisy_throttled": noise[1],
            "ok": ratio >= 0.95,
        }
    )


if __name__ == "__main__":
    main()
