"""A real out-of-memory error in a training loop ends as an ``oom`` finding with its step.

The training process is real (a small model trained with torch on the CPU, instrumented by the
SDK), and so is its out-of-memory error: the process's address space is limited
(``RLIMIT_AS``), and at step 5 the loop asks torch's CPU allocator for more than is left, as a
batch that grew would. Torch raises what it raises (a ``RuntimeError`` from
``DefaultCPUAllocator``); the process dies of it as a training script does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleetlens.sdk.oom import oom_attrs
from fleetlens.testing import Server, wait_until

pytestmark = pytest.mark.unit

pytest.importorskip("torch")

_SCRIPT = textwrap.dedent(
    """
    import os, resource, sys
    import torch
    import fleetlens

    run = fleetlens.init(project="p", run_id="oom-run", install_signal_handler=False,
                         config={"micro_batch_size": 8, "seq_len": 2048})
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    page = os.sysconf("SC_PAGE_SIZE")
    used = int(open("/proc/self/statm").read().split()[0]) * page
    resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 2**20, resource.RLIM_INFINITY))
    for i in range(10):
        with run.step(i, tokens=8 * 2048):
            rows = 32 if i != 5 else 2**26  # step 5: a batch 2 million times larger
            x = torch.randn(rows, 64)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """
)


@pytest.mark.e2e
def test_a_real_cpu_out_of_memory_is_an_oom_finding_with_its_step(
    server: Server, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "FLEETLENS_SERVER": server.url, "OMP_NUM_THREADS": "1",
           "FLEETLENS_SPOOL_DIR": str(tmp_path / "spool")}  # fmt: skip
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode != 0 and "DefaultCPUAllocator" in out.stderr, out.stderr[-2000:]

    def oom() -> dict | None:  # type: ignore[type-arg]
        status, doc = server.request("GET", "/v1/runs/oom-run/diagnosis")
        found = [f for f in doc.get("findings", [])] if status == 200 else []
        return next((f for f in found if f["diagnosis"] == "oom"), None)

    finding = wait_until(oom, 30, what="an oom finding")
    assert finding["step"] == 5 and finding["ranks"] == [0], finding
    assert finding["owner"] == "training_code"
    assert "out of memory at step 5 on rank 0 asking 16.00 GiB on cpu" in finding["summary"]
    assert "(batch 8, sequence length 2048)" in finding["summary"], finding["summary"]
    ev = finding["evidence"][0]
    assert ev["requestedBytes"] == 2**26 * 64 * 4 and ev["device"] == "cpu", ev
    diagnoses = [f["diagnosis"] for f in server.get("/v1/runs/oom-run/diagnosis")["findings"]]
    assert "software_crash" not in diagnoses, diagnoses


def test_device_out_of_memory_messages_are_read_as_torch_writes_them() -> None:
    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name and base
        pass

    cuda = OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB "
        "of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB "
        "memory in use."
    )
    attrs = oom_attrs(cuda, {"batch_size": 4, "max_seq_len": 8192})
    assert attrs is not None
    assert attrs["requested_bytes"] == 2 * 2**30 and attrs["device"] == "cuda:0"
    assert attrs["device_total_bytes"] == int(79.11 * 2**30)
    assert attrs["batch_size"] == 4 and attrs["seq_len"] == 8192
    assert oom_attrs(MemoryError(), {}) == {"type": "MemoryError", "device": "cpu"}
    assert oom_attrs(ValueError("shapes do not match"), {"batch_size": 4}) is None
    assert oom_attrs(RuntimeError("NCCL error: unhandled system error"), {}) is None
