"""A data stall traced to the dataset shard, the storage and the prefetch (seed 001 s13, s27).

Eight real SDK runs (one per rank, in this process) train against a real server and report
their input pipeline with ``Run.data``: the shard each reads (they move to the next shard every
20 steps), the storage read latency, the prefetch queue's depth and the cache hit rate. Reading
one shard is slow (its objects live on a degraded storage target): whichever rank reads it waits
~0.4 s per step for data, its reads take 400 ms instead of 10 ms and its prefetch queue runs dry.
Three ranks read it in turn. The finding must name the shard and the storage latency, not only
the ranks.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import fleetlens
from fleetlens.analysis.datapipe import data_causes
from fleetlens.scalars import DATA_SCALARS
from fleetlens.testing import Server, wait_until

pytestmark = pytest.mark.e2e

_SLOW = "s3://corpus/v3/shard-00005"


def _shard(rank: int, step: int) -> str:
    return f"s3://corpus/v3/shard-{(rank + step // 20) % 8:05d}"


def test_a_data_stall_names_its_shard_storage_latency_and_empty_prefetch(
    server: Server, tmp_path: Path
) -> None:
    runs = [
        fleetlens.init(project="p", run_id="starved", rank=r, world_size=8,
                       node_id=f"node-{r // 4}", gpu=r % 4, server=server.url,
                       spool_dir=str(tmp_path / f"spool-{r}"), install_signal_handler=False)
        for r in range(8)
    ]  # fmt: skip
    rng = np.random.default_rng(3)
    for step in range(60):
        for r, run in enumerate(runs):
            slow = _shard(r, step) == _SLOW
            with run.step(step, tokens=4096):
                run.add_phase("data", (0.4 if slow else 0.002) * rng.uniform(0.9, 1.1))
                run.add_phase("forward", 0.08 * rng.uniform(0.97, 1.03))
                run.add_phase("backward", 0.16 * rng.uniform(0.97, 1.03))
            run.data(step, shard=_shard(r, step), version="v3",
                     read_latency_s=(0.4 if slow else 0.01) * rng.uniform(0.8, 1.2),
                     queue_depth=0 if slow else 4, cache_hit_rate=0.9)  # fmt: skip
    for run in runs:
        run.finish()

    def stall() -> dict | None:  # type: ignore[type-arg]
        doc = server.get("/v1/runs/starved/diagnosis")
        return next((f for f in doc["findings"] if f["diagnosis"] == "data_stall"), None)

    finding = wait_until(stall, 30, what="a data_stall finding")
    assert finding["owner"] == "data_pipeline"
    summary = finding["summary"]
    assert f"dataset shard {_SLOW}" in summary, summary
    assert "storage read latency p99" in summary and "prefetch queue empty" in summary, summary
    assert "cache hit rate" not in summary  # the cache was fine
    shard = next(e for e in finding["evidence"] if e["metric"] == "dataset shard")
    assert shard["value"] == _SLOW and shard["stalledShare"] > 0.9, shard
    latency = next(e for e in finding["evidence"] if e["metric"].startswith("data/storage"))
    assert latency["value"] > 10 * latency["baseline"], latency
    # Only the slow shard is blamed, though three different ranks stalled on it.
    assert summary.count("shard-") == 1 and len(finding["ranks"]) >= 2, finding


def test_no_cause_is_named_without_the_signals_or_when_every_shard_stalls() -> None:
    steps = np.arange(40)
    stalled = np.zeros((40, 4), dtype=bool)
    stalled[10:30, 1] = True
    assert data_causes(steps, stalled, [], {}) == ([], [])  # a job that does not call data()
    # Every rank reads the one shard, and only rank 1 stalls: the shard is not the cause.
    one = [(r, 0, "shard-0") for r in range(4)]
    assert data_causes(steps, stalled, one, {})[0] == []
    # The cache is what changed: hit rate 30% in the stalled rank-steps, 95% elsewhere.
    st, rk = np.meshgrid(steps, np.arange(4), indexing="ij")
    hit = np.where(stalled, 0.3, 0.95)
    name = DATA_SCALARS["cache_hit_rate"]
    phrases, ev = data_causes(steps, stalled, [], {name: (st.ravel(), rk.ravel(), hit.ravel())})
    assert phrases == ["cache hit rate 30% (typical 95%)"] and ev[0]["metric"] == f"{name} median"


def test_an_empty_prefetch_queue_raises_the_seeds_alert_and_its_series(tmp_path: Path) -> None:
    """Seed 001 s36 "prefetch queue empty", end to end: two ranks whose loaders run dry, a real
    server sampling the run every second with the rule's window shortened to 3 s."""
    (tmp_path / "server.toml").write_text("[monitor]\ninterval_s = 0.5\ngoodput_every_s = 0.5\n")
    (tmp_path / "policy.yaml").write_text(
        "rules:\n  PrefetchQueueEmpty: {for_s: 3}\n  DataloaderWaitHigh: {for_s: 3}\n"
    )
    server = Server(str(tmp_path / "data"), extra_args=(
        "--config", str(tmp_path / "server.toml"),
        "--alert-policy", str(tmp_path / "policy.yaml"))).start()  # fmt: skip
    runs = [
        fleetlens.init(project="p", run_id="dry", rank=r, world_size=2, server=server.url,
                       spool_dir=str(tmp_path / f"spool-{r}"), install_signal_handler=False,
                       flush_interval=0.2)
        for r in range(2)
    ]  # fmt: skip

    def firing() -> list[str]:
        alerts = server.get("/v1/alerts")["alerts"]
        return sorted(a["labels"]["alertname"] for a in alerts if a["state"] == "firing")

    try:
        deadline, step = time.monotonic() + 60, 0
        while time.monotonic() < deadline and "PrefetchQueueEmpty" not in firing():
            for run in runs:  # healthy for 6 s, then the loaders run dry
                dry = step >= 30
                with run.step(step, tokens=4096):
                    run.add_phase("data", 0.05 if dry else 0.001)
                    run.add_phase("forward", 0.05)
                run.data(step, queue_depth=0 if dry else 4, read_latency_s=0.01)
            step += 1
            time.sleep(0.2)
        names = firing()
        assert "PrefetchQueueEmpty" in names and "DataloaderWaitHigh" in names, names
        alert = next(a for a in server.get("/v1/alerts")["alerts"]
                     if a["labels"]["alertname"] == "PrefetchQueueEmpty")  # fmt: skip
        assert alert["labels"]["severity"] == "ticket" and alert["labels"]["run_id"] == "dry"
        status, metrics = server.request("GET", "/metrics")
        assert status == 200
        line = next(
            ln
            for ln in metrics.splitlines()
            if ln.startswith("fleetlens_run_prefetch_empty_ratio{") and 'run_id="dry"' in ln
        )
        assert float(line.rsplit(" ", 1)[1]) > 0.5, line  # fmt: skip
    finally:
        for run in runs:
            run.finish()
        server.stop()
