"""Kineto trace import on the real traces in tests/data/real/kineto_traces/hta.

Figures marked "HTA" were computed once with Holistic Trace Analysis 0.5.0 on the same file
(``TraceAnalysis(trace_dir=...)``, ``get_temporal_breakdown()``, ``get_comm_comp_overlap()``;
see bench/trace_import.py) and recorded here; HTA is not a dependency and is not imported.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fleetlens.analysis.layout import groups_config, layout_of
from fleetlens.cli import traces as traces_cli
from fleetlens.collector.decode import decode_batch
from fleetlens.errors import FleetlensError, TraceFormatError
from fleetlens.testing import Server, step_batch, wait_passes
from fleetlens.traces.breakdown import merge_intervals, step_breakdown
from fleetlens.traces.collectives import normalize_op
from fleetlens.traces.importer import RankTrace, batches, import_traces
from fleetlens.traces.kineto import COMM, COMPUTE, MEMORY, read_trace

pytestmark = pytest.mark.unit

REAL = Path(__file__).resolve().parent / "data" / "real" / "kineto_traces" / "hta"
W16 = REAL / "world16_a100_80gb" / "rank0.json.gz"
W128 = REAL / "trace_filter_world128"
NCCL = REAL / "nccl_parser_config_world2" / "nccl_data_rank0.json.gz"
V100_NS = REAL / "v100_world1" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
OLD = REAL / "trace_diff" / "control_rank3_world8_a100.json.gz"
GLOO = REAL / "cpu_only_gloo_world300" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
AMD = REAL / "amd_rocm" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
PIPE = REAL.parents[2] / "recorded" / "torch_pipelining_pp2_dp2"  # pp 2 x dp 2, 1F1B, gloo


def one(path: Path) -> RankTrace:
    (rt,) = list(import_traces([path]))
    return rt


def us(x: np.ndarray) -> list[float]:
    return [round(float(v) * 1e6, 3) for v in x]


def assert_lines_sum(rt: RankTrace) -> None:
    b = rt.breakdown
    np.testing.assert_allclose(
        b.compute + b.exposed_comm + b.memcpy + b.idle, b.duration, atol=1e-9
    )
    np.testing.assert_allclose(b.overlap + b.exposed_comm, b.comm, atol=1e-9)
    for line in (b.compute, b.comm, b.overlap, b.exposed_comm, b.memcpy, b.idle):
        assert (line >= -1e-9).all() and (line <= b.duration + 1e-9).all()


# --- pure functions -------------------------------------------------------------------------


def test_breakdown_of_a_small_scenario_by_hand() -> None:
    # window [0, 100): compute 10-40 and 30-50 (union 40), comm 45-70 (25, 5 of it under
    # compute), a copy 80-90 alone, and a kernel 95-120 cut at the window's end (5).
    start = np.array([10.0, 30.0, 45.0, 80.0, 95.0])
    end = np.array([40.0, 50.0, 70.0, 90.0, 120.0])
    kind = np.array([COMPUTE, COMPUTE, COMM, MEMORY, COMPUTE], dtype=np.int8)
    b = step_breakdown(np.array([0.0]), np.array([100.0]), start, end, kind)
    assert b.compute[0] == 45 and b.comm[0] == 25 and b.overlap[0] == 5
    assert b.exposed_comm[0] == 20 and b.memcpy[0] == 10 and b.idle[0] == 25
    ms, me = merge_intervals(np.array([5.0, 0.0, 10.0]), np.array([10.0, 6.0, 11.0]))
    assert ms.tolist() == [0.0] and me.tolist() == [11.0]  # touching intervals merge, as HTA


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("c10d::alltoall_base_", "all_to_all"),
        ("c10d::_allgather_base_", "all_gather"),
        ("c10d::_reduce_scatter_base_", "reduce_scatter"),
        ("nccl:all_reduce", "all_reduce"),
        ("allreduce", "all_reduce"),
        ("gloo:all_reduce", "all_reduce"),
        ("broadcast", "broadcast"),
    ],
)
def test_collective_names_are_normalised(name: str, op: str) -> None:
    assert normalize_op(name) == op


# --- real traces ----------------------------------------------------------------------------


def test_world16_a100_steps_breakdown_and_hta_totals() -> None:
    rt = one(W16)
    assert rt.rank == 0 and rt.clock == "unix" and rt.events == 108936
    assert rt.steps.tolist() == [550, 551, 552, 553, 554]
    # ProfilerStep durations in the file (us), which are HTA's step durations too.
    assert us(rt.breakdown.duration) == [209748.0, 216483.0, 216119.0, 215467.0, 216216.0]
    assert math.isclose(rt.time[0], 1683564901.548726, abs_tol=1e-6)
    assert_lines_sum(rt)
    assert us(rt.breakdown.compute) == [36213.0, 36019.0, 36226.0, 36049.0, 35724.0]
    assert us(rt.breakdown.idle) == [137309.0, 136221.0, 142037.0, 135339.0, 141696.0]
    assert rt.kernels.sum() == 6080  # kernels only, not the copies and sets
    # HTA: idle 705853 us, compute 143836, non-compute 166865 of kernel time 1016554 us
    # (69.44 / 14.15 / 16.41 %), comm-comp overlap 1.37 %.
    h = rt.hta
    assert (h["kernel_us"], h["idle_us"]) == (1016554.0, 705853.0)
    assert (h["compute_us"], h["non_compute_us"]) == (143836.0, 166865.0)
    assert (h["idle_pct"], h["compute_pct"], h["non_compute_pct"]) == (69.44, 14.15, 16.41)
    assert h["comm_comp_overlap_pct"] == 1.37


def test_world16_collectives() -> None:
    c = one(W16).collectives
    assert len(c) == 80 and c.unattributed == 0
    counts = {op: c.op.count(op) for op in set(c.op)}
    # 75 named by their c10d:: call; 5 all_to_all launches are not under one in the trace, so
    # they are named from the kernel (ncclKernel_SendRecv).
    assert counts == {
        "all_to_all": 45,
        "send_recv": 5,
        "all_reduce": 10,
        "reduce_scatter": 10,
        "all_gather": 10,
    }
    assert c.seq == list(range(80))  # one (unnamed) process group, in issue order
    assert all(x > e for e, x in zip(c.enter, c.exit, strict=False))
    assert set(c.step) == {550, 551, 552, 553, 554}


def test_two_ranks_of_a_128_rank_job() -> None:
    ranks = {rt.rank: rt for rt in import_traces([W128])}
    assert sorted(ranks) == [0, 1]
    for rt in ranks.values():
        assert rt.steps.tolist() == [551, 552]
        assert_lines_sum(rt)
        assert sorted(set(rt.collectives.op)) == ["all_gather", "all_reduce", "all_to_all"]
    assert us(ranks[0].breakdown.duration) == [607312.0, 622928.0]
    assert us(ranks[1].breakdown.duration) == [607904.0, 630639.0]
    # the same collectives on both ranks (sampled traces: the order of launches may differ)
    assert sorted(ranks[0].collectives.op) == sorted(ranks[1].collectives.op)
    # HTA rank 0: idle 53.56 %, compute 17.71 %, non-compute 28.74 %, overlap 11.81 %
    h = ranks[0].hta
    assert (h["idle_pct"], h["compute_pct"], h["non_compute_pct"]) == (53.56, 17.71, 28.74)
    assert h["comm_comp_overlap_pct"] == 11.81


def test_collective_metadata_names_sizes_and_groups() -> None:
    rt = one(NCCL)
    assert rt.steps.tolist() == [4, 5, 6] and rt.clock == "unix"
    # baseTimeNanoseconds (1711964646 s) + ts: May 2024, when the trace was recorded
    assert 1716400000 < rt.time[0] < 1716500000
    c = rt.collectives
    assert set(zip(c.op, c.group, strict=False)) == {("all_reduce", "0"), ("broadcast", "0")}
    assert c.op.count("all_reduce") == 15 and c.op.count("broadcast") == 6
    # "In msg nelems" x sizeof(dtype "Float")
    assert 8196000 in c.bytes and all(b % 4 == 0 and b > 0 for b in c.bytes)
    assert_lines_sum(rt)


def test_nanosecond_timestamps() -> None:
    rt = one(V100_NS)
    assert rt.steps.tolist() == [101, 102, 103, 104, 105]
    assert us(rt.breakdown.duration)[:2] == [35115.869, 72077.474]
    assert_lines_sum(rt)
    assert rt.kernels.tolist() == [870] * 5
    # world size 1: NCCL launches no kernels; the nccl:* calls are the collectives
    c = rt.collectives
    assert c.op.count("all_reduce") + c.op.count("broadcast") == len(c) + c.unattributed
    assert rt.breakdown.comm.sum() == 0


def test_older_kineto_schema() -> None:
    rt = one(OLD)
    assert rt.rank == 3 and rt.steps.tolist() == list(range(1009, 1015))
    assert_lines_sum(rt)
    assert sorted(set(rt.collectives.op)) == ["all_reduce", "all_to_all"]
    assert len(rt.collectives) == 60


def test_cpu_only_gloo_trace() -> None:
    rt = one(GLOO)
    assert rt.rank == 34 and rt.steps.tolist() == [551] and rt.kernels.tolist() == [0]
    assert_lines_sum(rt)
    assert rt.breakdown.compute[0] == 0 and rt.breakdown.comm[0] > 0
    c = rt.collectives
    # ten gloo:all_reduce calls on two threads; two start inside the one ProfilerStep
    assert c.op == ["all_reduce", "all_reduce"] and c.unattributed == 8


def test_amd_rocm_trace_without_distributed_info() -> None:
    rt = one(AMD)
    assert rt.rank == 0 and rt.steps.tolist() == [1, 2]  # the GPU-side ProfilerStep is ignored
    assert rt.kernels.sum() == 14 and len(rt.collectives) == 0
    assert_lines_sum(rt)
    # Why: the GPU-side range of step 1 (1.03 ms) ends before half the step's device work (the
    # backward pass, the optimizer) runs, inside the CPU step; its idle is the GPU waiting.
    t = read_trace(AMD)
    gpu_end = 4203669603454.205 + 1031.368  # the trace's gpu_user_annotation ProfilerStep#1
    after = (t.device.start >= gpu_end) & (t.device.end <= t.step_start[0] + t.step_dur[0])
    assert int(after.sum()) == 8 and len(t.device) == 16
    assert rt.breakdown.idle[0] > 0.9 * rt.breakdown.duration[0]


def test_bad_input_is_refused_with_the_file_named(tmp_path: Path) -> None:
    bad = tmp_path / "rank-0.json.gz"
    bad.write_bytes(gzip.compress(b"[1, 2, 3]"))
    with pytest.raises(TraceFormatError, match=r"rank-0\.json\.gz"):
        read_trace(bad)
    with pytest.raises(TraceFormatError, match="does not exist"):
        list(import_traces([tmp_path / "missing"]))
    dup = tmp_path / "dup"
    dup.mkdir()
    for name in ("a.json.gz", "b.json.gz"):
        shutil.copy(W16, dup / name)
    with pytest.raises(TraceFormatError, match="both rank 0"):
        list(import_traces([dup]))


# --- end to end -----------------------------------------------------------------------------


def _cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    traces_cli.add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return int(args.func(args))


def test_dry_run_parses_and_sends_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    # no server listens on port 9; a dry run must not try to reach it
    assert (
        _cli(
            [
                "traces",
                "import",
                str(GLOO),
                "--run",
                "r",
                "--server",
                "http://127.0.0.1:9",
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "551-551" in out and "rank-34" in out


@pytest.mark.e2e
def test_import_and_read_back(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        _cli(["traces", "import", str(W128), "--run", "tr1", "--job", "j1", "--server", server.url])
        == 0
    )
    # importing again stores nothing twice (the batch id is stable)
    assert (
        _cli(["traces", "import", str(W128), "--run", "tr1", "--job", "j1", "--server", server.url])
        == 0
    )
    assert "551-552" in capsys.readouterr().out
    data = server.get("/v1/runs/tr1/traces")
    assert (data["fromStep"], data["toStep"]) == (551, 552)
    assert len(data["steps"]) == 4
    s0 = next(s for s in data["steps"] if s["rank"] == 0 and s["step"] == 551)
    assert s0["durationMs"] == 607.312 and s0["computeMs"] == 106.252
    assert s0["source"] == "sampled_rank-0.json.gz"
    parts = s0["computeMs"] + s0["exposedCommMs"] + s0["memcpyMs"] + s0["idleMs"]
    assert math.isclose(parts, s0["durationMs"], abs_tol=0.005)
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert sorted(ranks) == [0, 1] and ranks[0]["steps"] == 2 and ranks[0]["collectives"] == 10
    total = sum(ranks[0][k] for k in ("computePct", "exposedCommPct", "memcpyPct", "idlePct"))
    assert math.isclose(total, 100.0, abs_tol=0.05)
    one_step = server.get("/v1/runs/tr1/traces?fromStep=552&toStep=552")
    assert {s["step"] for s in one_step["steps"]} == {552}
    status, _ = server.request("GET", "/v1/runs/tr1/traces?fromStep=9&toStep=1")
    assert status == 400
    # Read back from the command line: the ranks' totals as the API has them.
    capsys.readouterr()
    assert _cli(["traces", "show", "tr1", "--server", server.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "run tr1: steps 551-552, 2 rank(s)" and lines[1].split()[0] == "RANK"
    row0 = lines[2].split()
    assert row0[0] == "0" and row0[1] == "2" and float(row0[3]) == ranks[0]["computePct"]
    assert _cli(["traces", "show", "tr1", "--server", server.url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"] == data["ranks"]
    with pytest.raises(FleetlensError, match="run no-traces has no imported trace"):
        server.post(step_batch("no-traces", range(0, 2), 1)[1])
        _cli(["traces", "show", "no-traces", "--server", server.url])


_DRY = ["--run", "r", "--server", "http://127.0.0.1:9", "--dry-run"]


def test_as_run_refuses_a_trace_without_a_unix_clock(tmp_path: Path) -> None:
    """A trace timed on the profiler's own clock (no baseTimeNanoseconds, times since boot)
    cannot be a run's steps: refused, nothing sent (no server listens on port 9)."""
    steps = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "tid": 1,
              "ts": 1000.0 + 600.0 * i, "dur": 500.0} for i in range(3)]  # fmt: skip
    trace = tmp_path / "rank-0.json"
    trace.write_text(json.dumps({"traceEvents": steps}))
    argv = ["traces", "import", str(trace), "--run", "r", "--server", "http://127.0.0.1:9"]
    with pytest.raises(FleetlensError, match="no UNIX time base in the trace"):
        _cli([*argv, "--as-run"])


