"""Alerting: time from an injected fatal Xid to Alertmanager having the alert, and whether a
dead receiver slows ingestion.

Keys: fault_to_notification_s (the hardware_fault event posted -> the alert visible in
Alertmanager's API, with the analysis pass every 0.5 s), ingest_ratio_receiver_down (ingest
rows/s while Alertmanager is down and alerts keep failing to deliver, over rows/s while it is up,
same server, same run). Goals: under 30 s, and at least 0.95.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import emit, start_server, stop_server
from ingest import make_batches, post_all

from bench._promstack import alertmanager, get_json
from fleetlens.wire import TableBuilder, encode_batch


def _post(url: str, body: bytes) -> None:
    req = urllib.request.Request(url + "/v1/ingest", data=body, method="POST")
    req.add_header("Content-Type", "application/msgpack")
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def inject_fault(url: str, run_id: str, node: str, t: float) -> None:
    ctx = {"run_id": run_id, "job_id": f"{run_id}-a0"}
    pl = TableBuilder("placement").add("time", [t - 60]).add("rank", [0]).add("node_id", [node])
    st = TableBuilder("step").add("step", [0, 1]).add("rank", [0, 0])
    st.add("time", [t - 30, t - 29]).add("duration", [0.9, 0.9])
    ev = TableBuilder("event").add("time", [t]).add("kind", ["hardware_fault"]).add("step", [1])
    ev.add("node_id", [node]).add("gpu", [0]).add("attrs", [json.dumps({"xid": 79})])
    _post(url, encode_batch({"placement": pl.build(), "step": st.build()}, ctx)[1])
    _post(url, encode_batch({"event": ev.build()}, ctx)[1])


def rate(url: str, bodies: list[bytes], rows: int) -> float:
    sent = [(b, {"Content-Type": "application/msgpack"}) for b in bodies]
    return rows * len(bodies) / post_all(url, sent, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rows = 1024 * 100
    bodies = make_batches(rows * (4 if args.quick else 20), rows, 1024)
    with tempfile.TemporaryDirectory() as tmp:
        with alertmanager() as am:
            proc, url = start_server(
                f"{tmp}/data",
                {"FLEETLENS_ALERTMANAGER_URL": am, "FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"},
            )
            try:
                t0 = time.time()
                inject_fault(url, "bench-xid", "node-7", t0)
                delay = None
                while time.time() - t0 < 120:
                    alerts = get_json(am + "/api/v2/alerts")
                    if any(a["labels"].get("run_id") == "bench-xid" for a in alerts):
                        delay = time.time() - t0
                        break
                    time.sleep(0.1)
                rate(url, bodies[:2], rows)  # warm up the store before either measurement
                up = rate(url, bodies, rows)
            except BaseException:
                stop_server(proc)  # the server must not outlive a failed measurement
                raise
        # Alertmanager is gone; new faults keep producing alerts that cannot be delivered.
        try:
            for i in range(3):
                inject_fault(url, f"bench-xid-down-{i}", f"node-{10 + i}", time.time())
            down = rate(url, bodies, rows)
        finally:
            stop_server(proc)
    print(
        f"fault -> Alertmanager {delay}s; ingest {up:,.0f} rows/s with the receiver up, "
        f"{down:,.0f} with it down",
        file=sys.stderr,
    )
    emit(
        {
            "fault_to_notification_s": round(delay, 2) if delay is not None else None,
            "ingest_rows_per_s_receiver_up": round(up),
            "ingest_rows_per_s_receiver_down": round(down),
            "ingest_ratio_receiver_down": round(down / up, 3),
            "ok": delay is not None and delay < 30 and down / up >= 0.95,
        }
    )


if __name__ == "__main__":
    main()
