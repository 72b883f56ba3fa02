"""First render of the portal's run page on big runs: in the browser, server time and bytes.

Two runs, 1,024 ranks and 16,384 ranks, 100,000 steps each (``--quick``: 10,000 and 1,000
steps), filled by **real ingest**: every rank's row of every step is posted to the server's
``POST /v1/ingest`` in the SDK's wire encoding (102 million and 1.64 billion rank-step rows),
and the per-step rollup ``steps_by_step``, the time rollups and the run registry are what the
server's own materialized views and registry make of them, partial rows and unmerged parts
included (nothing is written to the store directly). Each request carries 256 ranks' rows for
~780 steps (200,000 rows, what a group commit of many ranks' SDK batches hands the engine):
until the engine merges them, a step of the 16,384-rank run has 64 partial rows in the rollup.
Rank 777 computes 15 % slower; rank 0's requests also carry its loss, lr and grad_norm at every
step, a ``job_start`` event with the world size and a ``checkpoint_end`` every 1,000 steps. The
server's analysis loop waits a day between passes: a live server analyses each step as it
arrives, a pass at a time, and the page is read between passes; a fill of 1.64 billion rows in
an hour and a half would leave it a backlog of hours on this machine (~60 % of a core, reading
2 million rank-steps a pass), which would be measured instead of the page. ``--data DIR`` keeps
the store: a later call with the same folder sends only what the server lacks (a stopped fill
resumes; the full fill took 95 minutes on this 2-core machine and takes 29 GB). ``stored_*``:
the steps and ranks the server holds of each run.

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
``--repeat`` loads after one; ``heatmap_ms_*`` when the heatmap below the fold has been drawn
(each load waits for it, so that the next finds the server idle). Goals: < 500 ms, < 1,000 ms,
< 1 MB. Without Chromium these keys are null and ``browser`` says why.

Keys measured by a script instead of a browser: ``server_ms_1k``, ``first_paint_bytes_1k``,
``server_ms_16k``, ``first_paint_bytes_16k`` are the first paint (1 and 2; goals: < 300 ms,
< 1 MB), the median of ``--repeat`` renders after one cold render (the first
request for that run on a running server: ``cold_ms_*``; the server's very first request, which
also pays the engine's one-time start, is ``first_request_ms``, on a small third run);
``full_ms_*`` and ``full_bytes_*`` add 3 (the whole page); ``json_bytes_*`` is the first paint's
JSON before gzip; ``parts_*`` the server's own cost of each part (its ``Server-Timing`` header,
medians, ms). Nothing is cached between renders: a warm render computes everything again.
``ingest``: each run's rank-step rows, seconds and rows/s through ingest (of the fill that made
the store); ``hot_rank_*``: the rank the heatmap names (777, else ``ok`` is false).
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
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, stop_server
from ingest import post_all

from fleetlens.testing import free_port
from fleetlens.wire import TableBuilder, encode_batch

STEP_S, SLOW_RANK, TOKENS_PER_RANK = 2.0, 777, 4096

LAUNCH = """
import sys, uvicorn
from fleetlens.server import create_app, settle_heap
from fleetlens.config import ServerConfig
cfg = ServerConfig.resolve({"data_dir": sys.argv[1], "port": int(sys.argv[2]), "host": "127.0.0.1",
                           "analysis_interval_s": 86400.0})
app = create_app(cfg)
if not any(getattr(r, "path", "") == "/oncall" for r in app.routes):
    from fleetlens.api.portal import router as portal_router
    from fleetlens.ui.pages import router as pages_router
    app.include_router(portal_router)
    app.include_router(pages_router)
settle_heap()  # as fleetlens serve does
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


RANK_GROUP, BATCH_ROWS = 256, 200_000
HEADERS = {"Content-Type": "application/msgpack"}


