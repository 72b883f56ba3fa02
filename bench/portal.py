"""First render of the portal's run page on big runs: in the browser, server time and bytes.

Two runs: 1,024 ranks x 100,000 steps and 16,384 ranks x 100,000 steps. Storing 100 million
(or 1.6 billion) rank-step rows is impossible here, so the bench stores what the page reads:

- ``steps``: per-rank rows for the heatmap's default window only, the last
  ``HEATMAP_ROWS_BUDGET // ranks`` steps (about 2 million rows), with rank 777 15% slower to
  compute; the ingest path's materialized view rolls them up into ``steps_by_step``;
- ``steps_by_step``: the per-step rollup of every earlier step (one row per step, as
  bench/goodput.py does), with the same figures the view makes of the window's rows;
- ``scalars``: loss, lr and grad_norm at every step (rank 0), 300,000 rows;
- a checkpoint event every 1,000 steps, and the run in the metadata store.

The run page's requests, in the order a browser 1,440 pixels wide makes them (the static JS
and CSS, uPlot's included, are cached and not counted per render; ``static_bytes`` is what a
first visit fetches of them once; requests are sent with ``Accept-Encoding: gzip`` as a browser
sends them, and bytes are the bytes on the wire):

1. ``GET /runs/{id}``: the HTML shell;
2. ``GET /v1/runs/{id}/overview?points=720``: everything above the fold (the "What's wrong"
   findings with their costs) and the charts; the page paints it;
3. ``GET /v1/runs/{id}/heatmap?slowest=8&ranks=256&steps=160``: the heatmap, each row's rank and
   placement, and the slowest ranks, below the fold,
   fetched after the first paint.

**In the browser** (Debian's Chromium through Playwright, 1440 x 900, a new browser context per
load: an empty cache, so every script, style and document is fetched, as on a first visit):
``fcp_ms_*`` is the First Contentful Paint (Paint Timing), ``charts_ms_*`` the moment the charts
and tables above the fold have been drawn (the first animation frame after the page marks its
first paint done, ``body[data-painted]``), both from navigation start, and ``bytes_*`` every byte
the page transferred by then (``transferSize`` of the navigation and each resource); medians of
``--repeat`` loads after one. Goals: < 500 ms, < 1,000 ms, < 1 MB. Without Chromium these keys
are null and ``browser`` says why.

Keys measured by a script instead of a browser: ``server_ms_1k``, ``first_paint_bytes_1k``,
``server_ms_16k``, ``first_paint_bytes_16k`` are the first paint (1 and 2; goals: < 300 ms,
< 1 MB), the median of ``--repeat`` renders after one cold render (the first
request for that run on a running server: ``cold_ms_*``; the server's very first request, which
also pays the engine's one-time start, is ``first_request_ms``, on a small third run);
``full_ms_*`` and ``full_bytes_*`` add 3 (the whole page); ``json_bytes_*`` is the first paint's
JSON before gzip; ``parts_*`` the server's own cost of each part (its ``Server-Timing`` header,
medians, ms). Nothing is cached between renders: a warm render computes everything again.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, free_port, stop_server

from fleetlens.services.portal import HEATMAP_ROWS_BUDGET
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.metadata import MetadataStore

STEP_S, SLOW_RANK, TOKENS_PER_RANK = 2.0, 777, 4096

LAUNCH = """
import sys, uvicorn
from fleetlens.server import create_app
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
    window = min(steps, HEATMAP_ROWS_BUDGET // ranks)
    step = np.arange(steps, dtype=np.int64)
    dur = STEP_S * (1 + 0.02 * rng.random(steps))
    start = t0 + np.cumsum(np.r_[0.0, dur[:-1]])
    # Compute is 85% of the step (the rest is communication), the slow rank's 15% more.
    compute, slow = 0.85, 1.15
    early = steps - window  # the view rolls up the window's per-rank rows; these are stored
    rollup = pa.table(
        {
            "tenant": pa.array(["default"] * early),
            "run_id": pa.array([run] * early),
            "job_id": pa.array(["a0"] * early),
            "step": pa.array(step[:early]),
            "ranks": pa.array(np.full(early, ranks, dtype=np.uint64)),
            "tokens": pa.array(np.full(early, TOKENS_PER_RANK * ranks, dtype=np.int64)),
            "start": pa.array(start[:early]),
            "end": pa.array(start[:early] + dur[:early]),
            "max_duration": pa.array(dur[:early]),
            "sum_duration": pa.array(dur[:early] * ranks),
            "max_compute": pa.array(dur[:early] * compute * slow),
            "sum_compute": pa.array(dur[:early] * compute * (ranks - 1 + slow)),
            "max_data_wait": pa.array(np.zeros(early)),
        }
    )
    store = ChdbStore(os.path.join(data, "telemetry"))
    ctx = {"tenant": "default", "run_id": run, "job_id": "a0", "project": "bench"}
    try:
        if early:
            path = os.path.join(data, f"rollup-{run}.parquet")
            pq.write_table(rollup, path)
            store.command(
                f"INSERT INTO fleetlens.steps_by_step SELECT * FROM file('{path}', Parquet)"
            )
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
        rows = 0
        chunk = max(1, 250_000 // ranks)
        for s0 in range(early, steps, chunk):
            ss = np.arange(s0, min(steps, s0 + chunk), dtype=np.int64)
            st = np.repeat(ss, ranks)
            rk = np.tile(np.arange(ranks, dtype=np.int32), len(ss))
            # A synchronous job: every rank's step lasts as long as the slowest's.
            d = np.repeat(dur[ss], ranks) * (1 - 0.001 * rng.random(len(st)))
            c = d * compute * (1 - 0.01 * rng.random(len(st)))
            c[rk == SLOW_RANK] *= slow
            t = pa.table(
                {
                    "step": pa.array(st),
                    "rank": pa.array(rk),
                    "time": pa.array(np.repeat(start[ss], ranks)),
                    "duration": pa.array(d),
                    "comm": pa.array(d - c),
                    "tokens": pa.array(np.full(len(st), TOKENS_PER_RANK, dtype=np.int64)),
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


class Fetched:
    """One request as a browser makes it: wall time, bytes on the wire, the JSON, its timings."""

    def __init__(self, url: str) -> None:
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        t = time.perf_counter()
        with urllib.request.urlopen(req, timeout=120) as r:
            body = r.read()
            self.ms = (time.perf_counter() - t) * 1000.0
            gzipped = r.headers.get("Content-Encoding") == "gzip"
            timing = r.headers.get("Server-Timing") or ""
        self.bytes = len(body)
        self.raw = gzip.decompress(body) if gzipped else body
        self.parts = {}
        for item in filter(None, (p.strip() for p in timing.split(","))):
            name, _, dur = item.partition(";dur=")
            self.parts[name] = float(dur)

    def json(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.raw)
        return doc


def render(url: str, run: str) -> tuple[Fetched, Fetched, Fetched]:
    """The run page's three requests, in order: HTML, first-paint JSON, below-the-fold JSON,
    as the page asks them in a 1440-pixel-wide window."""
    html = Fetched(f"{url}/runs/{run}")
    first = Fetched(f"{url}/v1/runs/{run}/overview?points=720")
    rest = Fetched(f"{url}/v1/runs/{run}/heatmap?slowest=8&ranks=256&steps=160")
    return html, first, rest


STATIC = ("app.js", "charts.js", "plots.js", "run.js", "style.css", "vendor/uplot/uPlot.min.css",
          "vendor/uplot/uPlot.iife.min.js")  # fmt: skip


def static_bytes(url: str) -> int:
    """The run page's scripts and styles on the wire, fetched once per browser (then cached)."""
    return sum(Fetched(f"{url}/ui/static/{name}").bytes for name in STATIC)


CHROMIUM = "/usr/bin/chromium"
_MEASURE = """() => new Promise((done) => requestAnimationFrame(() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const fcp = performance.getEntriesByName("first-contentful-paint")[0];
  const bytes = nav.transferSize
    + performance.getEntriesByType("resource").reduce((a, e) => a + e.transferSize, 0);
  done({ fcp: fcp ? fcp.startTime : null, charts: performance.now(), bytes });
}))"""


def in_browser(url: str, run: str, repeat: int) -> dict[str, float] | str:
    """Medians of ``repeat`` loads of the run page in Chromium after one (see the docstring);
    the reason as a string when there is no browser to measure with."""
    if not os.path.exists(CHROMIUM):
        return f"no {CHROMIUM} (apt-get install chromium)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "no playwright (pip install playwright)"
    loads = []
    with sync_playwright() as p:
        flags = ["--no-sandbox", "--disable-gpu", "--no-first-run"]
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=flags)
        try:
            for _ in range(repeat + 1):
                ctx = browser.new_context(viewport={"width": 1440, "height": 900})
                page = ctx.new_page()
                page.goto(f"{url}/runs/{run}")
                page.wait_for_selector("body[data-painted=true]", timeout=120_000)
                loads.append(page.evaluate(_MEASURE))
                ctx.close()
        finally:
            browser.close()
    warm = loads[1:]
    return {k: statistics.median(x[k] for x in warm) for k in ("fcp", "charts", "bytes")}


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
        store_run(data, "bench-small", 8, 100)
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
            # The server's first request pays the engine's one-time start (any request would);
            # a small run takes it, so that each big run's cold render is its own.
            small = render(url, "bench-small")
            result["first_request_ms"] = round(sum(f.ms for f in small), 1)
            result["static_bytes"] = static_bytes(url)
            for key in ("1k", "16k"):
                run = f"bench-{key}"
                cold = render(url, run)
                warm = [render(url, run) for _ in range(args.repeat)]
                html, first, rest = warm[-1]
                paint = [h.ms + f.ms for h, f, _ in warm]
                full = [h.ms + f.ms + r.ms for h, f, r in warm]
                result[f"server_ms_{key}"] = round(statistics.median(paint), 1)
                result[f"first_paint_bytes_{key}"] = html.bytes + first.bytes
                result[f"cold_ms_{key}"] = round(cold[0].ms + cold[1].ms, 1)
                result[f"full_ms_{key}"] = round(statistics.median(full), 1)
                result[f"full_cold_ms_{key}"] = round(sum(f.ms for f in cold), 1)
                result[f"full_bytes_{key}"] = html.bytes + first.bytes + rest.bytes
                result[f"json_bytes_{key}"] = len(first.raw)
                result[f"parts_{key}"] = {
                    name: round(statistics.median(w[i].parts[name] for w in warm), 1)
                    for i in (1, 2)
                    for name in warm[-1][i].parts
                }
                hot = rest.json()["hot"]
                result[f"hot_rank_{key}"] = hot and hot["rank"]
                print(
                    f"{key}: first paint cold {result[f'cold_ms_{key}']} ms, warm "
                    f"{[round(x) for x in paint]} ms, "
                    f"{result[f'first_paint_bytes_{key}']:,} bytes; "
                    f"whole page {[round(x) for x in full]} ms, "
                    f"{result[f'full_bytes_{key}']:,} bytes; parts {result[f'parts_{key}']}",
                    file=sys.stderr,
                )
                seen = in_browser(url, run, args.repeat)
                if isinstance(seen, str):
                    result["browser"] = seen
                    seen = {}
                result[f"fcp_ms_{key}"] = seen and round(seen["fcp"], 1)
                result[f"charts_ms_{key}"] = seen and round(seen["charts"], 1)
                result[f"bytes_{key}"] = seen and int(seen["bytes"])
                print(f"{key} in Chromium: {seen}", file=sys.stderr)
        finally:
            stop_server(proc)
    result["stored_rows"] = stored
    met = [
        result.get(f"{k}_{key}") is not None and result[f"{k}_{key}"] < goal  # type: ignore[operator]
        for key in ("1k", "16k")
        for k, goal in (("fcp_ms", 500), ("charts_ms", 1000), ("bytes", 1_000_000))
    ]
    result["ok"] = all(met) if "browser" not in result else None
    emit(result)


if __name__ == "__main__":
    main()
