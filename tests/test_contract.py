"""The measurement contract (issue 39 item 1, seed 003 s9.3.1): a step time, MFU or goodput
answer carries the software its ranks reported, the topology it was placed on and the spread of
the project's trials of the same workload; a comparison of runs measured differently says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench._delivery import from_matrix
from fleetlens.analysis.contract import Contract, differences, software, topology, trials
from fleetlens.sim.emit import encode
from fleetlens.testing import InProcessServer

pytestmark = pytest.mark.unit

T0 = 1.7e9
ENV = {"torch": "2.4.0", "cuda": "12.4", "nccl": "2.21.5", "nvidia_driver": "550.54.15",
       "python": "3.11.7"}  # fmt: skip


def test_the_software_is_the_ranks_reported_and_a_disagreement_is_mixed() -> None:
    envs = [ENV, ENV, {**ENV, "nccl": "2.20.3"}, {"python": "3.11.7"}]
    sw, mixed = software(envs)
    assert sw == ENV  # the most common value of each key
    assert mixed == {"nccl": ["2.20.3", "2.21.5"]}
    t = topology(["n1"] * 8 + ["n2"] * 8, list(range(8)) * 2, ["n1"] * 8 + ["n2"] * 8)
    assert t is not None and (t.nodes, t.gpus_per_node, t.devices) == (2, 8, 16)
    assert t.interconnect == "NVLink domains of 8 GPUs" and t.gpus
    cpu = topology(["h"] * 4, [-1] * 4, [""] * 4)
    assert cpu is not None and not cpu.gpus and cpu.interconnect is None
    assert topology(["", ""], [-1, -1], ["", ""]) is None
    tr = trials(["a", "b", "c"], [1.0, 1.1, 0.9])
    assert tr is not None and tr.spread == pytest.approx(np.std([1.0, 1.1, 0.9]) / 1.0)
    c = Contract(sw, mixed, t, tr)
    assert c.text() == (
        "torch 2.4.0, CUDA 12.4, NCCL 2.21.5 (mixed), driver 550.54.15 on 2 nodes x 8 GPUs "
        "(NVLink domains of 8 GPUs); 3 trials, step time spread 8.2%"
    )
    assert Contract({"torch": "2.13.0"}, {}, cpu, None).text() == (
        "torch 2.13.0 on 1 node x 4 ranks on CPU"
    )
    other = Contract({**sw, "torch": "2.5.1"}, {}, topology(["n1"] * 8, range(8), ["n1"] * 8), None)
    assert differences(c, other) == ["torch 2.4.0 vs 2.5.1", "nodes 2 vs 1"]
    assert differences(c, c) == []


def _post_run(
    srv: InProcessServer, run: str, step_s: float, t0: float, env: dict[str, str]
) -> None:
    """A 4-rank run of 60 steps at ``step_s`` (ranks on nodes node0..3, one GPU each), whose
    ranks report ``env`` at their start."""
    rec = from_matrix(run, np.arange(60), np.full((60, 4), step_s), t0, {"model": "gpt-s"})
    for ctx, tables in [*rec.first, *rec.other]:
        assert srv.post(encode(ctx, tables))[0] == 200
    for ctx, cols in rec.steps:
        assert srv.post(encode(ctx, {"step": (len(cols["step"]), cols)}))[0] == 200
    ctx = {"run_id": run, "job_id": f"{run}-a0", "project": "real"}
    starts = {
        "time": np.full(4, t0), "kind": ["job_start"] * 4, "step": np.full(4, -1),
        "rank": np.arange(4, dtype=np.int32), "node_id": [f"node{k}" for k in range(4)],
        "gpu": np.zeros(4, dtype=np.int32), "message": [""] * 4,
        "attrs": [json.dumps({"environment": env, "world_size": 4})] * 4,
    }  # fmt: skip
    assert srv.post(encode(ctx, {"event": (4, starts)}))[0] == 200


@pytest.mark.api
def test_a_runs_speed_answers_carry_the_contract_and_a_comparison_says_it_differs(
    tmp_path: Path,
) -> None:
    with InProcessServer(str(tmp_path / "data")) as srv:
        _post_run(srv, "a", 0.20, T0, ENV)
        _post_run(srv, "b", 0.22, T0 + 1000, ENV)
        _post_run(srv, "c", 0.30, T0 + 2000, {**ENV, "torch": "2.5.1"})
        run = srv.get("/v1/runs/a")
        c = run["contract"]
        assert c["software"] == ENV and c["mixed"] == {}
        link = "NVLink domains of 1 GPU"
        assert c["topology"] == {
            "nodes": 4,
            "gpusPerNode": 1,
            "devices": 4,
            "interconnect": link,
            "gpus": True,
        }
        # the same workload (same model, same world) ran three times in the project
        tr = c["trials"]
        assert sorted(tr["runs"]) == ["a", "b", "c"]
        medians = dict(zip(tr["runs"], tr["stepTimeMedianS"], strict=True))
        assert medians == pytest.approx({"a": 0.20, "b": 0.22, "c": 0.30})
        assert tr["spread"] == pytest.approx(np.std([0.2, 0.22, 0.3]) / np.mean([0.2, 0.22, 0.3]))
        assert c["text"].startswith("torch 2.4.0, CUDA 12.4, NCCL 2.21.5, driver 550.54.15 on 4")
        assert srv.get("/v1/runs/a/goodput")["contract"] == c
        cmp = srv.get("/v1/runs/compare?runs=a,b,c")
        assert cmp["contract"]["differences"] == [[], ["torch 2.4.0 vs 2.5.1"]]
        assert cmp["contract"]["changed"]
        same, other = cmp["conclusions"]
        assert not same["contractChanged"] and other["contractChanged"]
        said = " ".join(other["lines"]) if "lines" in other else json.dumps(other)
        assert "Measured under a different contract: torch 2.4.0 vs 2.5.1." in said, other
        assert other["cause"] == "contract", other
