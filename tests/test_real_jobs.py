"""Real training code, instrumented as the docs show and launched with torchrun as users launch
it (4 gloo ranks on CPU), against a real server: what a user relies on at the end of the job.

The codes are in tests/realcode; bench/_realjobs.py launches them and does the faults from
outside the processes. Each test has its own server and a few dozen steps.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from bench._realjobs import Fault, JobResult, Server, fresh_server, run_job

pytestmark = pytest.mark.e2e

pytest.importorskip("torch")


# rank 2 held to half the CPU it was using, from step 20 on
_HALF_SPEED = Fault("slow", at_step=20, keep=0.5)


@pytest.fixture
def job_server() -> Iterator[Server]:
    with fresh_server() as srv:
        yield srv


def _show(r: JobResult) -> str:
    """What the server said, for the assertion's message."""
    return json.dumps(
        {
            "returncode": r.returncode,
            "runs": r.runs,
            "status": r.status,
            "ended": r.run.get("ended"),
            "reportingRanks": r.reporting_ranks,
            "findings": [
                {k: f.get(k) for k in ("kind", "diagnosis", "ranks", "step", "summary")}
                for f in r.findings
            ],
            "diagnose": r.diagnose_cli[-1500:],
            "output": r.output[-2500:],
        },
        indent=1,
    )


@pytest.mark.parametrize("code", ["nanogpt", "hf", "lightning"])
def test_healthy_job_is_one_finished_run_of_four_ranks_with_no_finding(
    job_server: Server, code: str
) -> None:
    r = run_job(job_server, code, steps=30, settle_s=60, env={"FLEETLENS_LOGS": "1"})
    assert r.returncode == 0, _show(r)
    assert len(r.run_ids) == 1, _show(r)
    assert r.run.get("worldSize") == 4, _show(r)
    assert r.reporting_ranks == [0, 1, 2, 3], _show(r)
    assert r.status == "FINISHED", _show(r)
    assert r.findings == [], _show(r)
    # every rank's process memory, sampled by the SDK on its own (issue 39 item 4)
    mem = job_server.get(f"/v1/runs/{r.run_ids[0]}/memory")
    hosts = {p["rank"]: p for p in mem["pools"] if p["pool"] == "host"}
    assert sorted(hosts) == [0, 1, 2, 3], mem
    assert all(0 < p["usedBytes"] <= p["peakBytes"] < p["limitBytes"] for p in hosts.values())
    # what its speed was measured on (issue 39 item 1): this torch, 4 ranks on this CPU
    import torch

    contract = job_server.get(f"/v1/runs/{r.run_ids[0]}")["contract"]
    assert contract["software"]["torch"] == torch.__version__, contract
    assert contract["topology"] == {"nodes": 1, "gpusPerNode": 4, "devices": 4,
                                    "interconnect": None, "gpus": False}, contract  # fmt: skip
    assert f"torch {torch.__version__}" in contract["text"], contract
    # and what the ranks wrote, with their steps (FLEETLENS_LOGS=1; issue 39 item 5)
    lines = job_server.get(f"/v1/runs/{r.run_ids[0]}/logs?limit=5000")["lines"]
    assert 0 in {x["rank"] for x in lines}, lines[:20]  # the main process logs in all three
    if code == "nanogpt":  # its master process prints each iteration after the step
        it = [x for x in lines if x["message"].startswith("iter 10: loss")]
        assert [(x["rank"], x["step"], x["source"]) for x in it] == [(0, 10, "stdout")], it


def test_nanogpt_rank_killed_is_a_failed_run_naming_the_rank(job_server: Server) -> None:
    r = run_job(job_server, "nanogpt", steps=400, fault=Fault("crash", at_step=10), settle_s=90)
    assert r.onset_step is not None, _show(r)
    assert r.returncode not in (0, None), _show(r)  # torchrun reports the dead worker
    assert len(r.run_ids) == 1, _show(r)
    assert r.status == "FAILED", _show(r)
    assert 2 in (r.run.get("ended") or {}).get("ranks", []), _show(r)
    assert any(2 in f.get("ranks", []) for f in r.findings if f.get("kind") == "failure"), _show(r)


def test_torchrun_master_port_without_rdzv_id_is_one_run(job_server: Server) -> None:
    """nanoGPT's docstring launches with ``--master-port`` only: TORCHELASTIC_RUN_ID=none."""
    r = run_job(job_server, "nanogpt", steps=20, launch="master-port", settle_s=60)
    assert r.returncode == 0, _show(r)
    assert len(r.run_ids) == 1, _show(r)
    assert r.run.get("worldSize") == 4, _show(r)
    assert r.reporting_ranks == [0, 1, 2, 3], _show(r)
    assert r.status == "FINISHED", _show(r)


def test_hf_trainer_under_accelerate_launch_is_one_run(job_server: Server) -> None:
    """``accelerate launch`` names no run id (torchrun underneath, ``TORCHELASTIC_RUN_ID``
    none): the four ranks agree on one through the job's store."""
    r = run_job(job_server, "hf", steps=20, launch="accelerate", settle_s=60)
    assert r.returncode == 0, _show(r)
    assert len(r.run_ids) == 1, _show(r)
    assert r.reporting_ranks == [0, 1, 2, 3], _show(r)
    assert r.status == "FINISHED", _show(r)


