"""Detection of the randomized scenarios' faults the bench found wrong (``bench/detection.py``,
docs/detection.md "Below 0.95 at >= 10 %"), each on a generated run through ingest, chDB and
the analysis loop, matched strictly (``fleetlens.sim.match``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bench._generated import FleetPlayer, PlayedRun
from fleetlens.analysis.rootcause import Diagnosis, diagnose_instability
from fleetlens.config import AnalyzerConfig
from fleetlens.services.cursor import SlowCollectives
from fleetlens.services.shifts import fold_into_racks
from fleetlens.sim.devices import DeviceSampler
from fleetlens.sim.faults import FAULT_KINDS, Injected
from fleetlens.sim.generate import Fleet, GenConfig, generate_fleets
from fleetlens.sim.match import match_findings
from fleetlens.sim.model import FaultSpec, Scenario
from fleetlens.sim.steps import StepChunk
from fleetlens.store.detect_queries import DetectQueries, JobSpan
from fleetlens.store.findings import FindingsStore
from fleetlens.store.metadata import MetadataStore

pytestmark = pytest.mark.unit


def _play(tmp: Path, *faults: FaultSpec, nodes: int = 4, gpn: int = 4, steps: int = 360,
          max_steps: int = 100) -> PlayedRun:  # fmt: skip
    (fleet,) = generate_fleets(7, 1, GenConfig(runs_per_fleet=1, healthy_share=0.0))
    scn = fleet.runs[0]
    scn = replace(
        scn, faults=faults, cluster=replace(scn.cluster, nodes=nodes, gpus_per_node=gpn),
        job=replace(scn.job, steps=steps, step_time=1.0), noise=replace(scn.noise, rank_cov=0.02),
    )  # fmt: skip
    return _play_one(tmp, fleet.name, scn, AnalyzerConfig(max_steps=max_steps))


def _play_one(tmp: Path, fleet: str, scn: Scenario, cfg: AnalyzerConfig | None = None) -> PlayedRun:
    """One scenario played through ingest and the analysis loop, as the bench plays it."""
    p = FleetPlayer(tmp)
    if cfg is not None:
        p.cfg = cfg
    try:
        (run,) = p.play(Fleet(fleet, (scn,)))
    finally:
        p.close()
    return run


def _strict(run: PlayedRun) -> None:
    m = match_findings(run.truth, run.findings)
    missed = [f.id for f in run.truth.faults if m.fault_hit[f.id] is None]
    false = [f for f, st in zip(run.findings, m.finding_state, strict=True) if st == "fp"]
    assert not missed and not false, (missed, run.findings)


def test_two_hot_racks_are_two_rack_findings_and_not_their_gpus(tmp_path: Path) -> None:
    """Both racks of a job hot at once: a rack-cooling finding per rack (not one job-wide), and
    none of their GPUs reported beside it as a thermal straggler (when the first rack cools, the
    other's GPUs are slower than the median GPU by its magnitude), whatever the passes."""
    hot = (
        FaultSpec("rack_cooling", step=120, rack=0, magnitude=0.4, duration_steps=110),
        FaultSpec("rack_cooling", step=135, rack=1, magnitude=0.45, duration_steps=170),
    )
    found = []
    for i, per in enumerate((100, 37)):
        run = _play(tmp_path / str(i), *hot, nodes=8, max_steps=per)
        _strict(run)
        assert sorted(f["diagnosis"] for f in run.findings) == ["rack_cooling", "rack_cooling"]
        found.append(sorted((f["key"], f["start_step"], f["ranks"]) for f in run.findings))
    assert found[0] == found[1]


def test_a_slow_nvlink_transfer_of_15_percent_is_nvlink_alone(tmp_path: Path) -> None:
    """An NVLink fault that slows the gradient transfer (8 % of the step) by 15 %: one NVLink
    finding on its node, and no network finding for the blocks before its CRC errors counted."""
    run = _play(tmp_path, FaultSpec("nvlink", step=130, node=2, magnitude=0.15,
                                    duration_steps=200))  # fmt: skip
    _strict(run)
    assert [f["diagnosis"] for f in run.findings] == ["nvlink"]


def test_a_slow_network_of_12_percent_is_found(tmp_path: Path) -> None:
    run = _play(tmp_path, FaultSpec("network", step=110, node=1, magnitude=0.12,
                                    duration_steps=200))  # fmt: skip
    _strict(run)
    assert [f["diagnosis"] for f in run.findings] == ["network"]


def test_a_data_stall_in_the_first_blocks_does_not_hide_a_network_fault(tmp_path: Path) -> None:
    """The transfer baseline learns from blocks whose transfer is healthy, whatever else slows
    them: a stall from step 10 kept the first blocks out of every baseline, so the network fault
    from step 60 was never compared with anything and was learned as healthy."""
    run = _play(
        tmp_path,
        FaultSpec("data_stall", step=10, ranks=(0, 1), magnitude=0.3, duration_steps=100),
        FaultSpec("network", step=60, node=1, magnitude=0.3, duration_steps=200),
    )
    _strict(run)
    assert sorted(f["diagnosis"] for f in run.findings) == ["data_stall", "network"]


def test_ecc_onset_is_dated_by_the_first_rising_sample(tmp_path: Path) -> None:
    """Single-bit errors from step 165 to the Xid 48 at step 200: the finding's onset is where
    the counter began to climb (a sample every 10 s, 1 s steps), not the analysis window's start
    (step 101 here)."""
    run = _play(tmp_path, FaultSpec("ecc_xid", step=165, node=1, gpu=2, duration_steps=35))
    _strict(run)
    (ecc,) = [f for f in run.findings if f["diagnosis"] == "ecc_xid"]
    assert 165 <= ecc["start_step"] <= 176, ecc


def test_device_counters_carry_only_the_errors_counted_by_their_sample() -> None:
    """A chunk's samples before an NVLink fault began show no CRC errors, and its ECC count
    climbs sample by sample (before, every sample of a chunk carried the chunk's last count, so
    evidence read as older than it was)."""
    steps = np.arange(0, 100)
    chunk = StepChunk(steps, np.arange(100.0), np.ones(100), np.zeros((100, 8)),
                      np.ones((100, 8)), np.zeros((100, 8)), np.ones((100, 8)),
                      np.ones((100, 8)), 0.0, 0.0, 0.0, 0.0, 0.0)  # fmt: skip
    nv = Injected("f0", "nvlink", FAULT_KINDS["nvlink"], 50, 90, 0.3, gpus=(0, 1, 2, 3))
    ecc = Injected("f1", "ecc_xid", FAULT_KINDS["ecc_xid"], 60, 100, 0.0, gpus=(5,))
    dev = DeviceSampler(0.0, 10.0, 8, 1, seed=1)
    g = dev.gpu(chunk, dev.grid(0.0, 100.0), np.arange(8), [nv, ecc])
    crc = g["nvlink_crc_errors"].reshape(10, 8)
    sbe = g["ecc_sbe_total"].reshape(10, 8)
    assert (crc[:5] == 0).all() and (crc[5:, :2] > 0).all() and (np.diff(crc[:, 0]) >= 0).all()
    assert (sbe[:7, 5] == 0).all() and (np.diff(sbe[6:, 5]) > 0).all()
    assert dev.crc[0] == crc[-1, 0] and dev.sbe[5] == sbe[-1, 5]


def test_network_block_restated_as_nvlink_once_its_errors_are_counted(tmp_path: Path) -> None:
    """The slow-collective findings of one episode share a key: a block judged network (no NVLink
    errors counted yet) is restated as NVLink by the next, keeping its onset."""
    store = FindingsStore(MetadataStore(f"sqlite:///{tmp_path}/m.db"))
    key = "collectives:j-a0:100"
    net = Diagnosis(key, "network", "slowdown", 0.6, "slow", 149, 100, 149, job_id="j-a0")
    nvl = Diagnosis(key, "nvlink", "slowdown", 0.85, "nvlink", 199, 150, 199,
                    ranks=[8, 9], nodes=["node-0002"], job_id="j-a0")  # fmt: skip
    store.upsert("t", "run", [net])
    (row,) = store.upsert("t", "run", [nvl])
    assert (row.diagnosis, row.start_step, row.step, row.nodes) == ("nvlink", 100, 199,
                                                                    ["node-0002"])  # fmt: skip
    # the episode: consecutive slow blocks, and the next attempt replaying a slow last block
    a0, a1 = JobSpan("j-a0", 0, 330, 0.0, 330.0, 8), JobSpan("j-a1", 300, 400, 400.0, 500.0, 8)
    coll, keys = SlowCollectives(), []
    blocks = [(a0, 100, 149), (a0, 150, 199), (a0, 250, 299), (a0, 300, 330), (a1, 300, 349)]
    for job, s0, s1 in [*blocks, (a1, 400, 400)]:
        coll = coll.after(job, s0, s1)
        keys.append(coll.key)
    assert keys == [key, key, "collectives:j-a0:250", "collectives:j-a0:250",
                    "collectives:j-a0:250", "collectives:j-a1:400"]  # fmt: skip


def test_fold_keeps_stragglers_a_hot_rack_does_not_explain() -> None:
    def strag(rank: int, start: int, diag: str = "thermal") -> Diagnosis:
        return Diagnosis(f"straggler:{rank}", diag, "straggler", 0.9, "", start + 5, start, -1,
                         ranks=[rank])  # fmt: skip

    hot = [["rack-000", 100, 249, list(range(16))]]
    kept = fold_into_racks(
        [strag(3, 120), strag(20, 120), strag(4, 10, "straggler.persistent"), strag(5, 240),
         Diagnosis("straggler:moving", "straggler.moving", "straggler", 0.8, "", 150, 130, -1,
                   ranks=[1, 2, 3])], hot, 50)  # fmt: skip
    assert [d.key for d in kept] == ["straggler:20", "straggler:4", "straggler:moving"]


def test_a_replayed_step_reads_the_scalars_of_the_attempt_analysed(tmp_path: Path) -> None:
    """A grad-norm spike and NaN end attempt a0 at step 116; a1 replays from its checkpoint (step
    100) with healthy values. Each attempt reads its own values of the replayed steps, whatever
    the order the store returns the rows in (before: either, so the spike was seen or not)."""
    (fleet,) = generate_fleets(7, 1, GenConfig(runs_per_fleet=1, healthy_share=0.0))
    scn = replace(fleet.runs[0], faults=(FaultSpec("instability", step=86, duration_steps=30),))
    p = FleetPlayer(tmp_path)
    try:
        (run,) = p.play(Fleet(fleet.name, (scn,)))
        q = DetectQueries(p.tel, fleet.name)
        jobs = [j.job_id for j in q.jobs(scn.job.run_id)]
        gn = {j: q.scalars(scn.job.run_id, ["grad_norm"], 100, 115, j)["grad_norm"][1]
              for j in jobs}  # fmt: skip
    finally:
        p.close()
    assert len(jobs) == 2 and gn[jobs[0]].max() > 5.0 and gn[jobs[1]].max() < 2.0, gn
    _strict(run)


def test_a_short_slow_spell_is_no_persistent_straggler_but_a_short_hot_gpu_is_thermal(
    tmp_path: Path,
) -> None:
    """One rank 30 % slower for 30 steps and healthy again (one episode of an intermittent
    straggler; in the generated runs, mostly a moving straggler's turn seen alone): no
    persistent straggler, which it was (false in every bin). A GPU hot for as short a spell is
    still a thermal finding: its telemetry says why."""
    run = _play(
        tmp_path,
        FaultSpec("straggler.intermittent", step=150, ranks=(5,), magnitude=0.3,
                  duration_steps=30, params={"period": 200, "episode": 30}),
        FaultSpec("thermal", step=200, ranks=(13,), magnitude=0.3, duration_steps=40,
                  params={"ramp_steps": 5}),
    )  # fmt: skip
    assert [(f["diagnosis"], f["ranks"]) for f in run.findings] == [("thermal", [13])]


def test_steps_replayed_after_a_restart_count_once_toward_persistent(tmp_path: Path) -> None:
    """An intermittent straggler (30 of every 60 steps) whose second episode is replayed by the
    restart after a NaN: the replay counted twice made the rank look slow all along, a
    persistent straggler (false) instead of the intermittent one (missed)."""
    run = _play(
        tmp_path,
        FaultSpec("straggler.intermittent", step=40, ranks=(9,), magnitude=0.3,
                  duration_steps=90, params={"period": 60, "episode": 30}),
        FaultSpec("instability", step=100, duration_steps=30),
    )  # fmt: skip
    _strict(run)
    assert sorted(f["diagnosis"] for f in run.findings) == ["instability", "straggler.intermittent"]


def test_a_rack_hot_from_mid_block_is_rack_cooling_not_nvlink(tmp_path: Path) -> None:
    """A rack hot from step 76 (run 0 of the bench's fleet 115, its other faults left out): in
    the block of steps 50-99 the median of two of its nodes is over the threshold and the
    rack's is not, and each slow node, an NVLink domain, was an NVLink finding (false, in a run
    without NVLink fault). Their GPUs throttle for heat, as do half the rack's: the rack."""
    fleet = generate_fleets(18, 116)[115]
    scn = fleet.runs[0]
    scn = replace(scn, faults=tuple(f for f in scn.faults if f.kind == "rack_cooling"))
    assert [(f.step, f.rack) for f in scn.faults] == [(76, 1)]
    run = _play_one(tmp_path, fleet.name, scn)
    _strict(run)
    assert [(f["diagnosis"], f["start_step"]) for f in run.findings] == [("rack_cooling", 50)]


def test_a_rank_slow_again_and_again_beside_a_moving_straggler_is_intermittent(
    tmp_path: Path,
) -> None:
    """Run 2 of the bench's fleet 62: a moving straggler of 9 % (one turn of 37 steps per rank,
    some not seen), rank 38 slow 12 of every 51 steps by 18 %, rank 1 persistent by 9 % and an
    Xid 79. Rank 38 was one more mover, alone as the movers are (the intermittent straggler
    missed, the moving finding naming a rank it never slowed): the slow rank of a moving
    straggler comes back to a rank only after its turns on the others."""
    fleet = generate_fleets(18, 63)[62]
    scn = fleet.runs[2]
    assert sorted(f.kind for f in scn.faults) == [
        "fatal_xid",
        "straggler.intermittent",
        "straggler.moving",
        "straggler.persistent",
    ]
    run = _play_one(tmp_path, fleet.name, scn)
    _strict(run)
    found = {f["diagnosis"]: f["ranks"] for f in run.findings}
    assert found["straggler.intermittent"] == [38] and 38 not in found["straggler.moving"]


def test_a_straggler_that_began_as_a_moving_turn_is_dated_from_its_own_onset(
    tmp_path: Path,
) -> None:
    """Run 3 of the bench's fleet 38: a moving straggler of 50 % (turns of 27 steps) over 8 ranks
    and, from step 186, rank 0 slower by 9 % for good. The mover's turn on rank 0 (from step 162)
    ran into rank 0's own slowdown as one episode, and the persistent straggler was dated from
    the turn (false: 24 steps before its onset; the fault missed). It is dated from where the
    slow rank moved on (step 189)."""
    fleet = generate_fleets(18, 39)[38]
    scn = fleet.runs[3]
    assert sorted(f.kind for f in scn.faults) == ["straggler.moving", "straggler.persistent"]
    run = _play_one(tmp_path, fleet.name, scn)
    _strict(run)
    (pers,) = [f for f in run.findings if f["diagnosis"] == "straggler.persistent"]
    assert pers["ranks"] == [0] and 176 <= pers["start_step"] <= 196, pers


def test_a_job_inside_one_rack_hot_from_its_first_steps_is_rack_cooling(tmp_path: Path) -> None:
    """The first run of a workload, all of it in one rack, the rack hot from step 25: no other
    rack to compare with and no baseline yet, and the hot blocks must not become the baseline
    (generated fleets 64 and 209). The GPUs' throttle reasons say it: one rack-cooling finding,
    the same whatever the passes."""
    hot = FaultSpec("rack_cooling", step=25, rack=0, magnitude=0.3, duration_steps=140)
    found = []
    for i, per in enumerate((100, 37)):
        run = _play(tmp_path / str(i), hot, nodes=4, max_steps=per)
        assert {run.truth.faults[0].rack} == {"rack-000"} and len(run.truth.faults[0].ranks) == 16
        _strict(run)
        assert [f["diagnosis"] for f in run.findings] == ["rack_cooling"], run.findings
        found.append([(f["key"], f["start_step"], f["ranks"]) for f in run.findings])
    assert found[0] == found[1]


def test_an_nvlink_fault_from_step_22_of_a_workloads_first_run_is_not_learned(
    tmp_path: Path,
) -> None:
    """NVLink slows the transfer from step 22 of the first run of a workload (generated fleets
    192, 232, 238): the first block is learned only up to the step (its median is not shifted,
    the fault holding less than half of it), so the next blocks are measured against the healthy
    transfer and the fault is found, whatever the passes."""
    fault = FaultSpec("nvlink", step=22, node=2, magnitude=0.14, duration_steps=200)
    found = []
    for i, per in enumerate((100, 37)):
        run = _play(tmp_path / str(i), fault, max_steps=per)
        _strict(run)
        assert [f["diagnosis"] for f in run.findings] == ["nvlink"], run.findings
        found.append([(f["key"], f["start_step"], f["nodes"]) for f in run.findings])
    assert found[0] == found[1]


def test_instability_reads_what_the_log_says_and_tells_the_chain_in_order() -> None:
    """A Megatron log's first interval logged no loss (its 10 iterations were fp16 loss-scale
    skips, "number of nan iterations: 0"): it was called "LR change -> grad-norm spike -> NaN
    loss" at 90%, steps 30-10 (issue 36)."""
    steps = np.arange(10, 210, 10)
    loss = np.full(len(steps), 3.0)
    loss[0] = np.nan  # not logged
    logged = np.ones(len(steps), bool)
    logged[0] = False
    gn = np.full(len(steps), 2.0)
    gn[0], gn[1], gn[2] = np.nan, 67.0, 81.0  # while the scaler searched, and just after
    lr = np.linspace(0.0, 1.5e-4, len(steps))
    skipped = np.zeros(len(steps))
    skipped[:3] = [10, 8, 1]
    assert diagnose_instability(steps, loss, gn, lr, loss_logged=logged, skipped=skipped) is None
    # A real divergence later: a spike over the grad norms before it, then a NaN loss.
    gn[12], loss[14] = 40.0, np.nan
    d = diagnose_instability(steps, loss, gn, lr, loss_logged=logged, skipped=skipped)
    assert (
        d is not None
        and d.summary == "training instability: LR change -> grad-norm spike -> NaN loss"
    )
    assert d.start_step <= d.step == 130 < d.end_step == 150
    assert [e["step"] for e in d.evidence] == sorted(e["step"] for e in d.evidence)
    # A NaN loss before any spike is told first: the chain never runs backwards.
    gn[12], loss[5] = 2.0, np.nan
    d = diagnose_instability(steps, loss, gn, np.full(len(steps), 1e-4), loss_logged=logged)
    assert d is not None and d.summary == "training instability: NaN loss"
    assert (d.start_step, d.step, d.end_step) == (60, 60, 60)
