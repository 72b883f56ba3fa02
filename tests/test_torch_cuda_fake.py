"""The CUDA timing path of fleetlens.torch, on a model of GPUs with CUDA's ordering (fake_cuda).

Three DDP ranks with two gradient buckets each: forward 10 ms, backward 20 ms, optimizer 5 ms,
4 ms per all-reduce, 1 ms to copy the reduced gradients back. On the device, each rank's
backward is its compute up to the last bucket and ``comm`` after it, as on CPU; collectives
carry device times; nothing synchronizes the device before ``flush``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from fleetlens.torch import TorchRun
from fleetlens.torch.cuda import MAX_PENDING_STEPS

from .fake_cuda import BASE, DDP, Cluster, Gpu, RecordingRun

pytestmark = pytest.mark.unit

FWD, BWD, OPT, TRANSFER, COPY = 0.010, 0.020, 0.005, 0.004, 0.001
STEP = FWD + BWD + COPY + TRANSFER + OPT  # 40 ms: the last bucket's all-reduce is exposed


def _ms(x: float) -> Any:
    """A duration (elapsed_time is exact in the model)."""
    return pytest.approx(x, abs=1e-9)


def _at(t: float) -> Any:
    """A UNIX time: as exact as a float near 1.7e9 is."""
    return pytest.approx(BASE + t, abs=1e-6)


def _device(phases: dict[str, float]) -> dict[str, float]:
    """The device phases (``data`` is the loader's host time, a few microseconds here)."""
    return {k: v for k, v in phases.items() if k != "data"}


class Job:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, world: int, transfer: float) -> None:
        self.cluster = Cluster(world, transfer)
        self.cluster.install(monkeypatch)
        self.runs = [RecordingRun() for _ in range(world)]
        self.trs = [
            TorchRun(r, "cuda", cuda_api=g)
            for r, g in zip(self.runs, self.cluster.gpus, strict=True)
        ]  # type: ignore[arg-type]
        self.ddps = [DDP(self.cluster, copy_back=COPY) for _ in range(world)]
        for r in range(world):
            self.cluster.active = r
            self.trs[r].watch_ddp(self.ddps[r])  # type: ignore[arg-type]
        self.stall: dict[tuple[int, int], float] = {}  # (rank, step) -> seconds the loader blocks
        self.slept: dict[tuple[int, int], float] = {}  # the host time each block took
        self.loaders = [self.trs[r].loader(self._batches(r)) for r in range(world)]

    def _batches(self, rank: int) -> Iterator[int]:
        n = 0
        while True:
            wait = self.stall.get((rank, n), 0.0)
            if wait:
                t0 = time.perf_counter()
                time.sleep(wait)  # the loader's host timer is real
                self.slept[(rank, n)] = time.perf_counter() - t0
                self.cluster.gpus[rank].host_sleep(wait)
            yield n
            n += 1

    def train(
        self, steps: int, extra_fwd: dict[int, float] | None = None, from_step: int = 0
    ) -> None:
        """``extra_fwd``: rank -> seconds more in its forward pass, from ``from_step`` on."""
        for n in range(steps):
            for r, (tr, ddp) in enumerate(zip(self.trs, self.ddps, strict=True)):
                self.cluster.active = r
                gpu = self.cluster.gpu
                next(self.loaders[r])
                with tr.step(n, tokens=100):
                    with tr.phase("forward"):
                        slow = (extra_fwd or {}).get(r, 0.0) if n >= from_step else 0.0
                        gpu.kernel(FWD + slow)
                    with tr.phase("backward"):
                        ddp.backward(BWD)
                    with tr.phase("optimizer"):
                        gpu.kernel(OPT)
            for gpu in self.cluster.gpus:  # loss.item(): the host waits for its device
                gpu.host_wait(gpu.default.tail)

    def flush(self) -> None:
        for r, tr in enumerate(self.trs):
            self.cluster.active = r
            tr.flush()

    def steps(self, rank: int) -> dict[int, dict[str, Any]]:
        return {s["step"]: s for s in self.runs[rank].steps}

    def compute(self, rank: int, step: int) -> float:
        ph = self.steps(rank)[step]["phases"]
        return float(ph["forward"] + ph["backward"] + ph["optimizer"])

    def comm(self, rank: int, step: int) -> float:
        return float(self.steps(rank)[step]["phases"]["comm"])


def _collectives(job: Job, step: int, seq: int) -> dict[int, dict[str, Any]]:
    return {
        r: next(c for c in run.collectives if c["step"] == step and c["seq"] == seq)
        for r, run in enumerate(job.runs)
    }


