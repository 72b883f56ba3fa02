"""Scheduler record importers: Slurm sacct text and the real Alibaba 2023 GPU trace."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from fleetlens.analysis.scheduling import PoolCapacity, scheduling_goodput
from fleetlens.errors import FleetlensError
from fleetlens.importers.alibaba import parse_nodes, parse_pods
from fleetlens.importers.sacct import parse_sacct
from fleetlens.services.goodput import GoodputQueries
from fleetlens.store.chdb_store import ChdbStore

pytestmark = pytest.mark.unit

ALIBABA = (
    Path(__file__).resolve().parent / "data" / "real" / "cluster_traces" / "alibaba_openb_v2023"
)

SACCT = """JobID|JobName|Partition|AllocTRES|Submit|Start|End|State|NNodes
100|pretrain|gpu|billing=128,cpu=128,gres/gpu=16,mem=1T,node=2|2024-05-01T00:00:00|2024-05-01T01:00:00|2024-05-01T11:00:00|COMPLETED|2
100.batch|batch|||2024-05-01T01:00:00|2024-05-01T01:00:00|2024-05-01T11:00:00|COMPLETED|1
100.0|python|||2024-05-01T01:00:10|2024-05-01T01:00:10|2024-05-01T11:00:00|COMPLETED|2
101|eval|gpu|cpu=8,gres/gpu:h100=4,gres/gpu=4,node=1|2024-05-01T02:00:00|2024-05-01T02:30:00|Unknown|RUNNING|1
102|sweep|gpu|cpu=4,node=1|2024-05-01T03:00:00|Unknown|Unknown|PENDING|1
103_7|arr|gpu|gres/gpu=8,node=1|2024-05-01T04:00:00|2024-05-01T04:00:00|\
2024-05-01T05:00:00|CANCELLED by 1000|1
"""


@pytest.fixture
def store(tmp_path) -> Iterator[ChdbStore]:  # type: ignore[no-untyped-def]
    s = ChdbStore(str(tmp_path / "telemetry"))
    try:
        yield s
    finally:
        s.close()


def test_sacct_jobs_gpus_times_and_states() -> None:
    a = parse_sacct(SACCT.splitlines(keepends=True))
    assert a.job_id.tolist() == ["100", "101", "102", "103_7"]
    assert a.gpus.tolist() == [16, 4, 0, 8]
    assert a.state.tolist() == ["COMPLETED", "RUNNING", "PENDING", "CANCELLED"]
    assert a.start[0] - a.submit[0] == 3600.0
    assert a.submit[0] == 1714521600.0  # 2024-05-01T00:00:00Z
    assert math.isnan(a.end[1]) and math.isnan(a.start[2])
    assert (a.gang_complete[~np.isnan(a.start)] == a.start[~np.isnan(a.start)]).all()
    r = scheduling_goodput(
        a.gpu_share, a.submit, a.start, a.gang_complete, a.end, PoolCapacity.constant(32),
        window=(a.submit[0], a.submit[0] + 12 * 3600),
    )  # fmt: skip
    # 16 GPUs x 10 h + 4 x 9.5 h + 8 x 1 h held, of 32 x 12 h.
    assert r.complete_gpu_s / 3600 == pytest.approx(160 + 38 + 8)
    assert r.scheduling_goodput == pytest.approx(206 / 384)
    assert r.queue_wait_s["max"] == 3600.0


# Recorded from a real Slurm 22.05.8 with slurmdbd (tests/slurmstack.py, gpus=4, accounting=True;
# tests/test_scheduler_import.py runs the same jobs), TZ=UTC, 2026-12-01.
SACCT_REAL = """JobID|JobName|Partition|AllocTRES|Submit|Start|End|State|NNodes
1|pretrain|debug|billing=1,cpu=1,gres/gpu=4,mem=1M,node=1|2026-12-01T17:27:57|2026-12-01T17:27:59|2026-12-01T17:28:02|COMPLETED|1
2|eval|debug|billing=1,cpu=1,gres/gpu=2,mem=1M,node=1|2026-12-01T17:27:57|2026-12-01T17:28:03|2026-12-01T17:28:05|COMPLETED|1
3|sweep|debug||2026-12-01T17:27:57|2026-12-01T17:27:58|2026-12-01T17:27:58|CANCELLED by 0|1
"""


def test_sacct_job_cancelled_while_it_waited_never_started() -> None:
    a = parse_sacct(SACCT_REAL.splitlines(keepends=True))
    assert a.gpus.tolist() == [4, 2, 0]
    assert a.start[1] - a.submit[1] == 6.0  # eval waited for pretrain's GPUs
    # Slurm gives the cancelled job a Start (its cancel time) but no AllocTRES: no allocation.
    assert math.isnan(a.start[2]) and a.end[2] - a.submit[2] == 1.0
    assert a.state.tolist() == ["COMPLETED", "COMPLETED", "CANCELLED"]


def test_sacct_refuses_a_wrong_format() -> None:
    with pytest.raises(FleetlensError, match="--parsable2"):
        parse_sacct(["JobID|State\n", "1|COMPLETED\n"])
    with pytest.raises(FleetlensError, match="ISO time"):
        parse_sacct(
            [SACCT.splitlines()[0] + "\n", "1|x|gpu|gres/gpu=1|05/01-10:00|x|x|RUNNING|1\n"]
        )


def test_partial_gangs_and_idle_capacity_are_scheduling_losses() -> None:
    # A 8-GPU gang held from t=0 but complete only at t=50; nothing else runs; a job queued.
    r = scheduling_goodput(
        np.array([8.0, 4.0]), np.array([0.0, 0.0]), np.array([0.0, np.nan]),
        np.array([50.0, np.nan]), np.array([100.0, np.nan]), PoolCapacity.constant(16, 12),
        window=(0.0, 100.0),
    )  # fmt: skip
    assert r.complete_gpu_s == 400 and r.partial_gpu_s == 400
    assert r.in_service_gpu_s == 1200 and r.availability == pytest.approx(0.75)
    assert r.scheduling_goodput == pytest.approx(400 / 1200)
    assert r.stranded_gpu_s == pytest.approx(400)  # 4 idle GPUs while a job waited
    total = r.complete_gpu_s + r.partial_gpu_s + r.stranded_gpu_s + r.no_demand_gpu_s
    assert total == pytest.approx(r.in_service_gpu_s)
    assert r.pending == 1


def test_alibaba_2023_trace_real_figures() -> None:
    with open(ALIBABA / "openb_pod_list_default.csv") as fh:
        pods = parse_pods(fh)
    with open(ALIBABA / "openb_node_list_gpu_node.csv") as fh:
        nodes = parse_nodes(fh)
    assert nodes.capacity_gpus.tolist() == [6212]
    assert len(pods) == 7064  # GPU pods of the 8,152 (1,088 are CPU-only)
    assert int(np.isnan(pods.start).sum()) == 861  # never scheduled
    cap = PoolCapacity.constant(6212)
    r = scheduling_goodput(pods.gpu_share, pods.submit, pods.start, pods.gang_complete,
                           pods.end, cap)  # fmt: skip
    whole = scheduling_goodput(pods.gpus.astype(float), pods.submit, pods.start,
                               pods.gang_complete, pods.end, cap)  # fmt: skip
    # The pod list is a sample: it holds at most ~51 GPUs of 6,212 at once.
    assert r.scheduling_goodput == pytest.approx(0.00231, abs=0.00002)
    assert r.complete_gpu_s / 3600 == pytest.approx(51_471, rel=0.001)
    assert whole.complete_gpu_s / 3600 == pytest.approx(59_612, rel=0.001)
    assert r.complete_gpu_s / whole.complete_gpu_s == pytest.approx(0.863, abs=0.001)
    w = r.queue_wait_s
    assert (w["p50"], w["p90"]) == (2.0, 139.0)
    assert w["p99"] == pytest.approx(1108.8, abs=0.1)
    assert r.partial_gpu_s == 0.0


def test_alibaba_into_the_store_and_back(store: ChdbStore) -> None:
    with open(ALIBABA / "openb_pod_list_default.csv") as fh:
        pods = parse_pods(fh, epoch=1.6e9)
    with open(ALIBABA / "openb_node_list_gpu_node.csv") as fh:
        nodes = parse_nodes(fh, time=1.6e9)
    store.insert("sched_alloc", pa.table(pods.columns()), {"tenant": "default"}, "alibaba")
    store.insert("sched_pool", pa.table(nodes.columns()), {"tenant": "default"}, "nodes")
    q = GoodputQueries(store, "default")
    assert q.pools() == ["openb"]
    span = q.time_span("openb")
    assert span is not None
    got = q.pool_scheduling("openb", *span)
    want = scheduling_goodput(
        pods.gpus.astype(float), pods.submit, pods.start, pods.gang_complete, pods.end,
        PoolCapacity.constant(6212), window=span,
    )  # fmt: skip
    assert got.scheduling_goodput == pytest.approx(want.scheduling_goodput)
    assert got.queue_wait_s == pytest.approx(want.queue_wait_s)
    assert GoodputQueries(store, "other").pools() == []


def test_sinfo_counts_each_partitions_gpus_and_leaves_out_nodes_out_of_service() -> None:
    from fleetlens.importers.sinfo import parse_sinfo

    text = """NODELIST|PARTITION|STATE|GRES
