"""``fleetlens fr import`` and ``POST /v1/runs/{id}/flight-recorder`` on the real NVRx dumps.

The dumps (tests/data/real/nccl_flight_recorder, see its README) go through the CLI, in a
subprocess, into a real server, as PyTorch writes them (a pickle of the dump's dict, one file
``nccl_trace_rank_<rank>`` per rank) and as JSON; the answer is read back through the API.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetlens.testing import Server, step_batch
from fleetlens.wire import TableBuilder, encode_batch

from .test_cli import fleetlens_cmd

pytestmark = pytest.mark.e2e

FR = Path(__file__).resolve().parent / "data" / "real" / "nccl_flight_recorder"
NVRX = FR / "nvidia_resiliency_ext_16rank"
SCENARIOS = [("gpu_error_1st", {12}), ("lock_gil_1st", {9, 14})]  # as tests/test_detect.py


def _node(rank: int) -> str:
    return f"node-{rank // 8}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(str(tmp_path_factory.mktemp("fr") / "data")).start()
    try:
        yield srv
    finally:
        srv.stop()


def _run(server: Server, run_id: str) -> None:
    """A 16-rank run on two nodes of eight GPUs (its placement), with a few steps."""
    ctx = {"run_id": run_id, "job_id": f"{run_id}-a0", "project": "llm"}
    pl = TableBuilder("placement")
    pl.add("time", [time.time() - 120] * 16).add("rank", list(range(16)))
    pl.add("world_size", [16] * 16).add("node_id", [_node(r) for r in range(16)])
    pl.add("gpu", [r % 8 for r in range(16)])
    assert server.post(encode_batch({"placement": pl.build()}, ctx)[1])[0] == 200
    _, steps = step_batch(run_id, range(0, 20), 16, job_id=f"{run_id}-a0", ctx={"project": "llm"})
    assert server.post(steps)[0] == 200


def _as_pytorch_writes(scenario: str, into: Path) -> Path:
    """The scenario's dumps as PyTorch writes them: ``pickle.dumps`` of each rank's dict, to
    ``$TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>`` (``nccl_trace_rank_<rank>``)."""
    into.mkdir()
    for f in (NVRX / scenario).glob("_dump_*.json"):
        rank = int(f.stem.rsplit("_", 1)[1])
        dump = json.loads(f.read_text())
        (into / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))
    return into


def _fr_findings(server: Server, run_id: str) -> list[dict[str, Any]]:
    found = server.get(f"/v1/runs/{run_id}/diagnosis")["findings"]
    return [f for f in found if f["key"].startswith("fr:")]


@pytest.mark.parametrize("form", ["pickle", "json"])
@pytest.mark.parametrize(("scenario", "missing"), SCENARIOS)
def test_fr_import_names_the_missing_ranks_with_their_nodes_and_gpus(
    server: Server, tmp_path: Path, scenario: str, missing: set[int], form: str
) -> None:
    run_id = f"fr-{scenario}-{form}".replace("_", "-")
    _run(server, run_id)
    # JSON: the scenario's folder as it is (its README-like reference_output.txt is skipped).
    src = _as_pytorch_writes(scenario, tmp_path / "dumps") if form == "pickle" else NVRX / scenario
    out = fleetlens_cmd("fr", "import", str(src), "--run", run_id, "--server", server.url, "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert set(answer["missingRanks"]) == missing
    assert answer["jobId"] == f"{run_id}-a0" and answer["ranksWithDump"] == list(range(16))
    assert {(m["rank"], m["node"], m["gpu"]) for m in answer["missing"]} == {
        (r, _node(r), r % 8) for r in missing
    }
    groups = {g["group"]: g for g in answer["groups"]}
    assert all(g["lastCompleted"] and g["max"] >= g["min"] for g in groups.values())

    # Read back through the API: a hang finding per stuck collective, the ranks on their GPUs.
    found = _fr_findings(server, run_id)
    assert found and {f["diagnosis"] for f in found} == {"hang"}
    assert set().union(*(f["ranks"] for f in found)) == missing
    assert set().union(*(f["nodes"] for f in found)) == {_node(r) for r in missing}
    assert set().union(*(f["gpus"] for f in found)) == {f"{_node(r)}/{r % 8}" for r in missing}
    # The upstream analyzer's verdict (reference_output.txt) is one of them.
    ref = (NVRX / scenario / "reference_output.txt").read_text().splitlines()[1].split("|")
    desc, op = ref[1].strip().split(",")[0], ref[2].strip()
    stuck = [f["evidence"][0] for f in found]
    hit = [e for e in stuck if e["desc"] == desc and e["op"] == op]
    assert hit, stuck
    assert {int(x) for x in ref[-1].split(",")} <= missing
    done = next(e for e in found[0]["evidence"] if e["metric"].endswith("per group"))["value"]
    assert done[hit[0]["group"]]["max"] == groups[hit[0]["group"]]["max"]

    # The failure page names the cause, with the ranks in its summary.
    failure = server.get(f"/v1/runs/{run_id}/failure")
    assert failure["cause"]["diagnosis"] == "hang"
    assert "Flight Recorder" in failure["cause"]["summary"]
    assert any(f["key"].startswith("fr:") for f in failure["findings"])

    # A second import of the same dumps stores nothing twice.
    again = fleetlens_cmd("fr", "import", str(src), "--run", run_id, "--server", server.url)
    assert again.returncode == 0, again.stderr
    assert "missing ranks" in again.stdout and _node(min(missing)) in again.stdout
    assert len(_fr_findings(server, run_id)) == len(found)


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_with_a_global_is_refused_and_nothing_is_stored(
    server: Server, tmp_path: Path
) -> None:
    run_id = "fr-evil"
    _run(server, run_id)
    dumps = _as_pytorch_writes("gpu_error_1st", tmp_path / "dumps")
    marker = tmp_path / "pwned"
    (dumps / "nccl_trace_rank_3").write_bytes(pickle.dumps({"entries": [_Evil(marker)]}))
    out = fleetlens_cmd("fr", "import", str(dumps), "--run", run_id, "--server", server.url)
    assert out.returncode == 2
    assert "HTTP 400" in out.stderr and "nccl_trace_rank_3" in out.stderr, out.stderr
    assert "posix.system" in out.stderr or "os.system" in out.stderr, out.stderr
    assert not marker.exists()
    assert _fr_findings(server, run_id) == []


def _post(server: Server, run_id: str, files: list[dict[str, Any]]) -> tuple[int, Any]:
    return server.request("POST", f"/v1/runs/{run_id}/flight-recorder", {"files": files})


def test_bad_uploads_are_refused_naming_the_file(server: Server, tmp_path: Path) -> None:
    run_id = "fr-bad"
    _run(server, run_id)
    good = (NVRX / "gpu_error_1st" / "_dump_0.json").read_bytes()

    def f(name: str, data: bytes) -> dict[str, Any]:
        return {"name": name, "data": base64.b64encode(data).decode()}

    cases = [
        ([f("trace.json", good)], "trace.json: no rank in the file name"),
        ([f("r_1", good), f("dump_1.json", good)], "dump_1.json: rank 1 was already given by r_1"),
        ([f("r_2", b"not a dump")], "r_2: neither a pickle nor JSON"),
        ([f("r_3", json.dumps([1]).encode())], "r_3: a dump is a dict"),
        ([f("r_4", pickle.dumps({"entries": [{"collective_seq_id": "x"}]}))], "r_4: entries[0]"),
        ([{"name": "r_5", "data": "!!"}], "r_5: `data` is not base64"),
        ([f("r_0", good), f("r_6", pickle.dumps({"a": 1})[:-2])], "r_6: not a Flight Recorder"),
    ]
    for files, message in cases:
        status, body = _post(server, run_id, files)
        assert status == 400 and message in body["detail"], (message, status, body)
    status, body = _post(server, run_id, [f(f"r_{i}", b"{}") for i in range(8193)])
    assert status == 413 and "8193 files" in body["detail"], body
    assert _fr_findings(server, run_id) == []
    # Dumps of a job the server has never seen make its run (they were a 404): its world size
    # is the dumps' (their process groups name 16 ranks), its time theirs.
    every = [f(p.name, p.read_bytes()) for p in sorted((NVRX / "gpu_error_1st").glob("_dump_*"))]
    status, body = _post(server, "fr-unseen", every)
    assert status == 200 and body["missingRanks"] == [12], body
    run = server.get("/v1/runs/fr-unseen")
    assert run["worldSize"] == 16 and run["lastSeen"] < time.time() - 3600
    # A run made from dumps is a recording: neither live nor stalled (it led on-call's live
    # jobs, in red, as STALLED).
    assert run["status"] == "RECORDED", run
    assert {x["diagnosis"] for x in _fr_findings(server, "fr-unseen")} == {"hang"}
    # ...and dumps of a 16-rank job sent to a run of 10 ranks are refused, naming both.
    ctx = {"run_id": "fr-ten", "job_id": "fr-ten-a0", "project": "llm"}
    _, steps = step_batch("fr-ten", range(0, 5), 10, job_id="fr-ten-a0", ctx=ctx)
    assert server.post(steps)[0] == 200
    status, body = _post(server, "fr-ten", every)
    assert status == 409 and "16 ranks" in body["detail"] and "fr-ten has 10" in body["detail"]
    assert _fr_findings(server, "fr-ten") == []


def test_cli_refuses_a_path_that_has_no_dumps(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("not a dump")
    out = fleetlens_cmd(
        "fr", "import", str(tmp_path), "--run", "r", "--server", "http://127.0.0.1:9"
    )
    assert out.returncode == 2 and "no dump files" in out.stderr
    shutil.rmtree(tmp_path)
    out = fleetlens_cmd(
        "fr", "import", str(tmp_path), "--run", "r", "--server", "http://127.0.0.1:9"
    )
    assert out.returncode == 2 and "no such file or directory" in out.stderr


_HUNG_JOB = """
import os, time
import torch, torch.distributed as dist
import fleetlens, fleetlens.torch as fltorch

