"""Regression tiers (issue 39 item 2): a run slower than the earlier runs of its workload, on
the software they ran, is a finding and a ticket naming the version that changed.

The judgment on made-up figures, then three real runs of the DDP example under torchrun: two on
image ``train:1``, then one on ``train:2`` given a quarter of their CPU from outside (a cgroup
its launcher starts in), as a slower image or driver would make it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench._delivery import from_matrix
from bench._realjobs import _recap, _throttle, _unthrottle
from fleetlens.analysis.regression import (
    RunFigures,
    allocation,
    architecture_key,
    judge,
    workload_key,
)
from fleetlens.importers.alibaba import parse_pods
from fleetlens.sim.emit import encode
from fleetlens.testing import InProcessServer, Server, step_batch, wait_until
from fleetlens.wire import TableBuilder, encode_batch

from .test_cli import fleetlens_cmd

EXAMPLE = Path(__file__).resolve().parents[1] / "fleetlens" / "examples" / "ddp_train.py"
ONE = {"image": "train:1", "torch": "2.13.0"}
TWO = {"image": "train:2", "torch": "2.13.0"}


def _run(i: int, sw: dict[str, str], step_s: float, startup_s: float = 5.0) -> RunFigures:
    return RunFigures(f"r{i}", float(i), dict(sw), step_s, startup_s, steps=100)


@pytest.mark.unit
def test_a_run_is_judged_on_the_software_it_followed_and_names_what_changed() -> None:
    base = [_run(1, ONE, 0.100), _run(2, ONE, 0.104), _run(3, ONE, 0.098)]
    (prog, start) = judge(_run(4, TWO, 0.130), base)
    assert (prog.tier, prog.worse, prog.baseline) == ("program", True, 0.1)
    assert prog.runs == ["r1", "r2", "r3"]
    assert prog.changes == ["image train:1 vs train:2"] and prog.ratio == pytest.approx(1.3)
    assert start.tier == "startup" and not start.worse
    # Within the tolerance (10%) and the baseline's own spread: not worse.
    assert not judge(_run(4, TWO, 0.108), base)[0].worse
    # The baseline is the software of the newest earlier run: after train:2 came in, a third
    # train:2 run is judged against the train:2 runs, and nothing changed.
    later = [*base, _run(4, TWO, 0.130), _run(5, TWO, 0.131)]
    (again, _) = judge(_run(6, TWO, 0.132), later)
    assert not again.worse and again.runs == ["r4", "r5"] and again.changes == []
    # One earlier run is no baseline; a later run is not one; a run is not its own.
    assert judge(_run(2, ONE, 0.2), [_run(1, ONE, 0.1)]) == []
    assert judge(_run(1, ONE, 0.2), [_run(2, ONE, 0.1), _run(3, ONE, 0.1)]) == []


@pytest.mark.unit
def test_the_workload_is_the_configs_model_keys_and_the_world_not_its_versions() -> None:
    cfg = {"model": "tiny-lm", "seq_len": 64, "lr": 3e-3, "software_version": "1"}
    assert workload_key(cfg, 4) == workload_key({**cfg, "software_version": "2", "lr": 1.0}, 4)
    assert workload_key(cfg, 4) != workload_key(cfg, 8)
    assert workload_key(cfg, 4) != workload_key({**cfg, "seq_len": 128}, 4)
    assert workload_key({"lr": 3e-3}, 4) is None  # the world size alone names no workload
    assert workload_key({"dtype": "bf16", "seq_len": 64}, 4) is None  # nor a dtype: no model


def _at(i: int, sw: dict[str, str], world: int, **figures: Any) -> RunFigures:
    """Run ``i`` of the architecture at ``world`` ranks with the given figures."""
    return RunFigures(f"r{i}", float(i), dict(sw), None, None, steps=100, world_size=world,
                      workload=f"w{world}", architecture="a", **figures)  # fmt: skip


@pytest.mark.unit
def test_mfu_is_judged_against_the_architecture_at_a_like_scale_and_higher_is_better() -> None:
    base = [_at(1, ONE, 24, mfu=0.42), _at(2, ONE, 40, mfu=0.40), _at(3, ONE, 32, mfu=0.41),
            _at(4, ONE, 8, mfu=0.60)]  # fmt: skip
    (v,) = judge(_at(5, TWO, 36, mfu=0.30), base)  # a size none of them ran
    assert (v.tier, v.worse, v.baseline, v.runs) == ("mfu", True, 0.41, ["r1", "r2", "r3"])
    assert v.bound < v.baseline and v.changes == ["image train:1 vs train:2"]
    assert not judge(_at(5, TWO, 36, mfu=0.45), base)[0].worse  # better is never worse
    assert not judge(_at(5, TWO, 36, mfu=0.38), base)[0].worse  # within the 10%
    # MFU falls as a job grows: a run 8x the size of the 8-rank one is not judged against it.
    assert judge(_at(5, TWO, 64, mfu=0.30), base[3:]) == []
    # Without an MFU, the GPU time a token is the same reference (lower is better).
    base = [_at(1, ONE, 16, gpu_s_per_token=2e-4), _at(2, ONE, 20, gpu_s_per_token=2.1e-4)]
    (v,) = judge(_at(3, TWO, 16, gpu_s_per_token=3e-4), base)
    assert (v.tier, v.worse, v.runs) == ("token", True, ["r1", "r2"]) and v.bound > v.baseline
    assert not judge(_at(3, TWO, 16, gpu_s_per_token=2.1e-4), base)[0].worse


@pytest.mark.unit
def test_a_canary_that_scales_worse_on_new_software_is_worse_though_faster_on_one_node() -> None:
    """Small-scale canaries: train:1 ran one node (8 ranks) and two (16) at 0.95 efficiency;
    train:2 is faster on one node but keeps only 0.70 of it on two: the curve bent."""
    fleet = [
        _at(1, ONE, 8, gpu_rate=100.0), _at(2, ONE, 16, gpu_rate=95.0),
        _at(3, ONE, 16, gpu_rate=96.0), _at(4, TWO, 8, gpu_rate=110.0),
    ]  # fmt: skip
    (v,) = [v for v in judge(_at(5, TWO, 16, gpu_rate=77.0), fleet) if v.tier == "scaling"]
    assert v.worse and v.value == pytest.approx(0.70) and v.baseline == pytest.approx(0.955)
    assert v.runs == ["r2", "r3"] and v.changes == ["image train:1 vs train:2"]
    # The same curve as before is not worse; without a smaller run on its software, no verdict.
    (ok,) = [v for v in judge(_at(5, TWO, 16, gpu_rate=104.0), fleet) if v.tier == "scaling"]
    assert not ok.worse
    assert [
        v for v in judge(_at(5, TWO, 16, gpu_rate=77.0), fleet[:3]) if v.tier == "scaling"
    ] == []
    # The program tier sees one node only: the new image is faster there.
    assert not [v for v in judge(_at(5, TWO, 8, gpu_rate=110.0), fleet) if v.worse]


@pytest.mark.unit
def test_recovery_checkpoint_and_allocation_tiers_have_their_least_excess() -> None:
    base = [_at(1, ONE, 8, recovery_s=60.0, checkpoint_s=2.0),
            _at(2, ONE, 8, recovery_s=64.0, checkpoint_s=2.2)]  # fmt: skip
    got = {v.tier: v for v in judge(_at(3, ONE, 8, recovery_s=400.0, checkpoint_s=2.6), base)}
    assert got["recovery"].worse and got["recovery"].baseline == 62.0
    # 2.6 s against 2.1 s is 24% over, but under the 1 s that counts for a checkpoint pause.
    assert not got["checkpoint"].worse and got["checkpoint"].bound == pytest.approx(3.1)
    # A run that never restarted has no recovery figure; another workload is no baseline.
    assert "recovery" not in {v.tier for v in judge(_at(3, ONE, 8, checkpoint_s=9.0), base)}
    assert judge(_at(3, ONE, 16, recovery_s=400.0), base) == []
    run = _at(3, ONE, 8, alloc_s=7200.0)
    waits = [("j1", 30.0), ("j2", 90.0), ("j3", 45.0)]
    v = allocation(run, waits)
    assert v is not None and v.worse and v.baseline == 45.0 and v.runs == ["j1", "j2", "j3"]
    assert v.bound == pytest.approx(45.0 * 1.1 + 3 * 1.4826 * 15.0)  # 10% and 3 MADs
    # 100 s against a steady 45 s: more than 10% and 3 MADs over, but not the 60 s that count.
    steady = [("j1", 45.0), ("j2", 45.0), ("j3", 45.0)]
    assert not allocation(_at(3, ONE, 8, alloc_s=100.0), steady).worse  # type: ignore[union-attr]
    assert allocation(run, waits[:1]) is None


@pytest.mark.unit
def test_the_architecture_is_the_workload_at_every_scale() -> None:
    cfg = {"model": "tiny-lm", "seq_len": 64, "dp": 8, "global_batch_size": 512}
    assert architecture_key(cfg) == architecture_key({**cfg, "dp": 64, "global_batch_size": 4096})
    assert architecture_key(cfg) != architecture_key({**cfg, "seq_len": 128})
    assert workload_key(cfg, 8) != workload_key(cfg, 64)
    assert architecture_key({"dp": 8}) is None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(str(tmp_path / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"}).start()
    try:
        yield srv
    finally:
        srv.stop()


def _train(srv: Server, run: str, image: str, tmp: Path, cores: float, ranks: int = 4) -> None:
    """The example under torchrun, 40 steps, its launcher and ranks capped at ``cores`` CPUs
    from outside (a cgroup made before it starts, which its ranks inherit) once its run is on
    the server: the imports and the rendezvous before go at the machine's pace."""
    env = {
        **os.environ,
        "FLEETLENS_SERVER": srv.url,
        "FLEETLENS_RUN_ID": run,
        "FLEETLENS_IMAGE": image,
        "FLEETLENS_RELAY": "off",
        "OMP_NUM_THREADS": "1",
    }
    args = [str(EXAMPLE), "--steps", "40", "--stats-dir", str(tmp)]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node", str(ranks), *args]  # fmt: skip
    # The shell waits for a line on stdin, so that it is in the cgroup before torchrun starts.
    job = subprocess.Popen(["sh", "-c", 'read go; exec "$@"', "sh", *launch], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)  # fmt: skip
    cg = _throttle(job.pid, 8.0)  # no cap that binds yet
    try:
        assert cg is not None, "no cgroup with a cpu controller to cap the job with"
        assert job.stdin is not None
        job.stdin.write("go\n")
        job.stdin.flush()  # communicate() below closes it

        def registered() -> bool:
            try:
                return bool(srv.get(f"/v1/runs/{run}"))
            except urllib.error.HTTPError:
                return job.poll() is not None  # it ended before: its error is below

        wait_until(registered, timeout=300, every=0.02)
        _recap(cg, cores)
        _, err = job.communicate(timeout=600)
        assert job.returncode == 0, err[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
        if cg is not None:
            _unthrottle(cg)


@pytest.mark.e2e
def test_a_new_image_slower_than_its_workloads_runs_is_a_finding_and_a_ticket(
    server: Server, tmp_path: Path, browser: Any
) -> None:
    # Every run capped from outside, well under what the machine's other work leaves it (the
    # suite runs two files at once on two cores, each with a job of 4 ranks and a server: a
    # fair share near 0.2 CPUs a process), so that the cap decides its pace: 0.1 CPUs a rank on
    # image train:1, and on train:2 for its 2-rank canary, but 0.03 at 4 ranks. The new image is
    # as fast on the canary and bends the scaling curve only at 4. (Caps of 0.2 a rank did not
    # bind under a slow CI's load: the two baseline runs' curves differed by half, and a
    # baseline that spread judges nothing worse.)
    _train(server, "canary-1", "train:1", tmp_path, cores=0.2, ranks=2)
    for run in ("reg-a", "reg-b"):
        _train(server, run, "train:1", tmp_path, cores=0.4)
    _train(server, "canary-2", "train:2", tmp_path, cores=0.2, ranks=2)
    _train(server, "reg-c", "train:2", tmp_path, cores=0.12)

    def regressed() -> list[dict[str, Any]]:
        found = server.get("/v1/runs/reg-c/diagnosis")["findings"]
        got = [f for f in found if f["diagnosis"] in ("program_regression", "scaling_regression")]
        return sorted(got, key=lambda f: str(f["diagnosis"])) if len(got) == 2 else []

    try:
        (finding, scaling) = wait_until(regressed, timeout=120)
    except AssertionError:
        raise AssertionError(server.get("/v1/runs/reg-c/regression")) from None
    assert finding["owner"] == "infrastructure" and finding["kind"] == "regression", finding
    assert "coincides with image train:1 vs train:2" in finding["summary"], finding
    (ev,) = finding["evidence"]
    assert ev["baselineRuns"] == ["reg-a", "reg-b"] and ev["value"] > 2 * ev["baseline"], ev
    doc = server.get("/v1/runs/reg-c/regression")
    (prog,) = [v for v in doc["verdicts"] if v["tier"] == "program"]
    assert prog["worse"] and prog["changes"] == ["image train:1 vs train:2"], doc
    assert doc["figures"]["software"]["image"] == "train:2", doc
    # The canaries: 4 ranks keep most of 2 ranks' rate a rank on train:1, far less on train:2.
    (curve,) = [v for v in doc["verdicts"] if v["tier"] == "scaling"]
    assert curve["worse"] and curve["higherIsBetter"] and curve["runs"] == ["reg-a", "reg-b"]
    assert curve["value"] < 0.6 * curve["baseline"], curve
    assert scaling["owner"] == "infrastructure", scaling
    assert "coincides with image train:1 vs train:2" in scaling["summary"], scaling
    # The runs on the baseline's image are not worse (reg-b against reg-a alone: no baseline).
    assert server.get("/v1/runs/reg-b/regression")["verdicts"] == []
    assert not [f for f in server.get("/v1/runs/reg-b/diagnosis")["findings"]
                if f["kind"] == "regression"]  # fmt: skip
    # A ticket for the platform's on-call, and the command line says the same.
    alerts = wait_until(
        lambda: [
            a
            for a in server.get("/v1/alerts?runId=reg-c")["alerts"]
            if a["alertname"] == "PerformanceRegression"
        ],
        timeout=60,
    )
    assert alerts[0]["severity"] == "ticket", alerts
    shown = fleetlens_cmd("regression", "reg-c", "--server", server.url)
    assert shown.returncode == 0, shown.stderr
    assert "WORSE" in shown.stdout and "changed: image train:1 vs train:2" in shown.stdout
    contract = server.get("/v1/runs/reg-c")["contract"]
    assert contract["software"]["image"] == "train:2", contract
    # The run page's "What's wrong" names both, with the change that coincides.
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{server.url}/runs/reg-c")
        # "What's wrong" lists the five costliest findings. Under the suite's load these capped
        # runs may also show slow collectives or idle compute costing more (a gate saw six), so
        # both regressions are looked for in the Diagnosis section, which lists every finding,
        # and in "What's wrong" where the overview ranks them among its five.
        ranked = server.get("/v1/runs/reg-c/overview")["findings"]
        rank = {f["diagnosis"]: f["rank"] for f in ranked}
        for code, name in (
            ("scaling_regression", "Scales worse than on the software it replaced"),
            ("program_regression", "Slower than its workload's baseline"),
        ):
            row = page.locator("#findings tbody tr", has=page.locator(f"[data-code={code}]"))
            row.wait_for(timeout=30_000)
            assert name in row.inner_text(), row.inner_text()
            assert "coincides with image train:1 vs train:2" in row.inner_text()
            if rank[code] <= 5:
                wrong = page.locator(f"#wrong-table [data-code={code}]")
                assert wrong.inner_text() == name, (ranked, wrong.inner_text())
    finally:
        page.close()
    assert not errors, errors


def _post_run(srv: InProcessServer, run: str, step_s: float, steps: range, t0: float) -> None:
    compute = np.full((len(steps), 4), step_s)
    rec = from_matrix(run, np.array(list(steps)), compute, t0, {"model": "tiny-lm"})
    for ctx, tables in [*rec.first, *rec.other]:
        assert srv.post(encode(ctx, tables))[0] == 200
    for ctx, cols in rec.steps:
        assert srv.post(encode(ctx, {"step": (len(cols["step"]), cols)}))[0] == 200


@pytest.mark.api
def test_a_run_no_longer_worse_than_its_baseline_ends_its_finding(tmp_path: Path) -> None:
    """Run c's first 60 steps take 0.5 s against its two predecessors' 0.2 s: a finding, open
    while the run is. Its next 200 steps take 0.2 s: the median is back, the finding ends."""
    settings = {"analysis_interval_s": 0.2, "regression_every_s": 0.5}
    with InProcessServer(str(tmp_path / "data"), settings=settings) as srv:
        t0 = time.time() - 3600
        for i, run in enumerate(("c-a", "c-b")):
            _post_run(srv, run, 0.2, range(60), t0 + 100 * i)
        _post_run(srv, "c-c", 0.5, range(60), t0 + 300)

        def finding() -> dict[str, Any] | None:
            found = srv.get("/v1/runs/c-c/diagnosis")["findings"]
            got = [f for f in found if f["diagnosis"] == "program_regression"]
            return got[0] if got else None

        f = wait_until(finding, timeout=60)
        assert f["endStep"] is None and f["evidence"][0]["baselineRuns"] == ["c-a", "c-b"], f
        _post_run(srv, "c-c", 0.2, range(60, 260), t0 + 400)
        ended = wait_until(lambda: (g := finding()) and g["endStep"] is not None and g, 60)
        assert ended["endStep"] == 259 and ended["evidence"] == f["evidence"], ended
        verdicts = srv.get("/v1/runs/c-c/regression")["verdicts"]
        (prog,) = [v for v in verdicts if v["tier"] == "program"]
        assert not prog["worse"] and prog["value"] == pytest.approx(0.2), prog


ALIBABA = (
    Path(__file__).resolve().parent / "data" / "real" / "cluster_traces" / "alibaba_openb_v2023"
)
SACCT_HEAD = "JobID|JobName|Partition|AllocTRES|Submit|Start|End|State|NNodes\n"
CONFIG = {"model": "tiny-lm", "flops_per_step": 1e12, "peak_flops": 1e13}


def _attempt(srv: InProcessServer, run: str, job: str, steps: range, t0: float,
             checkpoints: list[dict[str, Any]]) -> float:  # fmt: skip
    """One attempt of ``run`` on 2 ranks from ``t0``: its ``job_start`` (with the config), 0.4 s
    steps, a ``checkpoint_end`` with each of ``checkpoints`` as its attrs (as the SDK reports a
    save: ``duration_s``, ``sync``); returns its last step's end."""
    ctx = {"run_id": run, "job_id": job, "project": "test"}
    n = 1 + len(checkpoints)
    ev = TableBuilder("event")
    ev.add("time", [t0 + i for i in range(n)]).add("step", [steps.start] * n)
    ev.add("kind", ["job_start"] + ["checkpoint_end"] * len(checkpoints)).add("rank", [0] * n)
    attrs = [{"config": CONFIG, "world_size": 2}, *checkpoints]
    ev.add("attrs", [json.dumps(a) for a in attrs])
    assert srv.post(encode_batch({"event": ev.build()}, ctx)[1])[0] == 200
    body = step_batch(run, steps, 2, job_id=job, base=0.4, t0=t0 + 1, ctx={"project": "test"})[1]
    assert srv.post(body)[0] == 200
    return t0 + 1 + (len(steps) - 1) * 0.48 + 0.4


def _restarted(srv: InProcessServer, run: str, t0: float, gap: float, pause: float) -> None:
    """40 steps, a failure, ``gap`` s until the next attempt's first step, 40 more steps; three
    synchronous saves of ``pause`` s and three asynchronous ones of a minute (no pause: the
    training went on), which the checkpoint tier must leave out."""
    sync = {"duration_s": pause, "sync": True, "ok": True}
    background = {"duration_s": 60.0, "sync": False, "ok": True}
    end = _attempt(srv, run, f"{run}-a0", range(0, 40), t0, [sync, sync, background, background])
    _attempt(srv, run, f"{run}-a1", range(40, 80), end + gap - 1, [sync, background])


@pytest.mark.api
def test_recovery_checkpoints_and_a_real_pools_allocations_are_baselines(tmp_path: Path) -> None:
    """Two runs of a workload each recover from a failure in 30 s and pause 2 s per checkpoint;
    a third takes 600 s and 12 s. Its allocation waited 3 h in the pool of the real Alibaba
    2023 trace, whose newest like-sized allocations are its baseline."""
    settings = {"analysis_interval_s": 0.2, "regression_every_s": 0.5}
    with InProcessServer(str(tmp_path / "data"), settings=settings) as srv:
        t0 = time.time() - 7200
        _restarted(srv, "rt-a", t0, 30.0, 2.0)
        _restarted(srv, "rt-b", t0 + 1800, 30.0, 2.0)
        _restarted(srv, "rt-c", t0 + 3600, 600.0, 12.0)
        pods = (ALIBABA / "openb_pod_list_default.csv").read_text()
        nodes = (ALIBABA / "openb_node_list_gpu_node.csv").read_text()
        imp = {"format": "alibaba", "data": pods, "nodes": nodes, "epoch": 1.6e9}
        assert srv.request("POST", "/v1/scheduler/import", imp)[0] == 200
        own = SACCT_HEAD + ("900|pretrain|gpu|cpu=1,gres/gpu=1,node=1|2024-05-01T00:00:00|"
                            "2024-05-01T03:00:00|2024-05-01T11:00:00|COMPLETED|1\n")  # fmt: skip
        imp = {"format": "sacct", "data": own, "pool": "openb", "runId": "rt-c"}
        assert srv.request("POST", "/v1/scheduler/import", imp)[0] == 200

        def found() -> dict[str, dict[str, Any]] | None:
            got = {
                f["diagnosis"]: f
                for f in srv.get("/v1/runs/rt-c/diagnosis")["findings"]
                if f["kind"] == "regression"
            }
            return got if len(got) == 3 else None

        try:
            got = wait_until(found, timeout=60)
        except AssertionError:
            raise AssertionError(srv.get("/v1/runs/rt-c/regression")) from None
        assert {d: f["owner"] for d, f in got.items()} == {
            "recovery_regression": "infrastructure",
            "checkpoint_regression": "storage",
            "allocation_regression": "scheduler",
        }
        doc = srv.get("/v1/runs/rt-c/regression")
        f = doc["figures"]
        assert f["recoveryS"] == pytest.approx(600.0, abs=0.01), f
        verdicts = {v["tier"]: v for v in doc["verdicts"]}
        assert verdicts["recovery"]["baseline"] == pytest.approx(30.0, abs=0.01)
        assert verdicts["recovery"]["runs"] == ["rt-a", "rt-b"]
        assert verdicts["checkpoint"]["value"] == 12.0 and verdicts["checkpoint"]["baseline"] == 2.0
        # MFU from the config's FLOPs at the median step: 1e12 / (0.4 s x 2 x 1e13), as before.
        assert f["mfu"] == pytest.approx(0.125) and not verdicts["mfu"]["worse"]
        assert not verdicts["program"]["worse"]
        # The allocation: 3 h against the median wait of the trace's newest 200 allocations of
        # one or two GPUs, figured here from the file itself.
        alloc = verdicts["allocation"]
        with open(ALIBABA / "openb_pod_list_default.csv") as fh:
            trace = parse_pods(fh, epoch=1.6e9)
        done = np.where(np.isnan(trace.gang_complete), trace.start, trace.gang_complete)
        wait = done - trace.submit
        like = (trace.gpus >= 0.5) & (trace.gpus <= 2) & np.isfinite(wait) & (wait >= 0)
        newest = sorted(zip(-trace.submit[like], trace.job_id[like], wait[like], strict=True))
        waits = [w for _, _, w in newest[:200]]
        assert alloc["value"] == 3 * 3600.0 and len(alloc["runs"]) == 200
        assert alloc["baseline"] == pytest.approx(float(np.median(waits))), alloc
        assert f["pool"] == "openb" and alloc["worse"]