def test_a_directory_is_searched_at_any_depth_and_json_is_alone_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profiler writes a folder per worker: DIR's traces one level down were "no trace
    files". With --json the summary is the only thing on stdout (for jq), no table."""
    deep = tmp_path / "job" / "worker-0"
    deep.mkdir(parents=True)
    for f in W128.glob("*.json.gz"):
        shutil.copy(f, deep / f.name)
    assert _cli(["traces", "import", str(tmp_path), *_DRY, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(r["rank"] for r in out["ranks"]) == [0, 1] and out["skipped"] == []


def test_no_trace_or_no_profiler_step_is_an_error_before_any_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty folder printed a table header, then the error; a trace without ProfilerStep#
    annotations said "1 rank trace(s) imported" and its run then answered 404."""
    with pytest.raises(TraceFormatError, match="no trace files"):
        _cli(["traces", "import", str(tmp_path), *_DRY])
    assert capsys.readouterr().out == ""
    stepless = REAL / "single_gpu" / "alexnet_benchmark_trace.json.gz"
    with pytest.raises(FleetlensError, match="no trace with profiler steps among 1 file"):
        _cli(["traces", "import", str(stepless), *_DRY])
    captured = capsys.readouterr()
    assert captured.out == "" and "no ProfilerStep# annotations" in captured.err


# --- a pipeline-parallel job's traces ---------------------------------------------------------


def test_the_layout_is_read_from_the_process_groups_a_trace_lists() -> None:
    """The recorded 1F1B job's mesh (pp 2 outermost, dp 2) from every rank's pg_config; a
    Megatron job's groups by their group_desc; a torchtitan HSDP mesh's dp as the product of its
    replicate and shard groups; a job with only its default group has no model-parallel layout."""
    for rt in import_traces([PIPE]):
        c = groups_config(rt.groups)
        assert c == {"pp": 2, "dp": 2, "parallel_order": ["pp", "dp"]}, rt.rank
        lay = layout_of(c, rt.world_size or 0)
        assert lay is not None and lay.stages(4).tolist() == [0, 0, 1, 1]
        assert lay.coords(rt.rank)["pp"] == rt.rank // 2
    megatron = [("TENSOR_MODEL_PARALLEL_GROUP", [4, 5]), ("PIPELINE_MODEL_PARALLEL_GROUP", [0, 4]),
                ("DATA_PARALLEL_GROUP", [4, 6]), ("EMBEDDING_GROUP", [0, 4])]  # fmt: skip
    c = groups_config(megatron)
    assert c == {"tp": 2, "pp": 2, "dp": 2, "parallel_order": ["pp", "dp", "tp"]}
    assert layout_of(c, 8) is not None and layout_of(c, 8).coords(5) == {  # type: ignore[union-attr]
        "pp": 1, "dp": 0, "cp": 0, "tp": 1}  # fmt: skip
    hsdp = [("mesh_dp_replicate", [0, 8]), ("mesh_dp_shard", [0, 4]), ("mesh_tp", [0, 1, 2, 3]),
            ("mesh_dp_shard_cp", [0, 4])]  # fmt: skip
    assert groups_config(hsdp) == {"tp": 4, "dp": 4, "parallel_order": ["dp", "tp"]}
    assert groups_config([("default_pg", list(range(300))), ("undefined", [0, 1])]) == {}
    assert groups_config(read_trace(GLOO).groups) == {}


def test_as_run_rows_are_the_profiled_steps_with_compute_left_after_exposed_comm() -> None:
    """What --as-run sends for a rank, read by the server's own decoder: its profiled steps
    with their exposed communication, and on the first rank's batch the attempt's start (with
    the layout) and its end at the rank's last step."""
    (rt,) = [r for r in import_traces([PIPE]) if r.rank == 2]
    start = {"config": groups_config(rt.groups), "world_size": 4}
    got = decode_batch(batches(rt, "pp", "a0", True, start)[1], content_encoding="gzip").tables
    _, st = got["step"]
    assert st["step"].tolist() == list(range(2, 14)) and set(st["rank"].tolist()) == {2}
    np.testing.assert_allclose(st["duration"], rt.breakdown.duration)
    np.testing.assert_allclose(st["comm"], rt.breakdown.exposed_comm)
    _, ev = got["event"]
    kinds = [ev["kind"].dictionary[c] for c in ev["kind"].codes]
    assert kinds == ["job_start", "finish"] and ev["step"].tolist() == [1, 13]
    attrs = [json.loads(ev["attrs"].dictionary[c]) for c in ev["attrs"].codes]
    assert attrs[0]["config"]["pp"] == 2 and attrs[0]["world_size"] == 4
    assert ev["time"][1] == pytest.approx(rt.time[-1] + rt.breakdown.duration[-1])
    others = decode_batch(batches(rt, "pp", "a0", True)[1], content_encoding="gzip").tables
    assert "step" in others and "event" not in others  # the other ranks carry steps only
    assert "step" not in decode_batch(batches(rt, "pp")[1], content_encoding="gzip").tables


@pytest.mark.e2e
def test_a_pipeline_jobs_traces_give_stage_imbalance_not_slow_workers(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """Imported --as-run, a real 1F1B job's traces are analysed as a live run is: its layout
    from the traces' process groups, the last stage (the loss and the vocabulary projection)
    reported as stage imbalance owned by the training configuration with its what-if saving,
    and none of its ranks called a straggler."""
    url = server.url
    assert (
        _cli(["traces", "import", str(PIPE), "--run", "pp-real", "--as-run", "--server", url]) == 0
    )
    wait_passes(server, 2)
    run = server.get("/v1/runs/pp-real")
    assert run["status"] == "FINISHED"  # a trace is history: it ends where the traces end
    assert (run["layout"]["pp"], run["layout"]["dp"], run["layout"]["source"]) == (2, 2, "mesh")
    findings = server.get("/v1/runs/pp-real/diagnosis")["findings"]
    (imb,) = [f for f in findings if f["diagnosis"] == "stage_imbalance"]
    assert imb["owner"] == "training_config" and imb["evidence"][0]["stage"] == 1
    assert not [f for f in findings if f["diagnosis"] in ("persistent_straggler", "straggler")]
    w = server.get("/v1/runs/pp-real/whatif/stragglers")
    (f,) = [f for f in w["findings"] if f["diagnosis"] == "stage_imbalance"]
    assert f["ranks"] == [2, 3] and 0.1 < f["share"] < 0.8 and w["slowdown"] >= f["speedup"]
    assert w["byType"]["stages"] == max(w["byType"].values())  # the stages cost the most
    # re-importing stores nothing twice
    assert (
        _cli(["traces", "import", str(PIPE), "--run", "pp-real", "--as-run", "--server", url]) == 0
    )
    assert len(server.get("/v1/runs/pp-real/traces")["steps"]) == 4 * 12


@pytest.mark.e2e
def test_the_pipeline_example_under_torchrun_writes_traces_that_give_its_layout(
    tmp_path: Path,
) -> None:
    """The example that recorded the traces above, run now as users launch it: every rank's
    trace has its profiled steps and the process groups that give pp 2 x dp 2."""
    example = Path(__file__).resolve().parents[1] / "examples" / "pipeline_train.py"
    out = tmp_path / "traces"
    args = ["--steps", "5", "--profile-steps", "3", "--profile", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         str(example), *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = {rt.rank: rt for rt in import_traces([out])}
    assert sorted(ranks) == [0, 1, 2, 3]
    for rt in ranks.values():
        assert rt.steps.tolist() == [2, 3, 4] and rt.world_size == 4
        assert groups_config(rt.groups) == {"pp": 2, "dp": 2, "parallel_order": ["pp", "dp"]}
