"""Tensor-parallel groups checked against where the ranks landed (seed 002).

Eight real SDK runs, tensor parallelism 4 (the run's config says so, as Megatron-LM's
``tensor_model_parallel_size``), on two nodes of four GPUs. Placed block-wise (ranks 0-3 on one
node) every TP group has NVLink; placed cyclically (rank r on node r % 2, what Slurm's
``--distribution=cyclic`` does) every TP group spans both nodes, and the run gets a finding
saying which groups and where, before the first straggler shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fleetlens
from fleetlens.analysis.topology import split_tp_groups, tp_size
from fleetlens.testing import Server, wait_until

pytestmark = pytest.mark.unit


def _train(server: Server, tmp: Path, run_id: str, node_of: list[str]) -> None:
    runs = [
        fleetlens.init(project="p", run_id=run_id, rank=r, world_size=8, node_id=node_of[r],
                       gpu=r // 2 if node_of != sorted(node_of) else r % 4, server=server.url,
                       config={"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 1},
                       spool_dir=str(tmp / f"{run_id}-{r}"), install_signal_handler=False)
        for r in range(8)
    ]  # fmt: skip
    for step in range(12):
        for run in runs:
            with run.step(step, tokens=1024):
                run.add_phase("forward", 0.05)
    for run in runs:
        run.finish()


def _findings(server: Server, run_id: str) -> list[dict]:  # type: ignore[type-arg]
    return list(server.get(f"/v1/runs/{run_id}/diagnosis")["findings"])


@pytest.mark.e2e
def test_tensor_parallel_groups_split_over_nodes_are_found(server: Server, tmp_path: Path) -> None:
    _train(server, tmp_path, "cyclic", [f"node-{r % 2}" for r in range(8)])
    _train(server, tmp_path, "block", [f"node-{r // 4}" for r in range(8)])

    def split() -> dict | None:  # type: ignore[type-arg]
        return next((f for f in _findings(server, "cyclic") if f["diagnosis"] == "topology"), None)

    finding = wait_until(split, 30, what="a topology finding")
    assert finding["owner"] == "scheduler" and finding["ranks"] == list(range(8))
    assert finding["nodes"] == ["node-0", "node-1"]
    assert finding["summary"].startswith("2 of 2 tensor-parallel groups of 4 ranks span"), finding
    ev = finding["evidence"][0]
    assert ev["groups"][0] == {"ranks": [0, 1, 2, 3], "domains": ["node-0", "node-1"]}
    # The same job placed block-wise: analysed, and no topology finding.
    wait_until(lambda: server.get("/v1/runs/block")["steps"] == 12, 30)
    wait_until(lambda: server.request("GET", "/v1/runs/block/diagnosis")[0] == 200, 30)
    assert all(f["diagnosis"] != "topology" for f in _findings(server, "block"))


def test_the_layout_comes_from_the_config_and_the_domain_from_the_placement() -> None:
    assert tp_size({"tp": 8}) == 8 and tp_size({"tensor_parallel_size": "2"}) == 2
    assert tp_size({"tp": 1}) is None and tp_size({"lr": 3e-4}) is None
    nodes = ["a", "a", "b", "b"]
    assert split_tp_groups(2, 4, nodes, [""] * 4) == []
    # Two nodes of one NVLink domain (NVL72-style): a group across them is still on NVLink.
    assert split_tp_groups(4, 4, nodes, ["nvl-0"] * 4) == []
    (g,) = split_tp_groups(4, 4, nodes, ["nvl-0", "nvl-0", "nvl-1", "nvl-1"])
    assert g.ranks == (0, 1, 2, 3) and g.domains == ("nvl-0", "nvl-1")
    # Ranks not placed yet are not judged.
    assert split_tp_groups(2, 4, ["a", "", "b", "b"], [""] * 4) == []
