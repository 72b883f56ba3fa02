"""``fleetlens import sacct|sinfo|k8s|alibaba FILE`` into a real server, read back through the API.

Each file goes through the CLI, in a subprocess, to ``POST /v1/scheduler/import``; the answers
come back from ``GET /v1/fleet/goodput``, ``GET /v1/scheduler/allocations`` and
``GET /v1/runs/{id}/goodput``, and are compared with what the library computes from the same
file today (tests/test_importers.py). Inputs: sacct and sinfo as a real one-host Slurm with
accounting prints them (tests/slurmstack.py: slurmctld, slurmd with four GPUs, slurmdbd on a
private MariaDB), the real Alibaba 2023 trace excerpt (tests/data/real/cluster_traces), the
sacct text of tests/test_importers.py, and a Kubernetes pod/event list (tests/data/k8s, see its
README).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fleetlens.analysis.scheduling import PoolCapacity, scheduling_goodput
from fleetlens.importers.alibaba import parse_pods
from fleetlens.importers.sacct import parse_sacct
from fleetlens.importers.sinfo import COMMAND as SINFO_COMMAND
from fleetlens.importers.sinfo import parse_sinfo
from fleetlens.testing import Server, step_batch
from fleetlens.wire import TableBuilder, encode_batch

from .slurmstack import binary, slurm_cluster
from .test_cli import fleetlens_cmd
from .test_importers import ALIBABA, SACCT

pytestmark = pytest.mark.e2e

K8S = Path(__file__).resolve().parent / "data" / "k8s" / "pods_events.json"
T0 = 1714521600.0  # 2024-05-01T00:00:00Z, the first submit of SACCT and the k8s list's origin

# The capacity of SACCT's partition `gpu`: four 8-GPU nodes, as sinfo prints it.
SINFO = """NODELIST|PARTITION|STATE|GRES
gpu-a1|gpu|mixed|gpu:h100:8(S:0-1)
gpu-a2|gpu|allocated|gpu:h100:8(S:0-1)
gpu-a3|gpu|idle|gpu:h100:8(S:0-1)
gpu-a4|gpu|idle|gpu:h100:8(S:0-1)
login1|cpu*|idle|(null)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(str(tmp_path_factory.mktemp("sched") / "data")).start()
    try:
        yield srv
    finally:
        srv.stop()


def _run(server: Server, run_id: str, slurm_job: str | None = None) -> None:
    """A run with a few steps; its ranks saw ``SLURM_JOB_ID`` when ``slurm_job`` is given."""
    ctx = {"run_id": run_id, "job_id": f"{run_id}-a0", "project": "llm"}
    env = {"SLURM_JOB_ID": slurm_job, "SLURM_PROCID": "0"} if slurm_job else {}
    ev = TableBuilder("event")
    ev.add("time", [time.time() - 100]).add("kind", ["job_start"])
    ev.add("attrs", [json.dumps({"launcher": {"name": "slurm", "env": env}, "world_size": 2})])
    assert server.post(encode_batch({"event": ev.build()}, ctx)[1])[0] == 200
    _, steps = step_batch(run_id, range(0, 10), 2, job_id=f"{run_id}-a0", ctx={"project": "llm"})
    assert server.post(steps)[0] == 200


