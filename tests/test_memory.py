"""Memory over time (issue 39 item 4, seed 001 s6): each rank's device and process memory per
step, its headroom and its climb, and the ``oom`` finding that shows the climb before it.

The end-to-end test trains a real model with torch on the CPU, instrumented as the docs show
(``TorchRun.log(step, memory=True)``), with a bug users write: the step's outputs kept in a list
for a metric at the end of the epoch, so the process grows by one output a step. Its memory
limit comes from outside, as a batch system's would: once the run is on the server the test sets
the process's address-space limit (``prlimit``), and torch's allocator fails when the kept
outputs reach it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench._delivery import from_matrix
from fleetlens.analysis.memory import climb, pool_memory, size_text, steady
from fleetlens.scalars import DEVICE_MEMORY_SCALARS, HOST_MEMORY_SCALARS
from fleetlens.sdk.memory import MemorySampler
from fleetlens.sim.emit import encode
from fleetlens.testing import InProcessServer, Server, wait_passes, wait_until

from .test_cli import fleetlens_cmd

pytestmark = pytest.mark.unit

MiB, GiB = 2**20, 2**30


def test_a_steady_climb_is_its_slope_and_the_steps_left_to_the_limit() -> None:
    steps = list(range(0, 40, 2))
    used = [1 * GiB + 100 * MiB * s for s in steps]
    c = climb(steps, used)
    assert c is not None and c.per_step == pytest.approx(100 * MiB)
    assert (c.from_step, c.to_step) == (0, 38) and c.to_bytes == used[-1]
    last = {"host_used_bytes": float(used[-1]), "host_limit_bytes": 8.0 * GiB}
    peak = {"host_used_bytes": float(used[-1]), "host_peak_bytes": float(used[-1]) + MiB}
    p = pool_memory(3, "host", last, peak, steps, used)
    assert p is not None and p.rank == 3 and p.pool == "host"
    assert p.peak == used[-1] + MiB and p.headroom == 8 * GiB - p.peak
    assert p.steps_to_limit == pytest.approx((8 * GiB - used[-1]) / (100 * MiB))
    assert c.text(8.0 * GiB) == (
        "memory climbed from 1.00 GiB at step 0 to 4.71 GiB at step 38 (+100.0 MiB a step) of "
        "8.00 GiB"
    )
    # a model that fits: flat after its first steps, no limit in sight
    flat = climb([0, 1, 2, 3], [2 * GiB, 2 * GiB, 2 * GiB, 2 * GiB])
    assert flat is not None and flat.per_step == 0.0
    assert flat.text(None) == "memory held at 2.00 GiB from step 0 to 3"
    two = {"host_used_bytes": 2.0 * GiB}
    f = pool_memory(0, "host", two, two, [0, 1, 2, 3], [2 * GiB] * 4)
    assert f is not None and f.steps_to_limit is None and f.headroom is None


def test_only_a_steady_climb_counts_not_a_models_first_steps() -> None:
    steps = list(range(60))
    assert steady(steps, [GiB + MiB * s for s in steps])  # a leak: the same pace throughout
    warm = [GiB + 200 * MiB * min(s, 5) for s in steps]  # the allocator warms up, then holds
    assert not steady(steps, warm)
    assert not steady(steps[:10], [GiB + MiB * s for s in steps[:10]])  # too few steps to say
    assert not steady(steps, [2 * GiB - MiB * s for s in steps])  # falling


def test_the_device_pool_is_the_allocators_reserved_bytes_against_the_capacity() -> None:
    last = {
        "mem_allocated_bytes": 30.0 * GiB,
        "mem_reserved_bytes": 34.0 * GiB,
        "mem_total_bytes": 80.0 * GiB,
    }
    peak = {**last, "mem_max_allocated_bytes": 41.0 * GiB}
    p = pool_memory(0, "device", last, peak, [10], [34 * GiB])
    assert p is not None and p.used == 34 * GiB and p.peak == 41 * GiB
    assert p.limit == 80 * GiB and p.headroom == 39 * GiB
    assert pool_memory(0, "device", {"host_used_bytes": 1.0}, {}, [], []) is None


def test_the_process_sample_is_this_process_read_from_the_kernel() -> None:
    got = MemorySampler().sample()
    assert set(got) <= {*HOST_MEMORY_SCALARS, *DEVICE_MEMORY_SCALARS}
    status = Path("/proc/self/status").read_text()
    rss = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS:"))) * 1024
    assert 0.5 * rss < got["host_used_bytes"] < 2 * rss
    assert got["host_peak_bytes"] >= got["host_used_bytes"]
    assert (
        got["host_used_bytes"]
        < got["host_limit_bytes"]
        <= os.sysconf("SC_PHYS_PAGES") * (os.sysconf("SC_PAGE_SIZE"))
    )
    # torch imported but CUDA never initialised (no GPU here): no device pool, nothing raised
    assert not set(got) & set(DEVICE_MEMORY_SCALARS)


@pytest.mark.e2e  # a process of its own: the limit is not this one's to change
def test_under_an_address_space_limit_the_sample_is_the_address_space_against_it() -> None:
    code = textwrap.dedent(
        """
        import json, resource
        from fleetlens.sdk.memory import MemorySampler
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, resource.RLIM_INFINITY))
        print(json.dumps(MemorySampler().sample()))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["host_limit_bytes"] == 8 << 30
    assert got["host_used_bytes"] > 0 and got["host_peak_bytes"] >= got["host_used_bytes"]