def test_nanogpt_slowed_rank_has_the_longest_compute_with_the_readme_instrumentation(
    job_server: Server,
) -> None:
    """The README's phases alone (no TorchRun): DDP's all-reduce ends inside backward, so the
    SDK's torch integration takes each rank's wait out of it (``comm``). Rank 2, held from
    outside to half the CPU it was using, computes longest; the others wait for it.

    With ``FLEETLENS_TRACE_CAPTURE=1`` the straggler finding also brings a few profiled steps
    of rank 2 and of a healthy peer (issue 39 item 3), the same steps on both: in the traces
    too, rank 2 computes longest and its peer waits in the all-reduce."""
    env = {"FLEETLENS_TRACE_CAPTURE": "1"}
    # A capture starts 10 s of the job's steps ahead of its ranks (so that every rank named
    # hears of it first): the job runs long enough for that at this machine's pace.
    r = run_job(job_server, "nanogpt", steps=400, fault=_HALF_SPEED, settle_s=60, env=env)
    assert r.returncode == 0, _show(r)
    ranks = {int(x["rank"]): x for x in r.ranks.get("ranks", [])}
    assert sorted(ranks) == [0, 1, 2, 3], _show(r)
    assert all((x.get("commMs") or 0) > 0 for x in ranks.values()), r.ranks
    slowest = max(ranks, key=lambda k: ranks[k]["computeSlowdown"] or 0)
    assert slowest == 2 and ranks[2]["computeSlowdown"] >= 1.15, r.ranks
    assert min(ranks, key=lambda k: ranks[k]["commMs"]) == 2, r.ranks
    captured = [
        e
        for f in r.findings
        if f["kind"] == "straggler" and f["ranks"] == [2]
        for e in f["evidence"]
        if e.get("signal") == "trace_capture"
    ]
    assert captured, _show(r)
    lag, peer = captured[0]["ranks"]
    assert (lag["rank"], lag["role"], peer["role"]) == (2, "lagging", "peer"), captured
    assert (lag["fromStep"], lag["toStep"]) == (peer["fromStep"], peer["toStep"]), captured
    assert lag["toStep"] - lag["fromStep"] == 2 and lag["hostOnly"], captured
    assert lag["computeMs"] > 1.3 * peer["computeMs"], captured
    assert peer["exposedCommMs"] > 2 * lag["exposedCommMs"], captured
    assert "trace capture" in r.diagnose_cli and "rank 2 (lagging)" in r.diagnose_cli, _show(r)


def test_nanogpt_rank_stopped_is_hung_then_finished_and_its_time_is_hang(
    job_server: Server,
) -> None:
    """Rank 2 stopped (SIGSTOP) for 75 s, past the hang rule's 60 s floor, then continued: the
    run is HUNG while it is stopped, FINISHED after; the hang finding names rank 2 after the
    rank came back; goodput charges the stop to its hang line, not to productive time."""
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(1.0):
            runs = job_server.get("/v1/runs")["runs"]
            if runs and (not seen or seen[-1] != runs[0]["status"]):
                seen.append(runs[0]["status"])

    poller = threading.Thread(target=watch, daemon=True)
    poller.start()
    try:
        r = run_job(
            job_server,
            "nanogpt",
            steps=120,
            settle_s=90,
            fault=Fault("hang", at_step=20, stop_s=75.0),
        )
    finally:
        stop.set()
        poller.join(10)
    assert r.returncode == 0, _show(r)
    assert "HUNG" in seen and r.status == "FINISHED", (seen, _show(r))
    hangs = [f for f in r.findings if f.get("kind") == "hang"]
    assert hangs and all(f["ranks"] == [2] for f in hangs), _show(r)
    lines = {x["category"]: x["seconds"] for x in r.goodput["breakdown"]["lines"]}
    assert abs(lines["hang"] - 75.0) <= 0.15 * 75.0, lines


def test_nanogpt_slowed_rank_is_named_from_its_phases_alone(job_server: Server) -> None:
    """With the compute/wait split off (another framework would have none), the phases still
    name the slow rank: judged by when each rank arrived at the backward's all-reduce."""
    r = run_job(
        job_server,
        "nanogpt",
        steps=200,
        settle_s=60,
        fault=_HALF_SPEED,
        env={"FLEETLENS_TORCH_SPLIT": "0"},
    )
    assert r.returncode == 0, _show(r)
    assert all(x.get("commMs") is None for x in r.ranks.get("ranks", [])), r.ranks
    # Rank 2, and no other, is the persistent straggler. (A machine this loaded slows the other
    # ranks in turn: a "moving" straggler among them, on a gate that ran steps 6x slower, is
    # what their data said, not a rank blamed for rank 2's slowness.)
    named = [f for f in r.findings if f.get("diagnosis") == "straggler.persistent"]
    assert named and all(f["ranks"] == [2] for f in named), _show(r)
