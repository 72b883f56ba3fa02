"""The Grafana dashboards' PromQL against a real Prometheus scraping a real fleetlens server.

No Grafana server is installable here, so each panel's queries are run as Grafana would run
them (its variables substituted) and must return the series the panel is for. What feeds the
server is what feeds it in production: the DDP example instrumented as the README says, under
torchrun (two ranks, one slow), the node agent scraping a dcgm-exporter (its recorded
output of an H100 node, served on loopback) and an Xid 79 event on the job's node, as the agent
reports one from NVML (the one fake: these machines have no GPU), and the simulator's fatal-Xid
scenario (a remediation: a one-node job is never cordoned).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench._promstack import get_json, prometheus
from fleetlens import grafana
from fleetlens.testing import Server, serve_page, wait_until
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.e2e

RUN, NODE = "graf-run", "graf-node"
SCRAPE = (
    Path(__file__).resolve().parent
    / "data" / "real" / "dcgm" / "metrics_scrapes" / "h100x8_aicr_dcgm-exporter_sampled_lines.prom"
)  # fmt: skip


@pytest.fixture
def exporter() -> Iterator[str]:
    """dcgm-exporter's recorded output of an H100 node, served as it serves it."""
    with serve_page(SCRAPE.read_bytes()) as url:
        yield url


def _xid(server: Server, job_id: str, step: int) -> None:
    ev = TableBuilder("event")
    ev.add("time", [time.time()]).add("kind", ["hardware_fault"]).add("step", [step])
    ev.add("rank", [1])
    ev.add("node_id", [NODE]).add("gpu", [1]).add("attrs", [json.dumps({"xid": 79})])
    ev.add("message", [f"Xid 79 on {NODE} GPU 1: fallen off the bus"])
    ctx = {"run_id": RUN, "job_id": job_id}
    assert server.post(encode_batch({"event": ev.build()}, ctx)[1])[0] == 200


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    q = expr.replace("$tenant", ".*").replace("$run_id", RUN).replace("$__rate_interval", "30s")
    doc = get_json(f"{prom}/api/v1/query?query={urllib.parse.quote(q)}")
    assert doc["status"] == "success", (expr, doc)
    return list(doc["data"]["result"])


def test_every_panel_of_every_dashboard_returns_its_series(tmp_path: Path, exporter: str) -> None:
    server = Server(str(tmp_path / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"}).start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # The README's DDP example under torchrun, two ranks on GPUs 0 and 1 of the node, rank 1
        # slow by 20 ms a step (a straggler: an open finding); it trains until it is stopped.
        env = {**os.environ, "FLEETLENS_SERVER": server.url, "FLEETLENS_NODE_ID": NODE,
               "FLEETLENS_RUN_ID": RUN, "FLEETLENS_SPOOL_DIR": str(tmp_path / "spool"),
               "CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "1"}  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "2", "-m", "fleetlens.examples.ddp_train",
                 "--steps", "1000000", "--slow-rank", "1", "--slow-ms", "20"],
                env=env, start_new_session=True,
            )
        )  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "fleetlens", "agent", "--server", server.url,
                 "--dcgm-url", exporter, "--node", NODE, "--interval", "1", "--relay", "off"],
                env={**os.environ, "FLEETLENS_SPOOL_DIR": str(tmp_path / "agent-spool")},
                start_new_session=True,
            )
        )  # fmt: skip

        def stepping() -> bool:
            status, run = server.request("GET", f"/v1/runs/{RUN}")
            return status == 200 and (run["step"] or 0) > 20

        wait_until(stepping, 90, 0.5, "the job's steps")
        # The run's model and GPUs, as a user describes them (MFU needs both).
        described = {"config": {"n_params": 120_000, "accelerator": "h100"}}
        assert server.request("POST", f"/v1/runs/{RUN}/describe", described)[0] == 200
        run = server.get(f"/v1/runs/{RUN}")
        _xid(server, run["jobIds"][-1], int(run["step"]))
        # A one-node job is never cordoned (it would leave no node): the simulator's fatal Xid
        # on a 16-node job gives the remediation the on-call dashboard counts.
        sim = subprocess.run(
            [sys.executable, "-m", "fleetlens", "sim", "run", "fatal_xid", "--server", server.url],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert sim.returncode == 0, sim.stderr
        with prometheus(server.url.removeprefix("http://")) as prom:
            every = [
                (uid, title, expr)
                for uid in grafana.DASHBOARDS
                for title, expr in grafana.targets(uid)
            ]

            def empty() -> list[str]:
                return [f"{uid}: {title}: {expr}" for uid, title, expr in every
                        if not _query(prom, expr)]  # fmt: skip

            missing = empty()
            deadline = time.monotonic() + 120
            while missing and time.monotonic() < deadline:
                time.sleep(1)
                missing = empty()
            assert missing == [], "\n".join(missing) + "\n" + server.log()[-3000:]
            # The run's panels show this run, under its tenant; on-call's show its node and
            # its fault; the fleet's count it.
            for title, expr in grafana.targets("fleetlens-run"):
                runs = {r["metric"].get("run_id") for r in _query(prom, expr)}
                assert RUN in runs, (title, runs)
            nodes = _query(prom, 'fleetlens_node_gpu_faults{tenant=~"$tenant"}')
            assert (NODE, "fatal") in {(r["metric"]["node"], r["metric"]["class"]) for r in nodes}
            alerts = _query(prom, "sum by (severity, alertname) (fleetlens_alerts_firing)")
            assert ("page", "FatalHardwareFault") in {
                (r["metric"]["severity"], r["metric"]["alertname"]) for r in alerts
            }
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM) if p.args[
                2
            ] == "torch.distributed.run" else p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        server.stop()


def test_the_cli_writes_dashboards_grafana_can_provision(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fleetlens", "grafana", "--out", str(tmp_path / "g")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for uid in grafana.DASHBOARDS:
        doc = json.loads((tmp_path / "g" / f"{uid}.json").read_text())
        assert doc["uid"] == uid and doc["panels"]
        names = [v["name"] for v in doc["templating"]["list"]]
        assert names[0] == "datasource"
        for p in doc["panels"]:
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert all(t["expr"] and t["refId"] for t in p["targets"])
            used = {v for v in ("$tenant", "$run_id") if any(v in t["expr"] for t in p["targets"])}
            assert used <= {f"${n}" for n in names}, (uid, p["title"])
    provider = (tmp_path / "g" / "fleetlens-dashboards.yaml").read_text()
    assert f"path: {(tmp_path / 'g').resolve()}" in provider and "type: file" in provider
