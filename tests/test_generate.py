"""The randomized scenario generator (``fleetlens.sim.generate``) and the strict matching of
findings to faults (``fleetlens.sim.match``) that ``bench/detection.py`` scores with."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from bench._generated import FleetPlayer
from fleetlens.sim.emit import MemorySink
from fleetlens.sim.generate import (
    EVENT_KINDS,
    SLOW_KINDS,
    Fleet,
    GenConfig,
    generate_fleets,
    magnitude_bin,
)
from fleetlens.sim.library import simulate
from fleetlens.sim.match import match_findings
from fleetlens.sim.model import FaultSpec
from fleetlens.sim.placement import Placement
from fleetlens.sim.truth import GroundTruth, TruthFault

pytestmark = pytest.mark.unit


def test_same_seed_same_fleets_other_seed_other_fleets() -> None:
    assert generate_fleets(5, 6) == generate_fleets(5, 6)
    assert generate_fleets(5, 6) != generate_fleets(6, 6)


def test_drawn_within_the_stated_ranges() -> None:
    cfg = GenConfig()
    fleets = generate_fleets(11, 60, cfg)
    runs = [r for f in fleets for r in f.runs]
    assert len(runs) == 60 * cfg.runs_per_fleet
    bins: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    healthy = several = 0
    for scn in runs:
        assert 0.01 <= scn.noise.rank_cov <= 0.05
        assert cfg.steps[0] <= scn.job.steps <= cfg.steps[1]
        assert cfg.step_time[0] <= scn.job.step_time <= cfg.step_time[1]
        assert scn.cluster.gpus_per_node in cfg.gpus_per_node
        assert cfg.nodes[0] <= scn.cluster.nodes <= cfg.nodes[1]
        healthy += not scn.faults
        several += len(scn.faults) >= 2
        assert sum(f.kind in EVENT_KINDS for f in scn.faults) <= 1  # one terminating fault
        for f in scn.faults:
            kinds[f.kind] += 1
            assert 0 <= f.step < scn.job.steps
            assert all(0 <= r < scn.world_size for r in f.ranks)
            if f.kind in SLOW_KINDS:
                assert 0.02 <= f.magnitude <= 0.5
                bins[magnitude_bin(f.magnitude)] += 1
    assert set(kinds) == {*SLOW_KINDS, *EVENT_KINDS}
    assert set(bins) == {"2-5%", "5-10%", "10-20%", "20-50%"}
    assert min(bins.values()) > 0.15 * sum(bins.values())  # drawn evenly over the bins
    assert 0.15 * len(runs) < healthy < 0.35 * len(runs) and several > 0.2 * len(runs)


def _truths(fleet: Fleet) -> list[GroundTruth]:
    return [simulate(s, MemorySink(), speed=0, start_time=s.start_time) for s in fleet.runs]


def test_truth_is_what_was_drawn_and_runs_share_nodes_one_after_another() -> None:
    (fleet,) = generate_fleets(3, 1, GenConfig(healthy_share=0.0))
    truths = _truths(fleet)
    for scn, t in zip(fleet.runs, truths, strict=True):
        assert t.run_id == scn.job.run_id and t.world_size == scn.world_size
        assert sorted((f.kind, f.magnitude or 0.0) for f in scn.faults) == sorted(
            (f.kind, f.magnitude if f.kind in SLOW_KINDS else 0.0) for f in t.faults
        )
        for f in t.faults:
            assert all(0 <= r < t.world_size for r in f.ranks)
            assert f.start_step < t.steps and f.start_time is not None
            assert t.start_time <= f.start_time <= t.end_time
    for a, b in itertools.pairwise(truths):
        assert a.end_time < b.start_time  # one after another, never at once
    # node names are reused: every run of the fleet is placed on node-0000 and node-0001
    for scn in fleet.runs:
        names = Placement(scn.cluster, scn.world_size).node_names
        assert names[:2] == ["node-0000", "node-0001"]


def _fault(kind: str, ranks: list[int], nodes: list[str], start: int, end: int) -> TruthFault:
    return TruthFault(
        id=f"f-{kind}", kind=kind, diagnosis=kind, owner="x", ranks=ranks, nodes=nodes,
        gpus=[], rack="", start_step=start, end_step=end, start_time=0.0, end_time=None,
        job_ids=["a0"], fatal=kind in ("fatal_xid",), magnitude=0.2,
    )  # fmt: skip


def _truth(*faults: TruthFault) -> GroundTruth:
    return GroundTruth("s", "r", 0, 16, 0.0, 1.0, 400, ["a0"], list(faults), {})


def _finding(diag: str, ranks: list[int], nodes: list[str], start: int, step: int) -> dict:
    return {"diagnosis": diag, "ranks": ranks, "nodes": nodes, "start_step": start,
            "step": step}  # fmt: skip


def test_matching_is_strict_on_diagnosis_place_and_time() -> None:
    t = _truth(_fault("straggler.persistent", [5], ["node-0000"], 100, 400))
    right = _finding("straggler.persistent", [5], ["node-0000"], 101, 104)
    m = match_findings(t, [right, dict(right, step=110)])
    assert m.finding_state == ["tp", "dup"] and m.delay_steps == {"f-straggler.persistent": 4}
    wrong = [
        _finding("straggler.intermittent", [5], ["node-0000"], 101, 104),  # wrong class
        _finding("straggler.persistent", [6], ["node-0000"], 101, 104),  # a healthy rank
        _finding("straggler.persistent", [5, 6], ["node-0000"], 101, 104),  # and a healthy one
        _finding("straggler.persistent", [5], ["node-0000"], 40, 104),  # onset before the fault
        _finding("straggler.persistent", [5], ["node-0000"], 101, 260),  # detected too late
    ]
    for w in wrong:
        assert match_findings(t, [w]).finding_state == ["fp"], w
    # the class of straggler relaxed (reported beside the strict figure)
    assert match_findings(t, wrong[:1], family=True).finding_state == ["tp"]
    # a fault of a node must be named by its node; a fatal one is visible when it ends the job
    x = _truth(_fault("fatal_xid", [8, 9], ["node-0001"], 200, 200))
    assert match_findings(x, [_finding("fatal_xid", [], [], 200, 200)]).finding_state == ["fp"]
    ok = _finding("fatal_xid", [9], ["node-0001"], 200, 201)
    assert match_findings(x, [ok]).finding_state == ["tp"]
    assert match_findings(x, [dict(ok, nodes=["node-0002"])]).finding_state == ["fp"]


def test_a_false_alarm_names_no_fault_a_wrong_finding_names_one_badly() -> None:
    """Counted apart (``false_findings_per_1000_rank_hours``): the wrong class, too few of the
    fault's ranks or a late detection blame the right place at the right time; a healthy rank,
    a time before the fault or another diagnosis blame the wrong one."""
    t = _truth(_fault("straggler.persistent", [5], ["node-0000"], 100, 400),
               _fault("data_stall", [8, 9, 10, 11], ["node-0001"], 50, 60))  # fmt: skip
    named_badly = [
        _finding("straggler.intermittent", [5], ["node-0000"], 101, 104),  # wrong class
        _finding("straggler.persistent", [5], ["node-0000"], 101, 260),  # detected too late
        _finding("data_stall", [8], ["node-0001"], 50, 52),  # one of its four ranks
    ]
    m = match_findings(t, named_badly)
    assert m.finding_state == ["fp"] * 3 and m.false_alarm == [False] * 3
    alarms = [
        _finding("straggler.persistent", [6], ["node-0000"], 101, 104),  # a healthy rank
        _finding("straggler.persistent", [5], ["node-0000"], 40, 104),  # before the fault
        _finding("thermal", [5], ["node-0000"], 101, 104),  # another diagnosis
        _finding("data_stall", [8, 12], ["node-0001"], 50, 52),  # and a healthy rank
    ]
    assert match_findings(t, alarms).false_alarm == [True] * 4


def test_a_generated_fleet_is_played_and_scored(tmp_path: Path) -> None:
    """End to end on a tiny fleet: a 30% persistent straggler is found strictly; a healthy run
    that reuses the node names afterwards has no finding."""
    (fleet,) = generate_fleets(1, 1, GenConfig(runs_per_fleet=2, healthy_share=0.0))
    sick = fleet.runs[0]
    spec = FaultSpec("straggler.persistent", step=60, ranks=(3,), magnitude=0.3,
                     duration_steps=10**9)  # fmt: skip
    healthy = fleet.runs[1]
    fleet = Fleet(fleet.name, (replace(sick, faults=(spec,)), replace(healthy, faults=())))
    p = FleetPlayer(tmp_path)
    try:
        first, second = p.play(fleet)
    finally:
        p.close()
    m = match_findings(first.truth, first.findings)
    assert list(m.fault_hit.values()) != [None] and "fp" not in m.finding_state, first.findings
    assert second.findings == []
