"""Incidents and preserved failure windows, through the API and the CLI of a real server.

A run fails with a fatal Xid on a node (a page: FatalHardwareFault); the monitoring loop keeps
its raw telemetry from T-10 min to T+10 min. Another run crashes with an exception no alert rule
raises. The incidents list shows both, newest first, with diagnosis, owner, node and alert; the
window is read back table by table, a page at a time; another tenant sees none of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from fleetlens.cli.incidents import parse_since
from fleetlens.errors import ConfigError
from fleetlens.store.access import AccessStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.testing import Server, step_batch, wait_until
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.e2e

FAILED, CRASHED = "acme-xid-run", "acme-crash-run"
NODE = "acme-node-7"


@dataclass
class World:
    server: Server
    tokens: dict[str, str]
    failed_at: float


def _event(run: str, kind: str, t: float, step: int, attrs: dict[str, Any], **cols: Any) -> bytes:
    ctx = {"run_id": run, "job_id": "j1", "project": "llm"}
    ev = TableBuilder("event")
    ev.add("time", [t]).add("kind", [kind]).add("step", [step]).add("attrs", [json.dumps(attrs)])
    for name, value in cols.items():
        ev.add(name, [value])
    tables = {"event": ev.build()}
    if "node_id" in cols:
        pl = TableBuilder("placement")
        pl.add("time", [t - 60]).add("rank", [0]).add("node_id", [cols["node_id"]])
        pl.add("gpu", [0])
        tables["placement"] = pl.build()
    return encode_batch(tables, ctx)[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    data = str(tmp_path_factory.mktemp("incidents") / "data")
    os.makedirs(data)
    meta = MetadataStore(f"sqlite:///{data}/metadata.db")
    access = AccessStore(meta)
    tokens = {
        name: access.create_token(tenant, role, project=project, name=name)[0]
        for name, tenant, role, project in (
            ("acme", "acme", "admin", ""),
            ("bolt", "bolt", "admin", ""),
            ("acme-vision", "acme", "viewer", "vision"),  # another project of acme's
        )
    }
    meta.close()
    server = Server(
        data, extra_args=("--auth", "required"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"}
    ).start()
    try:
        now = time.time()
        tok = tokens["acme"]
        ctx = {"project": "llm"}
        for run in (FAILED, CRASHED):
            _, steps = step_batch(run, range(0, 20), 2, t0=now - 40, ctx=ctx)
            assert server.post(steps, token=tok)[0] == 200
        attrs = {"xid": 79}
        xid = _event(FAILED, "hardware_fault", now - 10, 19, attrs, node_id=NODE, gpu=0, rank=0)
        assert server.post(xid, token=tok)[0] == 200
        # A crash as the SDK reports one: the exception, then the job's failure (a stop, so the
        # silence after it is not a hang).
        for kind in ("exception", "failure"):
            crash = _event(CRASHED, kind, now - 5, 19, {"type": "ValueError"}, rank=1)
            assert server.post(crash, token=tok)[0] == 200
        # Tenant bolt has a run too, so its empty answers are not for want of data.
        _, steps = step_batch("bolt-run", range(0, 5), 1, ctx={"project": "bolt"})
        assert server.post(steps, token=tokens["bolt"])[0] == 200
        yield World(server, tokens, now - 10)
    finally:
        server.stop()


def _cli(*args: str, token: str, server: Server) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlens", *args, "--server", server.url, "--token", token],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _windows(w: World) -> list[dict[str, Any]]:
    doc = w.server.get(f"/v1/runs/{FAILED}/preserved", token=w.tokens["acme"])
    return list(doc["windows"])


def test_the_failure_window_is_kept_and_read_back_through_api_and_cli(world: World) -> None:
    w, tok = world, world.tokens["acme"]
    (win,) = wait_until(
        lambda: (
            [x for x in _windows(w) if x["kept"]["steps"] == 40 and x["kept"]["events"]] or None
        ),
        timeout=90,
        what="the failure window copied",
    )
    assert win["alert"]["alertname"] == "FatalHardwareFault" and win["alert"]["state"] == "firing"
    assert win["failure"]["diagnosis"] == "fatal_xid" and win["failure"]["nodes"] == [NODE]
    assert win["failureAt"] == pytest.approx(w.failed_at, abs=1e-3)
    assert (win["from"], win["to"]) == pytest.approx((w.failed_at - 600, w.failed_at + 600))
    assert win["nodes"] == [NODE] and win["complete"] is False  # T+10 min is still to come
    assert set(win["kept"]) == {"steps", "scalars", "collectives", "events", "gpu_samples",
                                "node_samples"}  # fmt: skip
    assert win["kept"]["events"] == 1

    base = f"/v1/runs/{FAILED}/preserved/{win['id']}"
    events = w.server.get(f"{base}?table=events", token=tok)
    assert events["total"] == 1 and events["rows"][0]["kind"] == "hardware_fault"
    assert json.loads(events["rows"][0]["attrs"]) == {"xid": 79}
    assert "tenant" not in events["rows"][0]
    # Rows a page at a time, in time order, each once.
    first = w.server.get(f"{base}?table=steps&limit=15", token=tok)
    rest = w.server.get(f"{base}?table=steps&limit=100&offset=15", token=tok)
    assert first["total"] == 40 and len(first["rows"]) == 15 and len(rest["rows"]) == 25
    times = [r["time"] for r in first["rows"] + rest["rows"]]
    assert times == sorted(times)
    assert len({(r["step"], r["rank"]) for r in first["rows"] + rest["rows"]}) == 40
    assert w.server.request("GET", f"{base}?table=placement", token=tok)[0] == 422
    assert w.server.request("GET", f"{base}?limit=0", token=tok)[0] == 422
    assert w.server.request("GET", f"{base}?offset=-1", token=tok)[0] == 422
    status, _ = w.server.request("GET", f"/v1/runs/{FAILED}/preserved/987654", token=tok)
    assert status == 404

    out = _cli("failure-window", FAILED, token=tok, server=w.server)
    assert out.returncode == 0, out.stderr
    assert f"window {win['id']}" in out.stdout and "FatalHardwareFault (page, firing)" in out.stdout
    assert "fatal_xid" in out.stdout and "kept: steps 40," in out.stdout
    assert "events 1" in out.stdout
    out = _cli("failure-window", FAILED, "--window", str(win["id"]), "--table", "steps",
               "--limit", "3", token=tok, server=w.server)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "steps rows 1-3 of 40" in out.stdout and "(more: --offset 3)" in out.stdout
    out = _cli("failure-window", FAILED, "--window", str(win["id"]), "--table", "events",
               "--json", token=tok, server=w.server)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows"][0]["node_id"] == NODE


def _incidents(w: World, query: str = "", token: str = "acme") -> list[dict[str, Any]]:
    doc = w.server.get(f"/v1/incidents{query}", token=w.tokens[token])
    return list(doc["incidents"])


def test_incidents_list_failures_and_alerts_newest_first(world: World) -> None:
    w, tok = world, world.tokens["acme"]
    got = wait_until(
        lambda: (lambda xs: xs if len(xs) == 2 and xs[1]["windows"] else None)(_incidents(w)),
        timeout=90,
        what="both incidents",
    )
    crash, xid = got  # the crash came 5 s after the Xid: newest first
    assert (crash["runId"], crash["state"], crash["id"]) == (CRASHED, "unalerted", None)
    assert crash["diagnosis"] == "software_crash" and crash["ranks"] == [1]
    assert crash["alerts"] == [] and crash["severity"] == "none"

    assert (xid["runId"], xid["state"], xid["severity"]) == (FAILED, "open", "page")
    assert xid["diagnosis"] == "fatal_xid" and xid["nodes"] == [NODE] and xid["ranks"] == [0]
    diagnosis = w.server.get(f"/v1/runs/{FAILED}/diagnosis", token=tok)["findings"]
    assert xid["owner"] == next(f["owner"] for f in diagnosis if f["diagnosis"] == "fatal_xid")
    (alert,) = xid["alerts"]
    assert (alert["alertname"], alert["state"], alert["node"]) == (
        "FatalHardwareFault", "firing", NODE)  # fmt: skip
    assert alert["ageS"] >= 0 and xid["firing"] == 1 and xid["project"] == "llm"
    assert [f["diagnosis"] for f in xid["failures"]] == ["fatal_xid"]
    assert xid["windows"][0]["id"] == _windows(w)[0]["id"]
    assert xid["links"]["failurePage"] == f"/runs/{FAILED}/failure"
    assert w.server.request("GET", xid["links"]["failurePage"], token=tok)[0] == 200
    # The incident is the alert store's: its own route answers for the same id.
    assert w.server.get(f"/v1/incidents/{xid['id']}", token=tok)["runId"] == FAILED

    # Filters, and bounded pages.
    assert [x["runId"] for x in _incidents(w, "?state=open")] == [FAILED]
    assert [x["runId"] for x in _incidents(w, "?state=unalerted")] == [CRASHED]
    assert _incidents(w, "?state=closed") == []
    assert _incidents(w, f"?since={time.time() + 3600:.0f}") == []
    assert [x["runId"] for x in _incidents(w, f"?since={w.failed_at + 1:.3f}")] == [CRASHED]
    assert [x["runId"] for x in _incidents(w, f"?runId={FAILED}")] == [FAILED]
    assert [x["runId"] for x in _incidents(w, "?limit=1&offset=1")] == [FAILED]
    assert _incidents(w, f"?offset={2**62}") == []
    for bad in ("?limit=0", "?limit=1001", f"?offset={2**62 + 1}", "?state=firing"):
        assert w.server.request("GET", f"/v1/incidents{bad}", token=tok)[0] == 422, bad

    out = _cli("incidents", token=tok, server=w.server)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["WHEN", "STATE", "AGE"]
    assert CRASHED in lines[1] and "unalerted" in lines[1] and "software_crash" in lines[1]
    assert FAILED in lines[2] and "FatalHardwareFault:firing" in lines[2] and NODE in lines[2]
    out = _cli("incidents", "--state", "open", "--since", "1h", "--json", token=tok,
               server=w.server)  # fmt: skip
    assert [x["runId"] for x in json.loads(out.stdout)["incidents"]] == [FAILED]


def test_another_tenant_sees_none_of_it(world: World) -> None:
    w = world
    wait_until(lambda: _windows(w), timeout=90, what="acme's failure window")
    win = _windows(w)[0]["id"]
    # Bolt sees its own run's trouble (it stopped sending steps: a hang), none of acme's.
    theirs = _incidents(w, token="bolt")
    assert {x["runId"] for x in theirs} <= {"bolt-run"}
    assert not {FAILED, CRASHED, NODE} & set(json.dumps(theirs).split('"'))
    tok = w.tokens["bolt"]
    for path in (f"/v1/runs/{FAILED}/preserved", f"/v1/runs/{FAILED}/preserved/{win}",
                 f"/v1/runs/{FAILED}/preserved/{win}?table=events"):  # fmt: skip
        status, body = w.server.request("GET", path, token=tok)
        assert status == 404 and NODE not in json.dumps(body), (path, body)
    out = _cli("incidents", token=tok, server=w.server)
    assert out.returncode == 0 and FAILED not in out.stdout and CRASHED not in out.stdout
    out = _cli("failure-window", FAILED, token=tok, server=w.server)
    assert out.returncode == 2 and "404" in out.stderr and NODE not in out.stdout + out.stderr


def test_a_project_scoped_token_sees_its_projects_runs_only(world: World) -> None:
    w = world
    wait_until(lambda: _incidents(w), timeout=90, what="acme's incidents")
    assert _incidents(w, token="acme-vision") == []
    path = f"/v1/runs/{FAILED}/preserved"
    assert w.server.request("GET", path, token=w.tokens["acme-vision"])[0] == 404


def test_since_takes_a_unix_time_or_an_age() -> None:
    assert parse_since("1718000000") == 1718000000.0
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("30m", now=10_000.0) == 10_000.0 - 1800
    assert parse_since(None) is None
    with pytest.raises(ConfigError, match="30m, 2h or 7d"):
        parse_since("yesterday")