def run_bodies(
    run: str, ranks: int, steps: int, todo: list[tuple[int, list[int]]], seed: int = 0
) -> Iterator[tuple[bytes, dict[str, str]]]:
    """The run's requests to ``POST /v1/ingest`` (the SDK's wire encoding) for ``todo`` (the first
    step of a span and the rank groups of it to send; see :func:`missing`), in step order: each
    carries one group of ``RANK_GROUP`` ranks' rows for a span of steps (``BATCH_ROWS`` rows), as
    a group commit of many ranks' SDK batches hands them to the engine; the first group's request
    also carries rank 0's scalars (loss, lr, grad_norm) and events (``job_start`` with the world
    size, ``checkpoint_end`` every 1,000 steps). Rank ``SLOW_RANK`` computes 15 % slower. Every
    request is the same whenever it is made (its values and batch id follow from the run, the
    span and the group), so a fill that was stopped resumes and a resent request is dropped."""
    t0 = 1.72e9
    dur = STEP_S * (1 + 0.02 * np.random.default_rng(seed).random(steps))
    start = t0 + np.cumsum(np.r_[0.0, dur[:-1]])
    group, span = spans_of(ranks)
    # Compute is 85 % of the step (the rest is communication), the slow rank's 15 % more.
    compute, slow = 0.85, 1.15
    ctx = {"run_id": run, "job_id": "a0", "project": "bench"}
    for s0, groups in todo:
        ss = np.arange(s0, min(steps, s0 + span), dtype="<i8")
        for g0 in groups:
            rng = np.random.default_rng([seed, s0, g0])
            st = np.repeat(ss, group)
            rk = np.tile(np.arange(g0, g0 + group, dtype="<i4"), len(ss))
            # A synchronous job: every rank's step lasts as long as the slowest's.
            d = np.repeat(dur[ss], group) * (1 - 0.001 * rng.random(len(st)))
            c = d * compute * (1 - 0.01 * rng.random(len(st)))
            c[rk == SLOW_RANK] *= slow
            tb = TableBuilder("step").add_packed("step", st.tobytes())
            tb.add_packed("rank", rk.tobytes()).add_packed(
                "time", np.repeat(start[ss], group).tobytes()
            )
            tb.add_packed("duration", d.tobytes()).add_packed("comm", (d - c).tobytes())
            tb.add_packed("tokens", np.full(len(st), TOKENS_PER_RANK, dtype="<i8").tobytes())
            tables = {"step": tb.build()}
            if g0 == 0:
                tables.update(rank0_tables(ss, start[ss] + dur[ss], ranks, rng))
            yield encode_batch(tables, ctx, batch_id=f"{run}:{s0}:{g0}")[1], HEADERS


