"""Alerting against the real peers: Alertmanager receives and resolves; Prometheus scrapes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench._promstack import alertmanager, get_json, prometheus
from fleetlens.alerts.policy import DEFAULT_POLICY
from fleetlens.testing import Server, step_batch, wait_passes
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.e2e


def _wait(fn: Any, timeout: float = 60.0, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"condition not met in {timeout}s")


def _run_with_placement(server: Server, run_id: str, t0: float) -> None:
    ctx = {"run_id": run_id, "job_id": f"{run_id}-a0", "project": "llm"}
    pl = TableBuilder("placement")
    pl.add("time", [t0] * 4).add("rank", [0, 1, 2, 3]).add("world_size", [4] * 4)
    pl.add("node_id", ["n1", "n1", "n2", "n2"]).add("gpu", [0, 1, 0, 1])
    assert server.post(encode_batch({"placement": pl.build()}, ctx)[1])[0] == 200
    _, steps = step_batch(run_id, range(0, 60), 4, job_id=f"{run_id}-a0", t0=t0, base=0.5)
    assert server.post(steps)[0] == 200


def _event(server: Server, run_id: str, kind: str, t: float, node: str, **attrs: Any) -> None:
    import json

    ev = TableBuilder("event")
    ev.add("time", [t]).add("kind", [kind]).add("step", [59]).add("rank", [3])
    ev.add("node_id", [node]).add("gpu", [1]).add("attrs", [json.dumps(attrs)])
    ev.add("message", [f"{kind} on {node}"])
    ctx = {"run_id": run_id, "job_id": f"{run_id}-a0", "project": "llm"}
    assert server.post(encode_batch({"event": ev.build()}, ctx)[1])[0] == 200


def test_fatal_xid_reaches_alertmanager_as_one_alert_and_resolves_when_cleared(
    tmp_path: Path,
) -> None:
    with alertmanager() as am:
        server = Server(
            str(tmp_path / "data"),
            env={
                "FLEETLENS_ALERTMANAGER_URL": am,
                "FLEETLENS_ANALYSIS_INTERVAL_S": "0.5",
                "FLEETLENS_PUBLIC_URL": "http://fleetlens.test",
            },
        ).start()
        try:
            now = time.time()
            _run_with_placement(server, "xid-run", now - 40)
            _event(server, "xid-run", "hardware_fault", now - 5, "n2", xid=79)

            def firing() -> list[dict[str, Any]]:
                return [
                    a
                    for a in get_json(am + "/api/v2/alerts")
                    if a["labels"].get("run_id") == "xid-run"
                ]

            alerts = _wait(firing)
            assert len(alerts) == 1
            labels = alerts[0]["labels"]
            assert (labels["alertname"], labels["severity"], labels["node"], labels["gpu"]) == (
                "FatalHardwareFault",
                "page",
                "n2",
                "1",
            )
            assert labels["audience"] == "infra_oncall" and labels["project"] == "llm"
            assert alerts[0]["generatorURL"].startswith("http://fleetlens.test/v1/alerts/")
            # Our own view agrees, and the incident collects the finding.
            (mine,) = server.get("/v1/alerts?state=firing")["alerts"]
            incident = server.get(f"/v1/incidents/{mine['incidentId']}")
            assert incident["status"] == "open" and incident["findings"] == [mine["finding"]]
            wait_passes(server, 4)
            assert len(firing()) == 1  # still one: passes do not re-send it as new alerts

            _event(server, "xid-run", "drain", time.time(), "n2", planned=False)
            _wait(lambda: not firing())
            (done,) = server.get("/v1/alerts")["alerts"]
            assert done["state"] == "resolved" and done["endsAt"] is not None
        finally:
            server.stop()


def test_prometheus_scrapes_job_series_and_loads_the_generated_rules(
    server: Server, tmp_path: Path
) -> None:
    _run_with_placement(server, "prom-run", time.time() - 40)
    rules = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetlens",
            "alerts",
            "prometheus-rules",
            "--out",
            str(tmp_path / "rules.yml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rules.returncode == 0, rules.stderr
    check = subprocess.run(
        ["promtool", "check", "rules", str(tmp_path / "rules.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # evaluation regressions are a model version's, with no Prometheus series to alert on
    n_rules = len(
        [r for r in DEFAULT_POLICY.rules if r.severity != "never" and r.signal != "evaluation"]
    )
    assert check.returncode == 0 and f"SUCCESS: {n_rules} rules found" in check.stdout, check.stdout
    target = server.url.removeprefix("http://")
    with prometheus(target, (tmp_path / "rules.yml").read_text()) as prom:

        def series() -> list[Any]:
            q = get_json(prom + "/api/v1/query?query=fleetlens_run_last_step_age_seconds")
            return [r for r in q["data"]["result"] if r["metric"].get("run_id") == "prom-run"]

        (s,) = _wait(series)
        assert float(s["value"][1]) > 0
        step = get_json(prom + '/api/v1/query?query=fleetlens_run_step_time_seconds{stat="max"}')
        assert any(r["metric"]["run_id"] == "prom-run" for r in step["data"]["result"])

        # A rule's health is "unknown" until its group's first evaluation (up to an interval
        # after Prometheus starts); then every one of them is "ok".
        def evaluated() -> list[Any]:
            groups = get_json(prom + "/api/v1/rules")["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return groups if rules and all(r["health"] != "unknown" for r in rules) else []

        groups = _wait(evaluated)
        assert [len(g["rules"]) for g in groups] == [n_rules]
        assert all(r["health"] == "ok" for r in groups[0]["rules"])
        # Only job-level label sets: no step or rank labels anywhere.
        meta = get_json(prom + "/api/v1/labels")["data"]
        assert "step" not in meta and "rank" not in meta