def test_a_balanced_step_splits_backward_at_the_last_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = Job(monkeypatch, 3, TRANSFER)
    job.train(4)
    job.flush()
    for r in range(3):
        steps = job.steps(r)
        assert sorted(steps) == [0, 1, 2, 3]
        for n, s in steps.items():
            assert _device(s["phases"]) == {
                "forward": _ms(FWD),
                "backward": _ms(BWD),
                "comm": _ms(COPY + TRANSFER),
                "optimizer": _ms(OPT),
            }
            assert s["duration"] == _ms(STEP)
            assert sum(_device(s["phases"]).values()) == _ms(
                s["duration"]
            )  # the phases fill the step
            assert s["time"] == _at(n * STEP)  # device time, on the host's clock
            assert s["tokens"] == 100
        assert job.trs[r].errors == 0
    # Device times of the collectives, not when the host enqueued them (all at once, here).
    first = _collectives(job, 1, 0)
    for c in first.values():
        assert c["enter"] == _at(STEP + FWD + BWD / 2)
        assert c["exit"] == _at(STEP + FWD + BWD / 2 + TRANSFER)
        assert c["op"] == "all_reduce" and c["bytes"] == 256 * 4


def test_a_slow_rank_has_its_compute_raised_and_the_others_their_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = Job(monkeypatch, 3, TRANSFER)
    extra = 0.030
    job.train(4, extra_fwd={1: extra}, from_step=2)
    job.flush()
    for n in (0, 1):  # before it slowed down, every rank looked the same
        assert [job.compute(r, n) for r in range(3)] == [_ms(FWD + BWD + OPT)] * 3
    for n in (2, 3):
        for r in range(3):  # a synchronous job: every rank's step is as slow as the slowest
            assert job.steps(r)[n]["duration"] == _ms(STEP + extra)
        assert job.compute(1, n) == _ms(FWD + extra + BWD + OPT)
        assert job.comm(1, n) == _ms(COPY + TRANSFER)  # its waiting is not raised
        for r in (0, 2):
            assert job.compute(r, n) == _ms(FWD + BWD + OPT)  # theirs is unchanged ...
            assert job.comm(r, n) == _ms(COPY + TRANSFER + extra)  # ... they wait for it
        # It arrives last at every collective, and the others leave only after it arrived.
        for seq in (0, 1):
            colls = _collectives(job, n, seq)
            assert max(colls, key=lambda r: colls[r]["enter"]) == 1
            assert colls[1]["enter"] - colls[0]["enter"] == pytest.approx(extra, abs=1e-6)
            for c in colls.values():
                assert c["exit"] == pytest.approx(colls[1]["enter"] + TRANSFER, abs=1e-6)
    assert all(tr.errors == 0 for tr in job.trs)


def test_a_slow_network_raises_everyones_waiting_and_no_ones_compute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow_net = 0.024
    job = Job(monkeypatch, 3, slow_net)
    job.train(3)
    job.flush()
    for r in range(3):
        for n in range(3):
            assert job.compute(r, n) == _ms(FWD + BWD + OPT)
            # The second bucket's all-reduce queues behind the first on the communication stream.
            assert job.comm(r, n) == _ms(FWD + BWD / 2 + 2 * slow_net - (FWD + BWD) + COPY)
        first, second = (c for c in job.runs[r].collectives if c["step"] == 1)
        assert first["exit"] - first["enter"] == pytest.approx(slow_net, abs=1e-6)
        assert second["exit"] - second["enter"] == pytest.approx(2 * slow_net - BWD / 2, abs=1e-6)


def test_a_data_stall_is_time_outside_the_device_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    stall = 0.030
    job = Job(monkeypatch, 3, TRANSFER)
    job.stall[(0, 2)] = stall  # rank 0's loader blocks before step 2
    job.train(4)
    job.flush()
    s0 = job.steps(0)
    # The block as the host timed it (a busy machine oversleeps): the data phase holds it and
    # little else.
    slept = job.slept[(0, 2)]
    # (The bounds leave room for a preemption of a busy machine: an idle loader's next() is
    # microseconds, the stall 30 ms.)
    assert stall <= slept <= s0[2]["phases"]["data"] < slept + 0.2
    assert all(s["phases"].get("data", 0) < 0.01 for n, s in s0.items() if n != 2)
    # Its device sat idle before the step: the step starts late and its phases are unchanged.
    gap = s0[2]["time"] - (s0[1]["time"] + s0[1]["duration"])
    assert gap == pytest.approx(stall, abs=1e-6)
    assert job.compute(0, 2) == _ms(FWD + BWD + OPT) and job.comm(0, 2) == _ms(COPY + TRANSFER)
    for r in (1, 2):  # the others started on time and waited for it at the all-reduce
        assert job.compute(r, 2) == _ms(FWD + BWD + OPT)
        assert job.comm(r, 2) == _ms(COPY + TRANSFER + stall)
        assert job.steps(r)[2]["phases"].get("data", 0) < 0.01