def spans_of(ranks: int) -> tuple[int, int]:
    """Ranks per request and steps per request of a run of ``ranks`` ranks."""
    group = min(ranks, RANK_GROUP)
    return group, max(1, BATCH_ROWS // group)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=120) as r:
        return json.loads(r.read())


def missing(url: str, run: str, ranks: int, steps: int) -> list[tuple[int, list[int]]]:
    """What the server lacks of the run's first ``steps`` steps: (a span's first step, its rank
    groups not stored). Requests are sent in order over two connections, so only the spans
    around the last step stored can be partly there (a request is stored whole or not at all)."""
    group, span = spans_of(ranks)
    try:
        last = int(get_json(f"{url}/v1/runs/{run}")["lastStep"])
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
        last = -1
    k = last // span if last >= 0 else -2
    todo = []
    for j, s0 in enumerate(range(0, steps, span)):
        groups = list(range(0, ranks, group))
        if j < k - 1:
            continue
        if j <= k + 1:
            window = f"fromStep={s0}&toStep={s0}&limit={ranks}"
            have = {r["rank"] for r in get_json(f"{url}/v1/runs/{run}/ranks?{window}")["ranks"]}
            groups = [g for g in groups if g not in have]
        if groups:
            todo.append((s0, groups))
    return todo


def rank0_tables(
    ss: np.ndarray, end: np.ndarray, ranks: int, rng: np.random.Generator
) -> dict[str, Any]:
    """Rank 0's scalars and events for steps ``ss`` ending at ``end``."""
    names = ("loss", "lr", "grad_norm")
    vals = (4.0 * np.exp(-ss / 5e4) + 1.5, np.full(len(ss), 3e-4), 1 + 0.1 * rng.random(len(ss)))
    sc = TableBuilder("scalar").add_packed("step", np.tile(ss, 3).tobytes())
    sc.add_packed("time", np.tile(end, 3).tobytes()).add("name", [n for n in names for _ in ss])
    sc.add_packed("value", np.concatenate(vals).astype("<f8").tobytes())
    ck = ss % 1000 == 999
    kinds = ["checkpoint_end"] * int(ck.sum())
    ev_step, ev_time = list(ss[ck]), list(end[ck])
    attrs = ["{}"] * len(kinds)
    if ss[0] == 0:
        kinds, ev_step, ev_time = ["job_start", *kinds], [0, *ev_step], [end[0] - STEP_S, *ev_time]
        attrs = [json.dumps({"world_size": ranks}), *attrs]
    out = {"scalar": sc.build()}
    if kinds:
        ev = TableBuilder("event").add("kind", kinds).add("step", [int(x) for x in ev_step])
        out["event"] = ev.add("time", [float(x) for x in ev_time]).add("attrs", attrs).build()
    return out


def fill(url: str, runs: dict[str, tuple[str, int, int]]) -> dict[str, Any]:
    """Every run (id, ranks, steps) through the server's ingest over two connections, what the
    server lacks of it; the rows sent, seconds and rate of each."""
    out: dict[str, Any] = {}
    for key, (run, ranks, n) in runs.items():
        todo = missing(url, run, ranks, n)
        group, span = spans_of(ranks)
        rows = sum(group * (min(n, s0 + span) - s0) * len(g) for s0, g in todo)
        if not rows:
            continue
        seconds = post_all(url, run_bodies(run, ranks, n, todo), 2)
        out[key] = {"rank_steps": rows, "seconds": round(seconds, 1),
                    "rows_per_s": round(rows / seconds)}  # fmt: skip
        print(f"{run}: {rows:,} rank-step rows ingested in {seconds:.0f} s", file=sys.stderr)
    return out


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
  done({ fcp: fcp ? fcp.startTime : null, charts: performance.now(), bytes,
         findings: window.__findingsAt ?? null });
}))"""

# The frame that paints "What's wrong" once it has its first row (installed before the page's
# own scripts): the findings drawn, not the shell (a frame's callbacks run just before it paints).
_FINDINGS_SEEN = """new MutationObserver((_, obs) => {
  const tb = document.querySelector("#wrong-table tbody");
  if (tb && tb.rows.length) {
    obs.disconnect();
    requestAnimationFrame(() => { window.__findingsAt = performance.now(); });
  }
}).observe(document, { childList: true, subtree: true });"""


_DRAWN = "() => new Promise((done) => requestAnimationFrame(() => done(performance.now())))"


def in_browser(url: str, run: str, repeat: int) -> dict[str, float] | str:
    """Medians of ``repeat`` loads of the run page in Chromium after one (see the docstring);
    the reason as a string when there is no browser to measure with."""
    if not os.path.exists(CHROMIUM):
        return f"no {CHROMIUM} (apt-get install chromium)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "no playwright (pip install playwright)"
    loads, errors = [], []
    with sync_playwright() as p:
        flags = ["--no-sandbox", "--disable-gpu", "--no-first-run"]
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=flags)
        try:
            for _ in range(repeat + 1):
                ctx = browser.new_context(viewport={"width": 1440, "height": 900})
                ctx.add_init_script(_FINDINGS_SEEN)
                page = ctx.new_page()
                _count_errors(page, errors)
                page.goto(f"{url}/runs/{run}")
                page.wait_for_selector("body[data-painted=true]", timeout=120_000)
                load = page.evaluate(_MEASURE)
                # The heatmap below the fold, fetched after the first paint: the next load must
                # not find the server still working on this one's.
                page.wait_for_selector("body[data-heat-fetches]", timeout=120_000)
                load["heatmap"] = page.evaluate(_DRAWN)
                loads.append(load)
                ctx.close()
            # The planner's and on-call's pages: loaded (their data drawn) from navigation start.
            for name in ("capacity", "oncall"):
                for i in range(repeat + 1):
                    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
                    page = ctx.new_page()
                    _count_errors(page, errors)
                    page.goto(f"{url}/{name}")
                    page.wait_for_selector("body[data-loaded=true]", timeout=120_000)
                    loads[i][name] = page.evaluate(_DRAWN)
                    ctx.close()
        finally:
            browser.close()
    warm = loads[1:]
    keys = ("fcp", "findings", "charts", "bytes", "heatmap", "capacity", "oncall")
    out = {k: statistics.median(x[k] for x in warm) for k in keys}
    out["page_errors"] = len(errors)
    if errors:
        print(f"page errors: {errors[:10]}", file=sys.stderr)
    return out


def _count_errors(page: Any, errors: list[str]) -> None:
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"JavaScript: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"failed {r.url}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    quick = (
        "10,000 steps of 1,024 ranks and 1,000 of 16,384 instead of 100,000 of each, "
        "each page loaded once warm instead of 5 times"
    )
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--repeat", type=int, default=0, help="warm loads of each page (5)")
    ap.add_argument("--data", help="keep the store in this folder; a later call with the same "
                    "folder sends only what it lacks (a stopped fill resumes)")  # fmt: skip
    ap.add_argument("--steps", type=int, help="steps of each big run (default 100,000)")
    args = ap.parse_args()
    args.repeat = args.repeat or (1 if args.quick else 5)
    n = args.steps or 100_000
    steps = {"1k": 10_000, "16k": 1_000} if args.quick else {"1k": n, "16k": n}
    runs = {"small": ("bench-small", 8, 100), "1k": ("bench-1k", 1024, steps["1k"]),
            "16k": ("bench-16k", 16_384, steps["16k"])}  # fmt: skip
    result: dict[str, object] = {"bench": "portal", "quick": args.quick, "steps": steps}
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or tmp
        os.makedirs(data, exist_ok=True)
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
            result["ingest"] = fill(url, runs)
            time.sleep(2.5)  # the run registry is written at most every 2 s
            for key, (run, _, _) in runs.items():
                info = get_json(f"{url}/v1/runs/{run}")
                result[f"stored_{key}"] = {"steps": info["steps"], "ranks": info["worldSize"]}
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
                result[f"findings_paint_ms_{key}"] = seen and round(seen["findings"], 1)
                result[f"charts_ms_{key}"] = seen and round(seen["charts"], 1)
                result[f"bytes_{key}"] = seen and int(seen["bytes"])
                result[f"heatmap_ms_{key}"] = seen and round(seen["heatmap"], 1)
                if seen:
                    result["capacity_ms"] = round(seen["capacity"], 1)
                    result["oncall_ms"] = round(seen["oncall"], 1)
                    result["page_errors"] = int(result.get("page_errors", 0)) + seen["page_errors"]
                print(f"{key} in Chromium: {seen}", file=sys.stderr)
        finally:
            stop_server(proc)
    met = [
        result.get(f"{k}_{key}") is not None and result[f"{k}_{key}"] < goal  # type: ignore[operator]
        for key in ("1k", "16k")
        for k, goal in (
            ("findings_paint_ms", 500),
            ("charts_ms", 1000),
            ("heatmap_ms", 1500),
            ("bytes", 1_000_000),
        )
    ]
    met += [result.get(k) is not None and result[k] < 1000 for k in ("capacity_ms", "oncall_ms")]  # type: ignore[operator]
    met.append(result.get("page_errors") == 0)
    met += [result.get(f"hot_rank_{key}") == SLOW_RANK for key in ("1k", "16k")]
    result["ok"] = all(met) if "browser" not in result else None
    emit(result)


if __name__ == "__main__":
    main()