def _import(server: Server, fmt: str, path: Path, *args: str) -> dict:  # type: ignore[type-arg]
    out = fleetlens_cmd("import", fmt, str(path), *args, "--server", server.url, "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_sacct_and_sinfo_give_the_librarys_figures_and_the_runs_scheduling_factor(
    server: Server, tmp_path: Path
) -> None:
    _run(server, "slurm-pretrain", slurm_job="100")
    (tmp_path / "sacct.txt").write_text(SACCT)
    (tmp_path / "sinfo.txt").write_text(SINFO)
    got = _import(server, "sacct", tmp_path / "sacct.txt")
    assert (got["stored"], got["allocations"], got["started"], got["pending"]) == (True, 4, 3, 1)
    cap = _import(server, "sinfo", tmp_path / "sinfo.txt", "--time", str(T0))
    assert cap["capacity"] == [{"pool": "gpu", "time": T0, "capacityGpus": 32, "inServiceGpus": 32}]
    # Without --json, the summary a person reads (the convention of every importer).
    dry = fleetlens_cmd("import", "sacct", str(tmp_path / "sacct.txt"), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[:2] == [
        "sacct: parsed (dry run, nothing stored)",
        f"  allocations 4 (3 started, 1 pending), {got['gpus']} GPUs, pools gpu",
    ], dry.stdout
    table = fleetlens_cmd("import", "sinfo", str(tmp_path / "sinfo.txt"), "--time", str(T0),
                          "--server", server.url).stdout.splitlines()  # fmt: skip
    assert table[0] == "sinfo: stored" and table[1].split()[0] == "POOL", table
    assert table[2].split() == ["gpu", "2024-05-01", "00:00:00", "32", "32"], table
    # The pool's figure over the 12 hours: what tests/test_importers.py computes, 206 / 384.
    fleet = server.get(f"/v1/fleet/goodput?pool=gpu&from={T0}&to={T0 + 12 * 3600}")
    (pool,) = fleet["pools"]
    assert pool["schedulingGoodput"] == pytest.approx(206 / 384)
    assert pool["queueWaitSeconds"]["max"] == 3600.0
    # The allocations as stored: job 100 held 16 GPUs 01:00 -> 11:00, 102 never started.
    allocs = server.get("/v1/scheduler/allocations?pool=gpu")["allocations"]
    by_job = {a["jobId"]: a for a in allocs}
    assert sorted(by_job) == ["100", "101", "102", "103_7"]
    a = by_job["100"]
    assert (a["gpus"], a["start"], a["end"], a["queueWaitSeconds"]) == (
        16, T0 + 3600, T0 + 11 * 3600, 3600.0
    )  # fmt: skip
    assert by_job["102"]["start"] is None and by_job["101"]["end"] is None
    # The run carries SLURM_JOB_ID=100: it inherits the pool's goodput while it held it.
    lib = parse_sacct(SACCT.splitlines(keepends=True))
    want = scheduling_goodput(
        lib.gpus.astype(float), lib.submit, lib.start, lib.gang_complete, lib.end,
        PoolCapacity(np.array([T0]), np.array([32.0]), np.array([32.0])),
        window=(T0 + 3600, T0 + 11 * 3600),
    ).scheduling_goodput  # fmt: skip
    g = server.get("/v1/runs/slurm-pretrain/goodput")
    assert g["scheduling"]["basis"] == "pool" and g["scheduling"]["jobs"] == ["100"]
    assert g["factors"]["scheduling"] == pytest.approx(want)
    assert 0.5 < want < 0.9  # the pool was not full: a figure below 1 the default would hide
    # The manual figure still overrides, and the CLI prints what the API answers.
    manual = server.get("/v1/runs/slurm-pretrain/goodput?scheduling=0.25")
    assert manual["factors"]["scheduling"] == 0.25 and manual["scheduling"]["basis"] == "manual"
    cli = fleetlens_cmd("goodput", "slurm-pretrain", "--server", server.url)
    assert cli.returncode == 0, cli.stderr
    assert f"scheduling {want:.3f} (pool)" in cli.stdout


def test_alibaba_trace_gives_the_librarys_figures(server: Server) -> None:
    got = _import(
        server, "alibaba", ALIBABA / "openb_pod_list_default.csv",
        "--nodes", str(ALIBABA / "openb_node_list_gpu_node.csv"), "--epoch", "1.6e9",
    )  # fmt: skip
    assert (got["allocations"], got["pending"]) == (7064, 861)
    assert got["capacity"][0]["capacityGpus"] == 6212
    (pool,) = server.get("/v1/fleet/goodput?pool=openb")["pools"]
    with open(ALIBABA / "openb_pod_list_default.csv") as fh:
        pods = parse_pods(fh, epoch=1.6e9)
    span = (float(pods.submit.min()), pool["window"]["to"])
    want = scheduling_goodput(
        pods.gpus.astype(float), pods.submit, pods.start, pods.gang_complete, pods.end,
        PoolCapacity.constant(6212), window=span,
    )  # fmt: skip
    assert pool["window"]["from"] == span[0]
    assert pool["schedulingGoodput"] == pytest.approx(want.scheduling_goodput)
    w = pool["queueWaitSeconds"]
    assert (w["p50"], w["p90"]) == (2.0, 139.0)
    assert w["p99"] == pytest.approx(1108.8, abs=0.1)


def test_kubernetes_pods_and_events_give_allocation_intervals(server: Server) -> None:
    _run(server, "pretrain-7b")  # named like the PyTorchJob that ran it
    got = _import(server, "k8s", K8S)
    assert (got["allocations"], got["pods"], got["gpus"]) == (3, 5, 33)  # tensorboard: no GPU
    assert "Insufficient nvidia.com/gpu" in got["pendingReasons"]["llm/eval-sweep"]
    allocs = server.get("/v1/scheduler/allocations?pool=k8s")["allocations"]
    by_job = {a["jobId"]: a for a in allocs}
    pt = by_job["llm/pretrain-7b"]  # master bound at 00:00:02, worker at 00:00:42
    assert (pt["gpus"], pt["submit"], pt["start"], pt["gangComplete"], pt["end"]) == (
        16, T0, T0 + 2, T0 + 42, T0 + 3600
    )  # fmt: skip
    assert pt["state"] == "Succeeded" and not pt["gangNeverComplete"]
    ft = by_job["llm/finetune-2n"]  # one of two pods bound, the other still pending
    assert (ft["start"], ft["gangComplete"], ft["end"]) == (T0 + 1801, None, None)
    assert ft["gangNeverComplete"] and ft["state"] == "Pending"
    ev = by_job["llm/eval-sweep"]
    assert (ev["gpus"], ev["start"], ev["end"], ev["state"]) == (1, None, None, "Pending")
    # The run named like the job: its own complete share (no capacity imported for `k8s`).
    g = server.get("/v1/runs/pretrain-7b/goodput")
    assert g["scheduling"]["basis"] == "own_allocations"
    assert g["scheduling"]["jobs"] == ["llm/pretrain-7b"]
    assert g["factors"]["scheduling"] == pytest.approx((3600 - 42) / (3600 - 2))
    mine = server.get("/v1/scheduler/allocations?runId=pretrain-7b")
    assert [a["jobId"] for a in mine["allocations"]] == ["llm/pretrain-7b"]
    cli = fleetlens_cmd("fleet", "allocations", "--run", "pretrain-7b", "--server", server.url)
    assert cli.returncode == 0, cli.stderr
    row = cli.stdout.splitlines()[1].split()
    assert row[:4] == ["k8s", "llm/pretrain-7b", "16", "2024-05-01"]
    assert row[5:9] == ["2", "40", "1.00", "Succeeded"]  # wait 2 s, gang 40 s later, 1 h held
    assert "scheduling factor 0.989 (own_allocations)" in cli.stdout


def test_run_flag_ties_records_to_a_run(server: Server, tmp_path: Path) -> None:
    _run(server, "tagged-run")
    sacct = "\n".join(SACCT.splitlines()[:2]).replace("100|", "900|") + "\n"
    (tmp_path / "one.txt").write_text(sacct)
    got = _import(server, "sacct", tmp_path / "one.txt", "--run", "tagged-run", "--pool", "p9")
    assert got["runIds"] == ["tagged-run"] and got["pools"] == ["p9"]
    g = server.get("/v1/runs/tagged-run/goodput")
    assert g["scheduling"] == {
        "factor": 1.0, "basis": "own_allocations", "jobs": ["900"],
        "pools": [{"pool": "p9", "factor": 1.0, "basis": "own_allocations", "from": T0 + 3600,
                   "to": T0 + 11 * 3600, "heldGpuSeconds": 16 * 10 * 3600.0}],
    }  # fmt: skip
    # A run without records keeps the default of 1 and says so.
    _run(server, "no-records-run")
    assert server.get("/v1/runs/no-records-run/goodput")["scheduling"] == {
        "factor": 1.0, "basis": "default"
    }  # fmt: skip
    # An unknown run is refused before anything is stored.
    out = fleetlens_cmd("import", "sacct", str(tmp_path / "one.txt"), "--run", "nope",
                        "--server", server.url)  # fmt: skip
    assert out.returncode == 2 and "nope" in out.stderr


def test_a_bad_file_names_its_line_and_stores_nothing(server: Server, tmp_path: Path) -> None:
    bad = SACCT.replace("2024-05-01T02:30:00", "05/01-02:30")
    (tmp_path / "bad.txt").write_text(bad.replace("101|", "777|"))
    out = fleetlens_cmd("import", "sacct", str(tmp_path / "bad.txt"), "--server", server.url)
    assert out.returncode == 2
    assert "sacct line 5" in out.stderr and "ISO time" in out.stderr
    assert server.get("/v1/scheduler/allocations?jobId=777")["allocations"] == []
    (tmp_path / "bad.json").write_text('{"apiVersion": "v1", "items": [')
    out = fleetlens_cmd("import", "k8s", str(tmp_path / "bad.json"), "--server", server.url)
    assert out.returncode == 2 and "line 1" in out.stderr and "kubectl get pods" in out.stderr
    (tmp_path / "sinfo.txt").write_text("NODELIST|PARTITION|STATE|GRES\ngpu[1-4]|gpu|idle|gpu:8\n")
    out = fleetlens_cmd("import", "sinfo", str(tmp_path / "sinfo.txt"), "--server", server.url)
    assert out.returncode == 2 and "sinfo line 2" in out.stderr and "--Node" in out.stderr
    # --dry-run parses here and stores nothing, server or not.
    dry = fleetlens_cmd("import", "sacct", str(tmp_path / "bad.txt"), "--dry-run")
    assert dry.returncode == 2 and "sacct line 5" in dry.stderr


def test_sinfo_of_a_real_slurm_gives_capacity_and_in_service_gpus(
    server: Server, tmp_path: Path
) -> None:
    """sinfo as the documented command prints it on a real slurmctld (one node, four GPUs),
    before and after the node is drained: its GPUs stay installed and leave service."""
    with slurm_cluster(gpus=4) as cluster:
        snapshots = []
        for when, action in ((T0, None), (T0 + 3600, "drain")):
            if action:
                done = cluster.client("scontrol", "update", f"nodename={cluster.node}",
                                      "state=drain", "reason=xid 79")  # fmt: skip
                assert done.returncode == 0, done.stderr
            out = cluster.client(*shlex.split(SINFO_COMMAND))
            assert out.returncode == 0, out.stderr
            path = tmp_path / f"sinfo-{len(snapshots)}.txt"
            path.write_text(out.stdout)
            snapshots.append(out.stdout)
            _import(server, "sinfo", path, "--time", str(when))
    assert snapshots[0].splitlines()[1].startswith(f"{cluster.node}|debug*|idle|gpu:h100:4")
    assert "|drained|" in snapshots[1]
    cli = fleetlens_cmd("fleet", "capacity", "--pool", "debug", "--server", server.url)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines()[2].split() == ["debug", "2024-05-01", "01:00:00", "4", "0"]
    rows = server.get("/v1/scheduler/capacity?pool=debug")["pools"]
    assert rows == [
        {"pool": "debug", "time": T0, "capacityGpus": 4, "inServiceGpus": 4},
        {"pool": "debug", "time": T0 + 3600, "capacityGpus": 4, "inServiceGpus": 0},
    ]


SACCT_COMMAND = (
    "sacct --allocations --parsable2 "
    "--format=JobID,JobName,Partition,AllocTRES,Submit,Start,End,State,NNodes"
)


def test_sacct_of_a_real_slurm_gives_the_librarys_figures(server: Server, tmp_path: Path) -> None:
    """Jobs run on a real slurmctld with accounting (one node, four GPUs, one CPU: they queue);
    sacct's and sinfo's output, as the documented commands print it, go through the CLI; the
    pool's figure and the run's scheduling factor are what the library computes from them."""
    with slurm_cluster(gpus=4, accounting=True) as cluster:
        env = {**cluster.env, "TZ": "UTC"}  # sacct prints local time: make it UTC

        def slurm(cmd: str) -> str:
            argv = shlex.split(cmd)
            out = subprocess.run([binary(argv[0]), *argv[1:]], env=env, capture_output=True,
                                 text=True, timeout=30)  # fmt: skip
            assert out.returncode == 0, (cmd, out.stderr)
            return out.stdout

        t_cap = float(int(time.time()))
        (tmp_path / "sinfo.txt").write_text(slurm(SINFO_COMMAND))
        submit = "sbatch --parsable -o /dev/null"
        pretrain = slurm(f"{submit} -J pretrain --gres=gpu:4 --wrap 'sleep 3'").strip()
        slurm(f"{submit} -J eval --gres=gpu:2 --wrap 'sleep 2'")
        # A job given up while it waited (pending behind the others, then cancelled).
        sweep = slurm(f"{submit} -J sweep --gres=gpu:1 --wrap 'sleep 1'").strip()
        time.sleep(1)
        slurm(f"scancel {sweep}")
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t_cap - 60))
        sacct = f"{SACCT_COMMAND} --starttime={since}"
        deadline = time.monotonic() + 60
        while slurm(sacct).count("|COMPLETED|") < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        text = slurm(sacct)
    (tmp_path / "sacct.txt").write_text(text)
    assert text.splitlines()[0] == "JobID|JobName|Partition|AllocTRES|Submit|Start|End|State|NNodes"
    assert f"{pretrain}|pretrain|debug|" in text and "gres/gpu=4" in text
    assert f"{sweep}|sweep|debug||" in text  # cancelled while it waited: no allocation
    _import(server, "sinfo", tmp_path / "sinfo.txt", "--time", str(t_cap))
    got = _import(server, "sacct", tmp_path / "sacct.txt")
    assert (got["allocations"], got["started"], got["pools"]) == (3, 2, ["debug"])
    lib = parse_sacct(text.splitlines(keepends=True))
    cap = parse_sinfo(Path(tmp_path / "sinfo.txt").read_text().splitlines(), time=t_cap)
    pool = PoolCapacity(cap.time, cap.capacity_gpus.astype(float),
                        cap.in_service_gpus.astype(float))  # fmt: skip
    t_end = float(np.nanmax(lib.end))
    want = scheduling_goodput(lib.gpus.astype(float), lib.submit, lib.start, lib.gang_complete,
                              lib.end, pool, window=(t_cap, t_end))  # fmt: skip
    (fleet,) = server.get(f"/v1/fleet/goodput?pool=debug&from={t_cap}&to={t_end}")["pools"]
    assert fleet["schedulingGoodput"] == pytest.approx(want.scheduling_goodput)
    assert fleet["queueWaitSeconds"] == pytest.approx(want.queue_wait_s)
    assert 0 < want.scheduling_goodput < 1 and want.queue_wait_s["max"] >= 1  # eval queued
    # The run whose ranks saw SLURM_JOB_ID=<pretrain>: the pool's figure while it ran.
    _run(server, "slurm-real-pretrain", slurm_job=pretrain)
    i = lib.job_id.tolist().index(pretrain)
    mine = scheduling_goodput(lib.gpus.astype(float), lib.submit, lib.start, lib.gang_complete,
                              lib.end, pool, window=(lib.start[i], lib.end[i]))  # fmt: skip
    g = server.get("/v1/runs/slurm-real-pretrain/goodput")
    assert g["scheduling"]["basis"] == "pool" and g["scheduling"]["jobs"] == [pretrain]
    assert g["factors"]["scheduling"] == pytest.approx(mine.scheduling_goodput)