dist.init_process_group("gloo")
rank = dist.get_rank()
run = fleetlens.init(project="p", install_signal_handler=False)
tr = fltorch.TorchRun(run)
x = torch.ones(1024)
for step in range(1000):
    if rank == 2 and step == 8:
        while True:  # a hung GPU: this rank never reaches the next all-reduce
            time.sleep(1.0)
    with tr.step(step, tokens=1024):
        with tr.phase("comm"):
            dist.all_reduce(x)
    time.sleep(0.05)
"""


def test_a_hung_job_dumps_and_uploads_its_own_flight_recorder(
    server: Server, tmp_path: Path
) -> None:
    """4 gloo ranks under torchrun with PyTorch's flight recorder on; rank 2 stops before its
    9th all-reduce. With no step for the hang rule's floor (3 s here), every rank dumps its
    recorder, rank 0 uploads the four dumps, and the run's findings name rank 2."""
    import signal
    import subprocess
    import sys

    pytest.importorskip("torch")
    script = tmp_path / "hung.py"
    script.write_text(_HUNG_JOB)
    fr_dir = tmp_path / "fr"
    env = {**os.environ, "FLEETLENS_SERVER": server.url, "FLEETLENS_RUN_ID": "hung-job",
           "TMPDIR": str(tmp_path), "TORCH_FR_BUFFER_SIZE": "2000",
           "FLEETLENS_FR_DIR": str(fr_dir), "FLEETLENS_HANG_FLOOR_S": "3",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    log = tmp_path / "job.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
             "4", str(script)],
            env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        found: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not found and proc.poll() is None:
            found = _fr_findings(server, "hung-job") if _known(server, "hung-job") else []
            time.sleep(1.0)
        assert found, "no flight-recorder finding"
    finally:
        proc.send_signal(signal.SIGTERM)  # torchrun stops its workers, the hung one too
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        out = log.read_text(errors="replace")
    assert {f["diagnosis"] for f in found} == {"hang"}, found
    assert set().union(*(f["ranks"] for f in found)) == {2}, (found, out[-2000:])
    dumps = sorted(p.name for p in fr_dir.rglob("fleetlens_fr_rank_*"))
    assert dumps == [f"fleetlens_fr_rank_{r}" for r in range(4)], dumps
    assert "flight recorder dumped to" in out


def _known(server: Server, run_id: str) -> bool:
    return server.request("GET", f"/v1/runs/{run_id}/diagnosis")[0] == 200


def test_the_jobs_hang_limit_is_the_servers_hang_rule() -> None:
    """The training process cannot import the server's rule; its copy must say the same."""
    from fleetlens.analysis.hangs import HangRule
    from fleetlens.sdk import NullRun
    from fleetlens.torch.flight_recorder import HangDump

    for k, floor, steps in [(10.0, 60.0, [0.5, 0.7, 9.0]), (10.0, 3.0, [1.0]), (4.0, 5.0, [])]:
        h = HangDump(NullRun(), 0, 2, "/nonexistent", k=k, floor_s=floor)
        for s in steps:
            h.step_ended(s)
        recent = sorted(steps)[len(steps) // 2] if steps else None
        assert h.limit() == HangRule(k, floor).threshold(recent)
