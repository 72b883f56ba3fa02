"""First render of the portal's run page on big runs: server time and bytes.

Two runs: 1,024 ranks x 100,000 steps and 16,384 ranks x 100,000 steps. Storing 100 million
(or 1.6 billion) rank-step rows is impossible here, so the bench stores what the page reads:

- ``steps_by_step``: the per-step rollup the ingest path's materialized view makes (one row per
  step, as bench/goodput.py does);
- ``scalars``: loss, lr and grad_norm at every step (rank 0), 300,000 rows;
- ``steps``: per-rank rows for the heatmap's default window only, the last
  ``HEATMAP_ROWS_BUDGET // ranks`` steps (about 2 million rows), with rank 777 15% slow;
- a few events (a checkpoint every 1,000 steps) and the run in the metadata store.

A first render is ``GET /runs/{id}`` (the HTML) plus ``GET /v1/runs/{id}/overview`` (the one
JSON document it fetches first; the static JS/CSS are cached and not counted). Keys:
``server_ms_1k``, ``bytes_1k``, ``server_ms_16k``, ``bytes_16k`` (goals: < 300 ms, < 1 MB), the
median of ``--repeat`` renders after one cold render (reported as ``cold_ms_*``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, free_port, stop_server

from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.portal_queries import HEATMAP_ROWS_BUDGET

STEP_S, SLOW_RANK = 2.0, 777

LAUNCH = """
import sys, uvicorn
from fleetlens.api.app import create_app
from fleetlens.config import ServerConfig
cfg = ServerConfig.resolve({"data_dir": sys.argv[1], "port": int(sys.argv[2]), "host": "127.0.0.1"})
app = create_app(cfg)
if not any(getattr(r, "path", "") == "/oncall" for r in app.routes):
    from fleetlens.api.portal import router as portal_router
    from fleetlens.ui.pages import router as pages_router
    app.include_router(portal_router)
    app.include_router(pages_router)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def store_run(data: str, run: str, ranks: int, steps: int, seed: int = 0) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    t0 = 1.72e9
    step = np.arange(steps, dtype=np.int64)
    dur = STEP_S * (1 + 0.02 * rng.random(steps))
    start = t0 + np.cumsum(np.r_[0.0, dur[:-1]])
    rollup = pa.table(
        {
            "tenant": pa.array(["default"] * steps),
            "run_id": pa.array([run] * steps),
            "job_id": pa.array(["a0"] * steps),
            "step": pa.array(step),
            "ranks": pa.array(np.full(steps, ranks, dtype=np.uint64)),
            "tokens": pa.array(np.full(steps, 4_000_000, dtype=np.int64)),
            "start": pa.array(start),
            "end": pa.array(start + dur),
            "max_duration": pa.array(dur),
            "sum_duration": pa.array(dur * ranks),
            "max_compute": pa.array(dur * 0.9),
            "sum_compute": pa.array(dur * 0.9 * ranks * 0.99),
            "max_data_wait": pa.array(np.zeros(steps)),
        }
    )
    store = ChdbStore(os.path.join(data, "telemetry"))
    ctx = {"tenant": "default", "run_id": run, "job_id": "a0", "project": "bench"}
    try:
        path = os.path.join(data, f"rollup-{run}.parquet")
        pq.write_table(rollup, path)
        store.command(f"INSERT INTO fleetlens.steps_by_step SELECT * FROM file('{path}', Parquet)")
        os.remove(path)
        names = ["loss", "lr", "grad_norm"]
        vals = [4.0 * np.exp(-step / 5e4) + 1.5, np.full(steps, 3e-4), 1 + 0.1 * rng.random(steps)]
        for name, v in zip(names, vals, strict=True):
            sc = pa.table(
                {
                    "step": pa.array(step),
                    "time": pa.array(start + dur),
                    "name": pa.array([name] * steps),
                    "value": pa.array(v),
                }
            )
            store.insert("scalar", sc, ctx, f"scalar-{run}-{name}")
        window = HEATMAP_ROWS_BUDGET // ranks
        rows = 0
        chunk = max(1, 250_000 // ranks)
        for s0 in range(steps - window, steps, chunk):
            ss = np.arange(s0, min(steps, s0 + chunk), dtype=np.int64)
            st = np.repeat(ss, ranks)
            rk = np.tile(np.arange(ranks, dtype=np.int32), len(ss))
            d = np.repeat(dur[ss], ranks) * (1 + 0.01 * rng.random(len(st)))
            d[rk == SLOW_RANK] *= 1.15
            t = pa.table(
                {
                    "step": pa.array(st),
                    "rank": pa.array(rk),
                    "time": pa.array(np.repeat(start[ss], ranks)),
                    "duration": pa.array(d),
                }
            )
            store.insert("step", t, ctx, f"step-{run}-{s0}")
            rows += len(st)
        ck = step[step % 1000 == 999]
        ev = pa.table(
            {
                "time": pa.array(start[ck] + dur[ck]),
                "step": pa.array(ck),
                "kind": pa.array(["checkpoint_end"] * len(ck)),
            }
        )
        store.insert("event", ev, ctx, f"event-{run}")
    finally:
        store.close()
    meta = MetadataStore(f"sqlite:///{data}/metadata.db")
    try:
        meta.observe(
            "default",
            run,
            job_id="a0",
            project="bench",
            first=float(start[0]),
            last=float(start[-1] + dur[-1]),
            step=steps - 1,
            world_size=ranks,
        )
    finally:
        meta.close()
    return {"steps_by_step": steps, "scalars": 3 * steps, "steps": rows, "events": len(ck)}


def render(url: str, run: str) -> tuple[float, int]:
    t = time.perf_counter()
    n = 0
    for path in (f"/runs/{run}", f"/v1/runs/{run}/overview"):
        with urllib.request.urlopen(url + path, timeout=120) as r:
            n += len(r.read())
    return (time.perf_counter() - t) * 1000.0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="10,000 steps per run instead of 100,000")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    steps = 10_000 if args.quick else 100_000
    result: dict[str, object] = {"bench": "portal", "quick": args.quick, "steps": steps}
    stored = {}
    with tempfile.TemporaryDirectory() as data:
        t = time.perf_counter()
        for key, ranks in (("1k", 1024), ("16k", 16_384)):
            stored[key] = store_run(data, f"bench-{key}", ranks, steps)
        print(f"stored in {time.perf_counter() - t:.1f} s: {stored}", file=sys.stderr)
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, data, str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(url + "/healthz", timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("server did not start") from None
                    time.sleep(0.1)
            for key in ("1k", "16k"):
                run = f"bench-{key}"
                cold, nbytes = render(url, run)
                warm = [render(url, run)[0] for _ in range(args.repeat)]
                result[f"server_ms_{key}"] = round(statistics.median(warm), 1)
                result[f"bytes_{key}"] = nbytes
                result[f"cold_ms_{key}"] = round(cold, 1)
                with urllib.request.urlopen(f"{url}/v1/runs/{run}/overview", timeout=60) as r:
                    hot = json.load(r)["heatmap"]["hot"]
                result[f"hot_rank_{key}"] = hot and hot["rank"]
                print(f"{key}: cold {cold:.0f} ms, warm {warm}, {nbytes:,} bytes", file=sys.stderr)
        finally:
            stop_server(proc)
    result["stored_rows"] = stored
    emit(result)


if __name__ == "__main__":
    main()