a1|gpu*|mixed|gpu:h100:8(S:0-1)
a2|gpu*|down*|gpu:h100:8(S:0-1)
a3|gpu*|drained|gpu:h100:8(S:0-1)
a4|gpu*|draining|gpu:h100:8(S:0-1)
a5|gpu*|idle~|gpu:a100:4,gpu:l4:2,shard:8
a5|long|allocated|gpu:a100:4,gpu:l4:2,shard:8
c1|cpu|idle|(null)
"""
    rows = parse_sinfo(text.splitlines(keepends=True), time=5.0)
    assert rows.pool.tolist() == ["gpu", "long"]  # the CPU partition has no GPUs
    assert rows.capacity_gpus.tolist() == [38, 6]
    assert rows.in_service_gpus.tolist() == [14, 6]  # down*, drained, draining are out
    assert rows.time.tolist() == [5.0, 5.0]
    with pytest.raises(FleetlensError, match="--Node"):
        parse_sinfo(["NODELIST|PARTITION|STATE|GRES\n", "a[1-4]|gpu|idle|gpu:8\n"], time=0)
    with pytest.raises(FleetlensError, match="GRES"):
        parse_sinfo(["PARTITION AVAIL TIMELIMIT NODES STATE NODELIST\n"], time=0)


def test_k8s_pods_events_groups_gangs_and_reads_their_times() -> None:
    import json

    from fleetlens.importers.k8s import parse_k8s

    doc = json.loads((Path(__file__).parent / "data" / "k8s" / "pods_events.json").read_text())
    jobs = parse_k8s(doc)
    a = jobs.allocations
    assert a.job_id.tolist() == ["llm/pretrain-7b", "llm/finetune-2n", "llm/eval-sweep"]
    assert a.gpus.tolist() == [16, 16, 1]
    assert jobs.pods == {"llm/pretrain-7b": 2, "llm/finetune-2n": 2, "llm/eval-sweep": 1}
    assert math.isinf(a.gang_complete[1]) and math.isnan(a.start[2])
    # Without the PodScheduled condition the Scheduled event's time is used.
    pod = next(i for i in doc["items"] if i["metadata"]["name"] == "pretrain-7b-worker-0")
    pod["status"]["conditions"] = [c for c in pod["status"]["conditions"]
                                   if c["type"] != "PodScheduled"]  # fmt: skip
    pod["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": {
        "nvidia.com/gpu": "12"}}}]  # fmt: skip
    again = parse_k8s(doc).allocations
    assert again.gang_complete[0] - again.submit[0] == pytest.approx(42.482913)
    assert again.gpus[0] == 8 + 12  # the init container holds more than the main one
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "two"
    with pytest.raises(FleetlensError, match=r"items\[1\]\.spec\.containers\[0\].*whole number"):
        parse_k8s(doc)
    with pytest.raises(FleetlensError, match="kubectl get pods,events -o json"):
        parse_k8s([])