def _memory_rows(srv: InProcessServer, run: str, rank: int, used: np.ndarray, limit: float) -> None:
    n = len(used)
    cols = {
        "step": np.repeat(np.arange(n, dtype=np.int64), 2),
        "rank": np.full(2 * n, rank, dtype=np.int32),
        "time": np.repeat(1.7e9 + np.arange(n, dtype=np.float64), 2),
        "name": ["host_used_bytes", "host_limit_bytes"] * n,
        "value": np.column_stack([used, np.full(n, limit)]).ravel(),
    }
    ctx = {"run_id": run, "job_id": f"{run}-a0", "project": "real"}
    assert srv.post(encode(ctx, {"scalar": (2 * n, cols)}))[0] == 200


@pytest.mark.api
def test_a_rank_climbing_to_its_limit_is_a_memory_climb_finding_before_it_fails(
    tmp_path: Path,
) -> None:
    """Three ranks over 60 steps against 8 GiB: rank 2 grows 60 MiB a step from 2 GiB (at step
    59 it has about 2.5 GiB and 40 steps left), rank 1 grows 1 MiB a step (thousands of steps
    from its limit), rank 0 holds. One finding, rank 2's, owned by the training code."""
    with InProcessServer(str(tmp_path / "data"), settings={"analysis_interval_s": 0.2}) as srv:
        rec = from_matrix("m", np.arange(60), np.full((60, 3), 0.2), 1.7e9, {"model": "m"})
        for ctx, tables in [*rec.first, *rec.other]:
            assert srv.post(encode(ctx, tables))[0] == 200
        for ctx, cols in rec.steps:
            assert srv.post(encode(ctx, {"step": (len(cols["step"]), cols)}))[0] == 200
        steps = np.arange(60, dtype=np.float64)
        _memory_rows(srv, "m", 0, np.full(60, 3.0 * GiB), 8 * GiB)
        _memory_rows(srv, "m", 1, 3.0 * GiB + MiB * steps, 8 * GiB)
        _memory_rows(srv, "m", 2, 2.0 * GiB + 60 * MiB * steps, 8 * GiB)

        def climbs() -> list[dict[str, Any]]:
            found = srv.get("/v1/runs/m/diagnosis")["findings"]
            return [f for f in found if f["diagnosis"] == "memory_climb"]

        wait_until(climbs, timeout=60)
        wait_passes(srv, 3)  # and later passes find no other
        (climb,) = climbs()
        assert climb["ranks"] == [2] and climb["owner"] == "training_code", climb
        left = (8 * GiB - (2 * GiB + 60 * MiB * 59)) / (60 * MiB)
        assert climb["summary"] == (
            "process memory of rank 2 climbs to its limit: memory climbed from 2.00 GiB at step 0 "
            f"to 5.46 GiB at step 59 (+60.0 MiB a step) of 8.00 GiB; at this pace it runs out in "
            f"about {left:,.0f} steps"
        )
        (ev,) = climb["evidence"]
        assert ev["stepsToLimit"] == pytest.approx(left) and ev["perStepBytes"] == 60 * MiB


_LEAK = textwrap.dedent(
    """
    import torch
    import fleetlens, fleetlens.torch

    run = fleetlens.init(project="p", run_id="leak-run", install_signal_handler=False)
    tr = fleetlens.torch.TorchRun(run, "cpu")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    outputs = []  # for an epoch metric; the bug: the whole output kept, not a number of it
    for i in range(1_000_000):
        with tr.step(i):
            out = model(torch.randn(256, 1024))
            loss = out.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            outputs.append(out.detach())
        tr.log(i, loss=loss, memory=True)
    """
)


