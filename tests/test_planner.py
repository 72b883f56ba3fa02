"""A planner's week: runs over several days on a 32-GPU pool, read back from the capacity API and
page, against a hand computation.

Before: a run's GPU-hours held were the whole period's wall clock (the time before it started
and after it ended counted as "unaccounted"): 480 GPU-hours held in 24 h by runs that held 72,
4,704 in 7 days for 136; a pool known only from its capacity snapshots (sinfo) counted for
nothing; and there was no fleet goodput over time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from fleetlens.testing import Server, step_batch, wait_until
from fleetlens.wire import TableBuilder, encode_batch

from .test_portal import playwright
from .test_portal_run import _wide

pytestmark = pytest.mark.e2e

H = 3600.0
PERIOD = 72.0  # a step starts every 72 s (step_batch: 1.2 x its duration) and lasts 60 s
STEP = 60.0
GPUS = 32
PRICE = 2.0


def _runs(t: float) -> dict[str, tuple[int, float, int]]:
    """Run -> (ranks, first step's start, steps): 4 h five days ago, 6 h across the 24 h
    boundary, 2 h in the last three hours."""
    return {
        "plan-a": (8, t - 5 * 24 * H, 200),
        "plan-b": (16, t - 26 * H, 300),
        "plan-c": (4, t - 3 * H, 100),
    }


@pytest.fixture(scope="module")
def week(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Server, dict[str, Any], float]]:
    srv = Server(str(tmp_path_factory.mktemp("planner") / "data")).start()
    try:
        t = time.time()
        runs = _runs(t)
        for rid, (ranks, start, n) in runs.items():
            for lo in range(0, n, 100):
                ctx = {"project": "planning"}
                _, body = step_batch(
                    rid, range(lo, min(n, lo + 100)), ranks, job_id=f"{rid}-a0", base=STEP,
                    t0=start + lo * PERIOD, ctx=ctx,
                )  # fmt: skip
                assert srv.post(body)[0] == 200
        # The pool's capacity: 4 nodes of 8 GPUs, in service since before the week.
        sinfo = "NODELIST|PARTITION|STATE|GRES\n" + "".join(
            f"n{i}|gpu|mixed|gpu:8\n" for i in range(4)
        )
        # plan-a failed, plan-c finished (a job's own word, for all its ranks); plan-b said
        # nothing (stalled).
        for rid, kind in (("plan-a", "failure"), ("plan-c", "finish")):
            ranks, start, n = runs[rid]
            ev = TableBuilder("event")
            ev.add("time", [start + (n - 1) * PERIOD + STEP]).add("kind", [kind])
            ev.add_packed("rank", np.array([-1], dtype="<i4").tobytes())
            ctx = {"run_id": rid, "job_id": f"{rid}-a0", "project": "planning"}
            assert srv.post(encode_batch({"event": ev.build()}, ctx)[1])[0] == 200
        for at in (t - 8 * 24 * H, t):  # a snapshot before the week, and one now
            body = {"format": "sinfo", "data": sinfo, "time": at}
            got = srv.request("POST", "/v1/scheduler/import", body)
            assert got[0] == 200, got

        def registered() -> bool:  # the run registry is written behind ingest (every 2 s)
            last = {r["runId"]: r["lastStep"] for r in srv.get("/v1/runs")["runs"]}
            return all(last.get(rid) == n - 1 for rid, (_, _, n) in runs.items())

        wait_until(registered, what="every run's last step in the registry")
        yield srv, runs, t
    finally:
        srv.stop()


def _by_hand(
    runs: dict[str, tuple[int, float, int]], t0: float, t1: float, pool_end: float = math.inf
) -> dict[str, float]:
    """GPU-hours held (a run's first step's start to its last step's end, cut to the period)
    and useful (the steps' time in the period: no fault, no straggler, so every step is
    productive and the gaps between them are not)."""
    held = useful = 0.0
    for ranks, start, n in runs.values():
        end = start + (n - 1) * PERIOD + STEP
        held += ranks * max(0.0, min(t1, end) - max(t0, start)) / H
        for i in range(n):
            a = start + i * PERIOD
            useful += ranks * max(0.0, min(t1, a + STEP) - max(t0, a)) / H
    in_service = GPUS * (min(t1, pool_end) - t0) / H  # from the pool's snapshots, to its last
    base = max(in_service, held)
    return {
        "inService": in_service,
        "held": held,
        "useful": useful,
        "utilization": held / base if base else math.nan,
        "goodput": useful / base if base else math.nan,
        "cost": PRICE * base / useful if useful else math.nan,
    }


@pytest.mark.parametrize("hours", [24, 168])
def test_capacity_gpu_hours_goodput_and_cost_equal_a_hand_computation(
    week: tuple[Server, dict[str, Any], float], hours: int
) -> None:
    srv, runs, now = week
    d = srv.get(f"/v1/portal/capacity?periodHours={hours}&price={PRICE}")
    want = _by_hand(runs, d["period"]["from"], d["period"]["to"], now)
    assert d["warnings"] == [] and d["runs"] == (2 if hours == 24 else 3)
    assert d["inServiceGpuHours"] == pytest.approx(want["inService"], rel=1e-9)
    assert d["heldGpuHours"] == pytest.approx(want["held"], rel=1e-6)
    assert d["goodput"] == pytest.approx(want["goodput"], rel=1e-6)
    assert d["utilization"] == pytest.approx(want["utilization"], rel=1e-6)
    assert d["costPerUsefulGpuHour"] == pytest.approx(want["cost"], rel=1e-6)
    useful = next(w["gpuHours"] for w in d["waterfall"] if w["step"] == "useful")
    assert useful == pytest.approx(want["useful"], rel=1e-6)
    # Bucket by bucket (hours for a day, days for a week), adding up to the period's figures.
    series = d["series"]
    assert len(series) == (25 if hours == 24 else 8), [b["from"] for b in series]
    assert series[0]["from"] == d["period"]["from"] and series[-1]["to"] == d["period"]["to"]
    for key, total in (("heldGpuHours", want["held"]), ("usefulGpuHours", want["useful"]),
                       ("inServiceGpuHours", want["inService"])):  # fmt: skip
        assert sum(b[key] for b in series) == pytest.approx(total, rel=1e-6), key
    # How the runs ended, and their GPU-hours by size.
    jobs = d["jobs"]
    if hours == 168:
        assert jobs["byStatus"] == {"FAILED": 1, "FINISHED": 1, "STALLED": 1}, jobs
        assert (jobs["ended"], jobs["successRate"]) == (2, 0.5)
    else:
        assert jobs["byStatus"] == {"FINISHED": 1, "STALLED": 1} and jobs["successRate"] == 1.0
    sizes = {c["size"]: c for c in jobs["cohorts"]}
    small = {k: v for k, v in runs.items() if k != "plan-b"}  # 8 and 4 GPUs
    for size, members in (("1-8 GPUs", small), ("9-64 GPUs", {"plan-b": runs["plan-b"]})):
        hand = _by_hand(members, d["period"]["from"], d["period"]["to"])
        assert sizes[size]["heldGpuHours"] == pytest.approx(hand["held"], rel=1e-6)
        assert sizes[size]["usefulGpuHours"] == pytest.approx(hand["useful"], rel=1e-6)
    # The spare pool at its tightest bucket (the hours plan-b held 16 of the 32 GPUs, when the
    # buckets are hours).
    spare = []
    for b in d["series"]:
        hand = _by_hand(runs, b["from"], b["to"], now)
        spare.append((hand["inService"] - hand["held"]) * H / (b["to"] - b["from"]))
    assert d["spareGpusMin"] == pytest.approx(min(spare), rel=1e-6)
    if hours == 24:
        assert d["spareGpusMin"] == pytest.approx(GPUS - 16, rel=1e-6)
    # One bucket by hand: plan-c alone, a whole hour inside its two.
    one = next(b for b in series if b["from"] <= runs["plan-c"][1] + 1.5 * H < b["to"])
    if one["to"] - one["from"] == H:
        hand = _by_hand({"c": runs["plan-c"]}, one["from"], one["to"])
        assert one["inServiceGpuHours"] == pytest.approx(GPUS, rel=1e-9)
        assert one["heldGpuHours"] == pytest.approx(hand["held"], rel=1e-6)
        assert one["usefulGpuHours"] == pytest.approx(hand["useful"], rel=1e-6)


def test_the_capacity_page_shows_the_same_figures(
    week: tuple[Server, dict[str, Any], float], browser: Any
) -> None:
    """Everything on record: the runs ended and the pool's last snapshot is past, so the
    figures do not move between the API's read and the page's."""
    srv, _, _ = week
    d = srv.get(f"/v1/portal/capacity?price={PRICE}")
    page, errors = _wide(browser, f"{srv.url}/capacity?period=&price=2")
    cards = page.inner_text("#cap-now")
    assert f"{100 * d['utilization']:.1f}%" in cards and f"{100 * d['goodput']:.1f}%" in cards
    assert f"${d['costPerUsefulGpuHour']:.2f} at $2.00/GPU-h" in cards, cards
    rows = page.locator("#fleet-series tbody tr")
    assert rows.count() == len(d["series"]) >= 9  # a day a bucket over the nine on record
    held = [float(t.replace(",", "")) for t in rows.locator("td:nth-child(3)").all_inner_texts()]
    assert sum(held) == pytest.approx(d["heldGpuHours"], abs=0.1 * len(held))
    jobs = page.inner_text("#cap-jobs-text")
    assert "Success rate 50.0% of 2 ended runs (1 failed, 1 finished, 1 stalled)" in jobs, jobs
    sizes = page.locator("#cohorts tbody th").all_inner_texts()
    assert sizes == ["1-8 GPUs", "9-64 GPUs"], sizes
    assert page.locator("#chart-fleet-share canvas").count() >= 1
    assert page.locator("#chart-fleet-hours canvas").count() >= 1
    page.close()
    assert errors == []


@pytest.fixture(scope="module")
def two_pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, float]]:
    """Pool ``a`` (16 GPUs) ran Slurm job 7001 (run ``pool-a-run``, 8 ranks, 2 h), pool ``b``
    (8 GPUs) job 7002 (run ``pool-b-run``, 4 ranks, 1 h): the runs' job attempts are the
    scheduler's job ids, as the SDK names them under Slurm."""
    srv = Server(str(tmp_path_factory.mktemp("pools") / "data")).start()
    try:
        t = time.time()
        for rid, job, ranks, start, n in (
            ("pool-a-run", "7001", 8, t - 5 * H, 100),
            ("pool-b-run", "7002", 4, t - 3 * H, 50),
        ):
            _, body = step_batch(rid, range(n), ranks, job_id=job, base=STEP, t0=start)
            assert srv.post(body)[0] == 200
        sinfo = (
            "NODELIST|PARTITION|STATE|GRES\na0|a|mixed|gpu:8\na1|a|mixed|gpu:8\nb0|b|idle|gpu:8\n"
        )
        sacct = (
            "JobID|JobName|Partition|AllocTRES|Submit|Start|End|State|NNodes\n"
            "7001|pretrain|a|gres/gpu=8,node=1|2026-01-01T00:00:00|2026-01-01T00:00:00"
            "|2026-01-01T02:00:00|COMPLETED|1\n"
            "7002|finetune|b|gres/gpu=4,node=1|2026-01-01T00:00:00|2026-01-01T00:00:00"
            "|2026-01-01T01:00:00|COMPLETED|1\n"
        )
        for at in (t - 2 * 24 * H, t):
            got = srv.request(
                "POST", "/v1/scheduler/import", {"format": "sinfo", "data": sinfo, "time": at}
            )
            assert got[0] == 200, got
        got = srv.request("POST", "/v1/scheduler/import", {"format": "sacct", "data": sacct})
        assert got[0] == 200, got
        wait_until(
            lambda: len([r for r in srv.get("/v1/runs")["runs"] if r["lastStep"] is not None]) == 2,
            what="both runs registered",
        )
        yield srv, t
    finally:
        srv.stop()


def test_the_capacity_of_one_pool_counts_its_capacity_and_its_runs_only(
    two_pools: tuple[Server, float], browser: Any
) -> None:
    srv, _ = two_pools
    every = srv.get("/v1/portal/capacity?periodHours=24")
    assert every["poolNames"] == ["a", "b"] and every["runs"] == 2
    assert every["inServiceGpuHours"] == pytest.approx(24 * 24, rel=1e-3)
    held = {}
    for pool, gpus, ranks, n in (
        ("a", 16, 8, 100),
        ("b", 8, 4, 50),
    ):
        d = srv.get(f"/v1/portal/capacity?periodHours=24&pool={pool}")
        assert d["pool"] == pool and [p["pool"] for p in d["pools"]] == [pool]
        assert d["runs"] == 1 and d["inServiceGpuHours"] == pytest.approx(gpus * 24, rel=1e-3)
        # held by hand: the run's first step's start to its last step's end, by its ranks
        held[pool] = ranks * ((n - 1) * PERIOD + STEP) / H
        assert d["heldGpuHours"] == pytest.approx(held[pool], rel=1e-3), (pool, d["heldGpuHours"])
        assert sum(b["heldGpuHours"] for b in d["series"]) == pytest.approx(held[pool], rel=1e-3)
    assert every["heldGpuHours"] == pytest.approx(held["a"] + held["b"], rel=1e-3)
    status, body = srv.request("GET", "/v1/portal/capacity?pool=nope")
    assert status == 404 and "nope" in str(body)
    # The page: the pool picked from the list, kept in the URL.
    page, errors = _wide(browser, f"{srv.url}/capacity?period=24&price=2")
    page.select_option("#cap-pool", "b")
    page.click("#cap-form button[type=submit]")
    playwright.expect(page.locator("#cap-period-text")).to_contain_text("1 runs of pool b")
    assert "pool=b" in page.url
    page.close()
    assert errors == []
