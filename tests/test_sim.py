"""The simulator is faithful to what it claims: synchronous steps, faults, restarts, truth."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from fleetlens.errors import ConfigError
from fleetlens.sim import (
    LOSS_CATEGORIES,
    MemorySink,
    list_scenarios,
    load_scenario,
    run_scenario,
    score_detections,
)
from fleetlens.sim.model import FaultSpec, Noise, Scenario

pytestmark = pytest.mark.unit


def _base(**job: object) -> Scenario:
    scn = load_scenario("straggler_persistent")
    return replace(scn, faults=(), job=replace(scn.job, **job))  # type: ignore[arg-type]


def _per_step(sink: MemorySink, job_id: str | None = None) -> dict[str, np.ndarray]:
    cols = ("step", "rank", "duration", "forward", "backward", "optimizer", "comm", "data_wait")
    d = {c: sink.column("step", c, job_id) for c in cols}
    d["compute"] = d["forward"] + d["backward"] + d["optimizer"]
    return d


def _grid(d: dict[str, np.ndarray], name: str, world: int) -> np.ndarray:
    order = np.lexsort((d["rank"], d["step"]))
    return d[name][order].reshape(-1, world)


@pytest.mark.parametrize("noise", [Noise(0.0, 0.0), Noise()])
def test_straggler_slows_the_job_not_the_mean(noise: Noise) -> None:
    scn = replace(_base(steps=400, checkpoint_every=1000), noise=noise)
    world = scn.world_size
    healthy, slow = MemorySink(), MemorySink()
    run_scenario(scn, sink=healthy, seed=5)
    fault = FaultSpec("straggler.persistent", step=0, ranks=(13,), magnitude=0.15)
    truth = run_scenario(replace(scn, faults=(fault,)), sink=slow, seed=5).truth
    h, s = _per_step(healthy), _per_step(slow)
    ch, cs = _grid(h, "compute", world), _grid(s, "compute", world)
    job_h = _grid(h, "duration", world).max(axis=1)
    job_s = _grid(s, "duration", world).max(axis=1)
    # the slowest rank sets the step: +15% of compute, while the mean moves 15% / world
    assert np.mean(cs[:, 13] / ch[:, 13]) == pytest.approx(1.15, rel=1e-9)
    mean_shift = cs.mean() / ch.mean() - 1
    assert mean_shift == pytest.approx(0.15 / world, rel=0.02)
    if noise.rank_cov == 0:
        # exactly: the job waits for the straggler's arrival instead of the latest healthy one
        arr_h = ch + _grid(h, "data_wait", world)
        arr_s = cs + _grid(s, "data_wait", world)
        assert np.all(arr_s.argmax(axis=1) == 13)
        expected = arr_s.max(axis=1) - arr_h.max(axis=1)
        np.testing.assert_allclose(job_s - job_h, expected, atol=2e-4)
        assert 0.85 < (job_s - job_h).mean() / (0.15 * ch[:, 13].mean()) <= 1.0
    else:
        assert 0.08 < job_s.mean() / job_h.mean() - 1 < 0.16
    # every rank's duration is (nearly) the same; the straggler waits least at the collective
    dur = _grid(s, "duration", world)
    assert np.ptp(dur, axis=1).max() < 1e-3
    comm = _grid(s, "comm", world)
    assert np.mean(comm.argmin(axis=1) == 13) > 0.95
    # what the fault added to the job's steps; the loss line is the wait for the slowest rank
    assert truth.injected["straggler"] == pytest.approx((job_s - job_h).sum(), rel=0.01)
    wait = (cs.max(axis=1) - cs.mean(axis=1)).sum()
    assert truth.losses["straggler"] == pytest.approx(wait, rel=1e-9)


def test_rack_cooling_shifts_a_whole_rack_together() -> None:
    sink = MemorySink()
    truth = run_scenario("rack_cooling", sink=sink).truth
    (f,) = truth.faults
    assert len(f.ranks) == 32 and f.rack == "rack-001"
    d = _per_step(sink)
    c = _grid(d, "compute", 64)
    inside = c[f.start_step + 50 : f.end_step].mean(axis=0) / c[:200].mean(axis=0)
    in_rack = np.isin(np.arange(64), f.ranks)
    assert np.all(inside[in_rack] > 1.04) and np.all(inside[~in_rack] < 1.01)
    temp = np.asarray(sink.column("gpu", "gpu_temp"))
    throttled = np.asarray(sink.column("gpu", "throttle_reasons")) > 0
    assert throttled.sum() > 0 and temp[throttled].mean() > temp[~throttled].mean() + 5


def test_fatal_fault_restarts_and_replays_from_checkpoint() -> None:
    sink = MemorySink()
    truth = run_scenario("fatal_xid", sink=sink).truth
    a0, a1 = truth.job_ids
    s0 = set(sink.column("step", "step", a0).tolist())
    s1 = set(sink.column("step", "step", a1).tolist())
    assert max(s0) == 649 and min(s1) == 600  # checkpoint every 200 steps: resume from 600
    assert s0 & s1 == set(range(600, 650))
    assert s0 | s1 == set(range(1200))
    kinds = sink.column("event", "kind")
    assert {"hardware_fault", "failure", "restart", "checkpoint_load", "finish"} <= set(kinds)
    attrs = [json.loads(a) for a, k in zip(sink.column("event", "attrs"), kinds, strict=True)
             if k == "hardware_fault"]  # fmt: skip
    assert attrs == [{"xid": 79}]
    assert 79.0 in set(np.asarray(sink.column("gpu", "xid")).tolist())
    # the failed node is replaced by a spare in the second attempt's placement
    nodes0 = set(sink.column("placement", "node_id", a0))
    nodes1 = set(sink.column("placement", "node_id", a1))
    assert truth.faults[0].nodes[0] in nodes0 - nodes1


def test_the_sample_carrying_an_xid_leaves_the_other_samples_whole() -> None:
    # It has no temperature or clocks; batched with the attempt's other DCGM samples it used to
    # strip them of theirs (a hot GPU of that attempt then looked healthy).
    sink = MemorySink()
    a0 = run_scenario("fatal_xid", sink=sink).truth.job_ids[0]
    xid = np.asarray(sink.column("gpu", "xid", a0), dtype=float)
    temp = np.asarray(sink.column("gpu", "gpu_temp", a0), dtype=float)
    clock = np.asarray(sink.column("gpu", "sm_clock", a0), dtype=float)
    assert len(temp) == len(xid) > 1000 and (xid == 79).sum() == 1
    assert np.isfinite(temp[xid != 79]).all() and np.isfinite(clock[xid != 79]).all()
    assert np.isnan(temp[xid == 79]).all()


def test_hang_leaves_one_rank_out_of_the_collective() -> None:
    sink = MemorySink()
    truth = run_scenario("hang", sink=sink).truth
    (f,) = truth.faults
    steps = np.asarray(sink.column("collective", "step", truth.job_ids[0]))
    ranks = np.asarray(sink.column("collective", "rank", truth.job_ids[0]))
    at_hang = set(ranks[steps == f.start_step].tolist())
    assert at_hang == set(range(64)) - {45}
    assert truth.losses["hang"] >= 300.0


@pytest.mark.parametrize("name", sorted(n for n in list_scenarios() if n != "mixed_54d"))
def test_every_fault_in_truth_and_losses_sum_to_wall_clock(name: str) -> None:
    scn = load_scenario(name)
    if name == "healthy_24h":
        scn = replace(scn, job=replace(scn.job, steps=900))
    truth = run_scenario(scn, sink=MemorySink()).truth
    assert {f.kind for f in truth.faults} == {f.kind for f in scn.faults}
    for f in truth.faults:
        assert f.start_time is not None and f.end_time is not None and f.job_ids
        assert f.owner in {"training_code", "infrastructure", "network", "data_pipeline", "host",
                           "scheduler", "storage"}  # fmt: skip
    assert set(truth.losses) == set(LOSS_CATEGORIES)
    assert sum(truth.losses.values()) == pytest.approx(truth.wall_clock, rel=1e-9)
    assert truth.losses["productive"] > 0


def test_mixed_replay_draws_the_llama3_mix() -> None:
    scn = load_scenario("mixed_54d")
    assert scn.rates is not None
    from fleetlens.sim.rates import draw_faults

    faults = draw_faults(scn, scn.rates, np.random.default_rng(0))
    assert 350 < len(faults) < 490  # 419 expected over the 54 days
    kinds = [f.kind for f in faults]
    assert kinds.count("fatal_xid") > kinds.count("crash") > kinds.count("hang")
    short = replace(scn, job=replace(scn.job, steps=3000))
    truth = run_scenario(short, sink=MemorySink()).truth
    assert sum(truth.losses.values()) == pytest.approx(truth.wall_clock, rel=1e-9)
    assert len(truth.job_ids) > 1


def test_score_detections() -> None:
    truth = run_scenario("demo", sink=MemorySink()).truth
    by_kind = {f.kind: f for f in truth.faults}
    strag, xid = by_kind["straggler.persistent"], by_kind["fatal_xid"]
    assert strag.start_time is not None and xid.start_time is not None
    dets = [
        {"diagnosis": "straggler", "ranks": [37], "time": strag.start_time + 30, "step": 330},
        {"diagnosis": "fatal_xid", "nodes": xid.nodes, "time": xid.start_time + 5},
        {"diagnosis": "network", "time": strag.start_time},  # nothing of the kind injected
    ]
    s = score_detections(truth, dets)
    assert s.precision == pytest.approx(2 / 3)
    assert s.recall == pytest.approx(2 / 4)
    assert s.seconds_to_detect[strag.id] == pytest.approx(30.0)
    assert s.steps_to_detect[strag.id] == 30


def test_bad_scenarios_are_refused_with_the_key() -> None:
    with pytest.raises(ConfigError, match="warp"):
        Scenario.from_dict({"warp": 1})
    with pytest.raises(ConfigError, match="kind 'gremlin'"):
        Scenario.from_dict({"faults": [{"kind": "gremlin", "step": 1}]})
    with pytest.raises(ConfigError, match="ranks"):
        Scenario.from_dict({"faults": [{"kind": "hang", "step": 1, "ranks": [999]}]})
    with pytest.raises(ConfigError, match="not found"):
        load_scenario("no_such_scenario")


def test_directory_output_decodes_and_truth_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fleetlens.collector.decode import decode_batch
    from fleetlens.sim import GroundTruth

    scn = load_scenario("data_stall")
    res = run_scenario(replace(scn, job=replace(scn.job, steps=700)), out_dir=tmp_path)
    assert res.truth_path is not None
    back = GroundTruth.read(res.truth_path)
    assert back.faults[0].diagnosis == "data_stall" and back.faults[0].owner == "data_pipeline"
    rows: dict[str, int] = {}
    for f in sorted((tmp_path / "batches").iterdir()):
        for kind, (n, _) in decode_batch(f.read_bytes()).tables.items():
            rows[kind] = rows.get(kind, 0) + n
    assert rows == res.records
    assert rows["step"] == 700 * 64