def _vm_size(pid: int) -> int:
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("VmSize:"):
            return int(ln.split()[1]) * 1024
    raise AssertionError("no VmSize")


@pytest.mark.e2e
def test_a_leaking_real_job_shows_its_climb_and_the_oom_finding_shows_it_too(
    server: Server, tmp_path: Path, browser: Any
) -> None:
    script = tmp_path / "train.py"
    script.write_text(_LEAK)
    env = {
        **os.environ,
        "FLEETLENS_SERVER": server.url,
        "OMP_NUM_THREADS": "1",
        "FLEETLENS_SPOOL_DIR": str(tmp_path / "spool"),
        "FLEETLENS_RELAY": "off",
    }
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        on_server = lambda: server.request("GET", "/v1/runs/leak-run")[0] == 200  # noqa: E731
        wait_until(on_server, 60, what="the run on the server")
        limit = _vm_size(proc.pid) + 160 * MiB  # what the batch system grants: 160 MiB more
        resource.prlimit(proc.pid, resource.RLIMIT_AS, (limit, limit))
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0 and "DefaultCPUAllocator" in err, err[-2000:]

    def oom() -> dict[str, Any] | None:
        doc = server.get("/v1/runs/leak-run/diagnosis")
        f = next((f for f in doc.get("findings", []) if f["diagnosis"] == "oom"), None)
        return f if f and any(e.get("signal") == "memory_climb" for e in f["evidence"]) else None

    finding = wait_until(oom, 60, what="an oom finding with its memory climb")
    step = finding["step"]
    climbed = next(e for e in finding["evidence"] if e.get("signal") == "memory_climb")
    # one kept output (256 x 1024 floats, 1 MiB) a step, against the limit set from outside
    assert 0.5 * MiB < climbed["perStepBytes"] < 3 * MiB, climbed
    assert climbed["toStep"] == step and climbed["limitBytes"] == limit, climbed
    # up to the limit: where it started depends on what step 0 held, not on the leak
    assert climbed["fromBytes"] < climbed["toBytes"] and limit - climbed["toBytes"] < 32 * MiB, (
        climbed
    )
    summary = finding["summary"]
    assert f"memory climbed from {size_text(climbed['fromBytes'])} at step 0" in summary
    assert f"at step {step} (+" in summary and " MiB a step) of " in summary, summary
    assert summary.endswith(f"of {size_text(limit)}"), summary

    # the climb was a finding of its own, the rank named (it warns before the error does)
    found = server.get("/v1/runs/leak-run/diagnosis")["findings"]
    (warned,) = [f for f in found if f["diagnosis"] == "memory_climb"]
    assert warned["ranks"] == [0] and "process memory of rank 0 climbs" in warned["summary"]
    mem = server.get("/v1/runs/leak-run/memory")
    (host,) = [p for p in mem["pools"] if p["rank"] == 0]
    assert host["pool"] == "host" and host["limitBytes"] == limit
    assert host["headroomBytes"] == limit - host["peakBytes"] < 32 * MiB, host
    assert 0.5 * MiB < host["climb"]["perStepBytes"] < 3 * MiB
    (series,) = mem["series"]
    assert series["steps"][-1] == step and series["usedBytes"][-1] > series["usedBytes"][0]
    assert server.request("GET", "/v1/runs/no-such-run/memory")[0] == 404

    done = fleetlens_cmd("memory", "leak-run", "--server", server.url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "run leak-run: memory per rank in GiB, least headroom first"
    row = lines[2].split()
    assert row[:2] == ["0", "host"] and row[4] == f"{limit / GiB:,.2f}", lines

    page = browser.new_page()
    try:
        page.goto(f"{server.url}/runs/leak-run")
        page.wait_for_selector("#memory-sec:not([hidden]) #memory tbody tr", timeout=60_000)
        first = page.query_selector_all("#memory tbody tr:first-child > *")
        cells = [c.inner_text().strip() for c in first]
        assert cells[:2] == ["0", "host"] and cells[4] == size_text(limit), cells
        assert page.inner_text("#memory-note").startswith("Least headroom: rank 0 (host)")
        assert page.query_selector("#chart-memory canvas") is not None
    finally:
        page.close()