def test_nothing_is_read_before_the_device_has_passed_it_and_nothing_synchronizes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = Job(monkeypatch, 2, TRANSFER)
    job.train(3)
    # Step n is read back when step n+1 begins (the host had waited for it): never early.
    assert [s["step"] for s in job.runs[0].steps] == [0, 1]
    assert [g.syncs for g in job.cluster.gpus] == [0, 0]
    job.flush()
    assert [s["step"] for s in job.runs[0].steps] == [0, 1, 2]
    assert [g.syncs for g in job.cluster.gpus] == [1, 1]
    assert all(tr.errors == 0 for tr in job.trs)  # elapsed_time never met an unfinished event
    assert len(job.runs[0].collectives) == 3 * 2


def test_a_host_far_ahead_of_the_device_keeps_a_bounded_backlog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = Gpu(0)
    run = RecordingRun()
    tr = TorchRun(run, "cuda", cuda_api=gpu)  # type: ignore[arg-type]
    n_steps = MAX_PENDING_STEPS + 6
    for n in range(n_steps):  # the host never waits: the device is always behind
        with tr.step(n), tr.phase("forward"):
            gpu.kernel(0.010)
    assert run.steps == [] and tr.dropped_steps == 6 and gpu.syncs == 0
    tr.flush()
    assert [s["step"] for s in run.steps] == list(range(6, n_steps))
    assert run.steps[-1]["time"] == _at((n_steps - 1) * 0.010)
    assert tr.errors == 0


def test_a_step_that_cannot_be_read_back_is_dropped_and_counted_not_stuck() -> None:
    gpu = Gpu(0)
    run = RecordingRun()
    tr = TorchRun(run, "cuda", cuda_api=gpu)  # type: ignore[arg-type]
    for n in range(4):
        with tr.step(n):
            gpu.break_next = n == 1  # the driver fails on an event of step 1
            with tr.phase("forward"):
                gpu.kernel(0.010)
        gpu.host_wait(gpu.default.tail)
    tr.flush()
    assert [s["step"] for s in run.steps] == [0, 2, 3] and tr.errors == 1


@pytest.mark.parametrize("anchor", ["missing", "delayed"])
def test_device_times_stay_exact_without_a_prompt_anchor(
    monkeypatch: pytest.MonkeyPatch, anchor: str
) -> None:
    """Each event is a lower bound on the anchor's time; one recorded while the device was idle
    makes it exact, whether the side stream is missing or stuck behind other work."""
    job = Job(monkeypatch, 2, TRANSFER)
    for gpu in job.cluster.gpus:
        if anchor == "missing":
            gpu.side_stream_fails = True
        else:
            busy = gpu.new_stream("shared-queue")
            busy.enqueue(5.0)  # the anchor's stream shares a hardware queue with 5 s of work
            monkeypatch.setattr(gpu, "side_stream", lambda busy=busy: busy)
    job.train(3)
    job.flush()
    for r in range(2):
        assert [s["time"] for s in job.runs[r].steps] == [_at(n * STEP) for n in range(3)]
        assert job.trs[r].errors == (1 if anchor == "missing" else 0)  # counted once
        first = _collectives(job, 0, 0)[r]
        assert first["enter"] == _at(FWD + BWD / 2)


def test_an_explicit_all_reduce_is_timed_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(2, TRANSFER)
    cluster.install(monkeypatch)
    runs = [RecordingRun(), RecordingRun()]
    trs = [TorchRun(run, "cuda", cuda_api=g) for run, g in zip(runs, cluster.gpus, strict=True)]  # type: ignore[arg-type]

    for r in range(2):
        cluster.active = r
        with trs[r].step(0):
            cluster.gpu.kernel(0.010 + 0.030 * r)  # rank 1 gets there 30 ms later
            trs[r].all_reduce(torch.ones(4), name="metrics")
    for r in range(2):
        cluster.active = r
        trs[r].flush()
    c0, c1 = runs[0].collectives[0], runs[1].collectives[0]
    assert c0["enter"] == _at(0.010) and c1["enter"] == _at(0.040)
    assert c0["exit"] == _at(0.040 + TRANSFER) and c1["exit"] == _at(0.040 + TRANSFER)
    assert c0["group"] == "metrics" and c0["bytes"] == 16
