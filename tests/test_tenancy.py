"""Tenants, tokens, roles and audit: isolation is a property of the code, not of each endpoint."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from fleetlens.store.access import AccessStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.testing import Server, step_batch, wait_until
from fleetlens.wire import (
    BATCHES_CONTENT_TYPE,
    BatchFrame,
    TableBuilder,
    encode_batch,
    encode_frames,
)

pytestmark = pytest.mark.e2e


@dataclass
class Tenants:
    server: Server
    tokens: dict[str, str]  # name -> plaintext
    ids: dict[str, int]


def _make_tokens(data_dir: str, specs: dict[str, tuple[str, str, str]]) -> tuple[dict, dict]:
    meta = MetadataStore(f"sqlite:///{data_dir}/metadata.db")
    access = AccessStore(meta)
    tokens, ids = {}, {}
    for name, (tenant, role, project) in specs.items():
        tokens[name], info = access.create_token(tenant, role, project=project, name=name)
        ids[name] = info.id
    meta.close()
    return tokens, ids


@pytest.fixture
def tenants(tmp_path) -> Iterator[Tenants]:  # type: ignore[no-untyped-def]
    data = str(tmp_path / "data")
    os.makedirs(data)
    tokens, ids = _make_tokens(
        data,
        {
            "a-admin": ("acme", "admin", ""),
            "a-ingest": ("acme", "ingest", ""),
            "a-viewer": ("acme", "viewer", ""),
            "a-vision": ("acme", "editor", "vision"),
            "b-admin": ("bolt", "admin", ""),
            "b-ingest": ("bolt", "ingest", ""),
            "ops-oncall": ("ops", "oncall", ""),
        },
    )
    server = Server(
        data, extra_args=("--auth", "required"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"}
    ).start()
    try:
        yield Tenants(server, tokens, ids)
    finally:
        server.stop()


def _b_data(t: Tenants) -> None:
    """Tenant bolt's secrets: a run, its config, events and placement."""
    ctx = {"run_id": "bolt-secret-run", "job_id": "bolt-job", "project": "bolt-proj"}
    ev = TableBuilder("event")
    ev.add("time", [1.7e9]).add("kind", ["job_start"])
    ev.add("attrs", [json.dumps({"config": {"dataset": "bolt-private-dataset"}})])
    pl = TableBuilder("placement")
    pl.add("time", [1.7e9]).add("rank", [0]).add("node_id", ["bolt-node-7"])
    _, body = encode_batch({"event": ev.build(), "placement": pl.build()}, ctx)
    assert t.server.post(body, token=t.tokens["b-ingest"])[0] == 200
    _, steps = step_batch("bolt-secret-run", range(0, 5), 2, ctx=ctx)
    assert t.server.post(steps, token=t.tokens["b-ingest"])[0] == 200
    paths = t.server.get("/openapi.json", token=t.tokens["b-admin"])["paths"]
    if "/v1/runs/{run_id}/traces/files/{rank}" in paths:  # a kept trace file naming a secret
        kept = httpx.put(
            f"{t.server.url}/v1/runs/bolt-secret-run/traces/files/0",
            content=gzip.compress(b'{"traceEvents": [], "note": "bolt-private-dataset"}'),
            headers={"Authorization": f"Bearer {t.tokens['b-ingest']}"},
        )
        assert kept.status_code == 201, kept.text
    if "/v1/models" in paths:  # the run graph: a dataset, a checkpoint, a model version
        tok = t.tokens["b-admin"]
        for path, body in (
            ("/v1/datasets", {"name": "bolt-private-dataset", "version": "1"}),
            ("/v1/runs/bolt-secret-run/describe", {"dataset": "bolt-private-dataset:1"}),
            ("/v1/runs/bolt-secret-run/checkpoints", {"step": 1, "uri": "s3://bolt-proj/c"}),
            (
                "/v1/models",
                {"modelId": "bolt-model", "version": "1", "runId": "bolt-secret-run", "step": 1},
            ),
        ):
            assert t.server.request("POST", path, body, token=tok)[0] in (200, 201), path
    if "/v1/scheduler/import" in paths:  # bolt's allocation and its partition's capacity
        sacct = (
            "JobID|JobName|Partition|AllocTRES|Submit|Start|End|State\n"
            "bolt-job|x|bolt-proj|gres/gpu=8|2024-05-01T00:00:00|2024-05-01T01:00:00|Unknown|RUNNING\n"
        )
        sinfo = "NODELIST|PARTITION|STATE|GRES\nbolt-node-7|bolt-proj|mixed|gpu:8\n"
        for body in (
            {"format": "sacct", "data": sacct, "runId": "bolt-secret-run"},
            {"format": "sinfo", "data": sinfo},
        ):
            status, answer = t.server.request(
                "POST", "/v1/scheduler/import", body, token=t.tokens["b-ingest"]
            )
            assert status == 200 and answer["stored"], answer


def _b_evaluation(t: Tenants) -> dict[str, str]:
    """Bolt's evaluations (one done and gated, one still queued), a decision and an alias."""
    paths = t.server.get("/openapi.json", token=t.tokens["b-admin"])["paths"]
    ids = {"evaluation_id": "ev-none", "shard_id": "999999", "decision_id": "gd-none",
           "alias": "candidate", "ref": "bolt-suite"}  # fmt: skip
    if "/v1/evaluations" not in paths:
        return ids
    tok = t.tokens["b-admin"]
    examples = [{"id": "0", "prompt": "bolt-private-dataset", "answer": "bolt-secret-run"}]
    body = {
        "modelId": "bolt-model", "modelVersion": "1",
        "adapter": {"kind": "callable", "target": "bolt_proj:model"},
        "suite": {"name": "bolt-proj", "benchmarks": [
            {"name": "secret", "source": "inline", "examples": examples}]},
    }  # fmt: skip
    status, ev = t.server.request("POST", "/v1/evaluations", body, token=tok)
    assert status == 202, ev
    status, shard = t.server.request("POST", "/v1/eval-shards/lease", {"workerId": "b"}, token=tok)
    assert status == 200, shard
    done = {"leaseToken": shard["leaseToken"], "scores": {"0": {"exact_match": 1.0}}}
    path = f"/v1/eval-shards/{shard['shardId']}/complete"
    assert t.server.request("POST", path, done, token=tok)[0] == 200
    gate = {"modelId": "bolt-model", "version": "1", "policies": [{"metric": "secret/exact_match"}]}
    status, decision = t.server.request("POST", "/v1/gates", gate, token=tok)
    assert status == 201, decision
    alias = {"version": "1"}
    assert (
        t.server.request("POST", "/v1/models/bolt-model/aliases/candidate", alias, token=tok)[0]
        == 200
    )
    if "/v1/evaluation-suites" in paths:  # a named suite and the policy that uses it
        suite = {**body["suite"], "name": "bolt-suite", "version": "1"}
        status, out = t.server.request("POST", "/v1/evaluation-suites", suite, token=tok)
        assert status == 201, out
        trigger = {"on": "model", "project": "bolt-proj", "suite": "bolt-suite",
                   "adapter": body["adapter"]}  # fmt: skip
        status, out = t.server.request("POST", "/v1/evaluation-triggers", trigger, token=tok)
        assert status == 201, out
    queued = {**body, "codeCommit": "bolt-secret-run"}  # left queued: acme must not lease it
    assert t.server.request("POST", "/v1/evaluations", queued, token=tok)[0] == 202
    ids.update(evaluation_id=ev["evaluationId"], shard_id=str(shard["shardId"]),
               decision_id=decision["decisionId"])  # fmt: skip
    return ids


def _b_alert(t: Tenants) -> dict[str, Any]:
    """A fatal Xid on bolt's node: its alert and incident are bolt's objects too."""
    ctx = {"run_id": "bolt-secret-run", "job_id": "bolt-job", "project": "bolt-proj"}
    ev = TableBuilder("event")
    ev.add("time", [time.time()]).add("kind", ["hardware_fault"]).add("step", [4])
    ev.add("node_id", ["bolt-node-7"]).add("gpu", [0]).add("attrs", ['{"xid": 79}'])
    assert (
        t.server.post(encode_batch({"event": ev.build()}, ctx)[1], token=t.tokens["b-ingest"])[0]
        == 200
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        alerts = t.server.get("/v1/alerts", token=t.tokens["b-admin"])["alerts"]
        if alerts:
            return dict(alerts[0])
        time.sleep(0.25)
    raise AssertionError("bolt's fatal Xid raised no alert")


def _b_silence(t: Tenants) -> str:
    """Bolt's silence of its node's alerts (its matchers name bolt's node)."""
    body = {"matchers": {"node": "bolt-node-7"}, "comment": "bolt-node-7 in repair",
            "durationSeconds": 3600}  # fmt: skip
    status, sil = t.server.request("POST", "/v1/silences", body, token=t.tokens["b-admin"])
    assert status == 201, sil
    return str(sil["id"])


def _b_capture(t: Tenants) -> str:
    """A trace capture bolt asked of its run (its reason names bolt's actor, not acme's)."""
    body = {"ranks": [0], "steps": 2}
    path = "/v1/runs/bolt-secret-run/traces/captures"
    status, cap = t.server.request("POST", path, body, token=t.tokens["b-admin"])
    assert status == 201, cap
    return str(cap["captureId"])


def _b_window(t: Tenants) -> str:
    """The failure window kept for bolt's fatal Xid (scheduled with its page)."""
    path = "/v1/runs/bolt-secret-run/preserved"
    windows = t.server.get(path, token=t.tokens["b-admin"])["windows"]
    assert windows and windows[0]["alert"]["alertname"] == "FatalHardwareFault", windows
    return str(windows[0]["id"])


def _b_remediation(t: Tenants) -> str:
    """The action the controller recommends for bolt's fatal Xid (it recommends by default)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = t.server.get("/v1/remediations", token=t.tokens["b-admin"])["remediations"]
        if rows:
            assert rows[0]["state"] == "recommended" and rows[0]["node"] == "bolt-node-7"
            return str(rows[0]["id"])
        time.sleep(0.25)
    raise AssertionError("bolt's fatal Xid got no remediation recommended")


B_SECRETS = ("bolt-secret-run", "bolt-private-dataset", "bolt-node-7", "bolt-proj", "bolt-job")

# A request body for every route that takes one. A new route with a body fails the walk below
# until it is added here, so isolation is tested the day an endpoint is added.
BODIES = {
    ("post", "/v1/tokens"): {"role": "viewer", "name": "walker"},
    ("post", "/v1/runs/{run_id}/describe"): {"config": {"lr": 1.0}, "code": "c0ffee"},
    ("post", "/v1/runs/{run_id}/checkpoints"): {"step": 1, "uri": "s3://b/c"},
    ("post", "/v1/runs/{run_id}/artifacts"): {"name": "t", "uri": "s3://b/t", "sha256": "00"},
    ("post", "/v1/models"): {
        "modelId": "bolt-model",
        "version": "1",
        "runId": "acme-no-run",
        "step": 1,
    },
    ("post", "/v1/datasets"): {"name": "web", "version": "v1"},
    ("post", "/v1/alerts/{alert_id}/ack"): {},
    ("post", "/v1/alerts/{alert_id}/resolve"): {},
    ("post", "/v1/evaluations"): {
        "modelId": "bolt-model",
        "modelVersion": "1",
        "adapter": {"kind": "callable", "target": "m:f"},
        "suite": {"benchmarks": [{"name": "q", "examples": [{"prompt": "p"}]}]},
    },
    ("post", "/v1/evaluation-suites"): {
        "name": "walker",
        "version": "1",
        "benchmarks": [{"name": "q", "examples": [{"prompt": "p"}]}],
    },
    ("post", "/v1/evaluation-triggers"): {
        "on": "model",
        "suite": "bolt-suite",
        "adapter": {"kind": "callable", "target": "m:f"},
    },
    ("post", "/v1/eval-shards/lease"): {"workerId": "walker"},
    ("post", "/v1/eval-shards/{shard_id}/heartbeat"): {"leaseToken": "x"},
    ("post", "/v1/eval-shards/{shard_id}/complete"): {"leaseToken": "x", "scores": {}},
    ("post", "/v1/eval-shards/{shard_id}/fail"): {"leaseToken": "x", "error": "e"},
    ("post", "/v1/gates"): {
        "modelId": "bolt-model",
        "version": "1",
        "policies": [{"metric": "secret/exact_match"}],
    },
    ("post", "/v1/models/{model_id}/aliases/{alias}"): {"version": "1"},
    ("post", "/v1/runs/{run_id}/control"): {"id": 0, "event": "resumed", "rank": 0, "time": 1.0},
    # A Flight Recorder dump: base64 of the JSON {"entries": []}.
    ("post", "/v1/runs/{run_id}/flight-recorder"): {
        "files": [{"name": "nccl_trace_rank_0", "data": "eyJlbnRyaWVzIjogW119"}]
    },
    ("post", "/v1/runs/{run_id}/whatif"): {"ratios": {"program": 1.1}},
    # A trace file's bytes (the run is looked up first: tenant B's is not acme's).
    ("put", "/v1/runs/{run_id}/traces/files/{rank}"): "not a trace",
    ("post", "/v1/runs/{run_id}/traces/captures"): {"ranks": [0, 1], "steps": 3},
    ("put", "/v1/runs/{run_id}/traces/captures/{capture_id}/{rank}"): "not a trace",
    # Scheduler records: a sacct header and no jobs (stored under the caller's tenant).
    ("post", "/v1/scheduler/import"): {
        "format": "sacct",
        "data": "JobID|JobName|Partition|AllocTRES|Submit|Start|End|State\n",
    },
    ("post", "/v1/silences"): {
        "matchers": {"alertname": "JobHang"},
        "comment": "acme's own",
        "durationSeconds": 60,
    },
    ("post", "/v1/remediations/{remediation_id}/approve"): {},
    ("post", "/v1/remediations/{remediation_id}/reject"): {},
}


def test_every_route_with_a_token_of_tenant_a_shows_nothing_of_tenant_b(tenants: Tenants) -> None:
    t = tenants
    _b_data(t)
    b_alert = _b_alert(t)
    b_eval = _b_evaluation(t)
    spec = t.server.get("/openapi.json", token=t.tokens["a-admin"])
    # Path parameters get tenant bolt's objects.
    values = {
        "run_id": "bolt-secret-run",
        "token_id": str(t.ids["b-admin"]),
        "model_id": "bolt-model",
        "version": "1",
        "name": "bolt-private-dataset",
        "alert_id": str(b_alert["id"]),
        "incident_id": str(b_alert["incidentId"]),
        "window_id": _b_window(t),
        "remediation_id": _b_remediation(t),
        "silence_id": _b_silence(t),
        "capture_id": _b_capture(t),
        "rank": "0",
        "project": "bolt-proj",
        **b_eval,
    }
    walked = 0
    for path, ops in spec["paths"].items():
        for method in ops:
            params = re.findall(r"{(\w+)}", path)
            missing = [p for p in params if p not in values]
            assert not missing, f"{method.upper()} {path}: add a value of tenant B for {missing}"
            url = path
            for p in params:
                url = url.replace("{" + p + "}", values[p])
            if (method, path) == ("post", "/v1/ingest"):
                # Claiming bolt's tenant in the batch writes into acme, never into bolt.
                _, body = step_batch("acme-own-run", range(100, 103), 1, ctx={"tenant": "bolt"})
                status, answer, _ = t.server.post(body, token=t.tokens["a-admin"])
            elif (method, path) == ("post", "/v1/ingest/batches"):
                # The same through a relay's many-batch request.
                _, body = step_batch("acme-relayed", range(0, 2), 1, ctx={"tenant": "bolt"})
                status, answer, _ = t.server.post(
                    encode_frames([BatchFrame(body=body)]),
                    BATCHES_CONTENT_TYPE,
                    token=t.tokens["a-admin"],
                    path=path,
                )
                assert [r["status"] for r in answer["results"]] == [200], answer
            else:
                assert method == "get" or (method, path) in BODIES or method == "delete", (
                    f"{method.upper()} {path}: add an example body to BODIES"
                )
                status, answer = t.server.request(
                    method.upper(), url, BODIES.get((method, path)), token=t.tokens["a-admin"]
                )
            walked += 1
            assert status < 500, (method, path, status, answer)
            text = json.dumps(answer) if not isinstance(answer, str) else answer
            for p in params:  # an error may echo what the caller asked for; that leaks nothing
                text = text.replace(values[p], "")
            if path in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"):
                continue
            for secret in B_SECRETS:
                assert secret not in text, (method, path, secret, text[:500])
            if params:
                assert status == 404, (method, path, status, answer)
    assert walked >= 8
    # Bolt's data is intact, and its token still works after acme tried to revoke it.
    run = t.server.get("/v1/runs/bolt-secret-run", token=t.tokens["b-admin"])
    assert run["steps"] == 5 and run["config"] == {"dataset": "bolt-private-dataset"}
    ranks = t.server.get("/v1/runs/bolt-secret-run/ranks", token=t.tokens["b-admin"])
    assert ranks["ranks"][0]["node"] == "bolt-node-7"
    if "/v1/scheduler/allocations" in spec["paths"]:  # what acme's walk did not see was there
        mine = t.server.get("/v1/scheduler/allocations", token=t.tokens["b-admin"])
        assert [a["jobId"] for a in mine["allocations"]] == ["bolt-job"]
        path = "/v1/scheduler/allocations?runId=bolt-secret-run"
        assert t.server.request("GET", path, token=t.tokens["a-admin"])[0] == 404
    # Acme's batch that claimed bolt's tenant landed in acme only.
    assert t.server.get("/v1/runs/acme-own-run", token=t.tokens["a-admin"])["step"] == 102
    assert t.server.request("GET", "/v1/runs/acme-own-run", token=t.tokens["b-admin"])[0] == 404
    assert t.server.get("/v1/runs/acme-relayed", token=t.tokens["a-admin"])["step"] == 1
    assert t.server.request("GET", "/v1/runs/acme-relayed", token=t.tokens["b-admin"])[0] == 404


def test_roles(tenants: Tenants) -> None:
    t = tenants
    _, body = step_batch("acme-run", range(0, 3), 1)
    assert t.server.post(body, token=t.tokens["a-ingest"])[0] == 200
    # An ingest token writes telemetry and reads nothing.
    assert t.server.request("GET", "/v1/runs", token=t.tokens["a-ingest"])[0] == 403
    assert t.server.request("GET", "/v1/runs/acme-run", token=t.tokens["a-ingest"])[0] == 403
    # A viewer reads but cannot administer (nor ingest).
    assert t.server.request("GET", "/v1/runs/acme-run", token=t.tokens["a-viewer"])[0] == 200
    status, err = t.server.request(
        "POST", "/v1/tokens", {"role": "admin"}, token=t.tokens["a-viewer"]
    )
    assert status == 403 and "viewer" in err["detail"]
    assert t.server.post(body, token=t.tokens["a-viewer"])[0] == 403
    # No token, or a made-up one: 401.
    assert t.server.request("GET", "/v1/runs")[0] == 401
    assert t.server.request("GET", "/v1/runs", token="fl_made_up")[0] == 401


def test_infra_oncall_sees_and_approves_node_removals_of_every_tenant(tenants: Tenants) -> None:
    t = tenants
    _b_data(t)
    _b_alert(t)
    rid = _b_remediation(t)
    # Bolt's run is not ops's, but its bad node is on-call's business.
    rows = t.server.get("/v1/remediations", token=t.tokens["ops-oncall"])["remediations"]
    assert [(r["tenant"], r["node"], r["state"]) for r in rows] == [
        ("bolt", "bolt-node-7", "recommended")
    ]
    # Not what comes from the run's contents: its checkpoint, its cost (from its config).
    assert not {"checkpoint", "cost", "summary", "phases"} & set(rows[0]), rows[0]
    # ...and nothing else of bolt's: its runs stay closed to the on-call role.
    assert (
        t.server.request("GET", "/v1/runs/bolt-secret-run", token=t.tokens["ops-oncall"])[0] == 403
    )
    # A viewer may not approve; another tenant's admin does not see it at all.
    assert t.server.request("POST", f"/v1/remediations/{rid}/approve", {},
                            token=t.tokens["a-viewer"])[0] == 403  # fmt: skip
    assert t.server.request("POST", f"/v1/remediations/{rid}/approve", {},
                            token=t.tokens["a-admin"])[0] == 404  # fmt: skip
    status, out = t.server.request(
        "POST", f"/v1/remediations/{rid}/approve", {}, token=t.tokens["ops-oncall"]
    )
    # No job of bolt's polls its control channel: the node is drained, the job left alone.
    assert status == 200 and out["state"] == "drained" and out["approvedBy"] == "ops-oncall", out
    audit = t.server.get("/v1/audit", token=t.tokens["b-admin"])["entries"]
    assert any(e["action"] == "remediation.approve" and e["target"] == f"remediation:{rid}"
               for e in audit), audit  # fmt: skip


def test_revoked_token_stops_working_at_once_and_is_audited(tenants: Tenants) -> None:
    t = tenants
    status, created = t.server.request(
        "POST", "/v1/tokens", {"role": "viewer", "name": "ci-bot"}, token=t.tokens["a-admin"]
    )
    assert status == 201 and created["token"].startswith("fl_")
    assert t.server.request("GET", "/v1/runs", token=created["token"])[0] == 200
    listed = t.server.get("/v1/tokens", token=t.tokens["a-admin"])["tokens"]
    assert all("token" not in x and "hash" not in json.dumps(x) for x in listed)
    assert (
        t.server.request("DELETE", f"/v1/tokens/{created['id']}", token=t.tokens["a-admin"])[0]
        == 200
    )
    assert t.server.request("GET", "/v1/runs", token=created["token"])[0] == 401
    audit = t.server.get("/v1/audit", token=t.tokens["a-admin"])["entries"]
    actions = [(e["action"], e["target"], e["actor"]) for e in audit]
    assert ("token.revoke", f"token:{created['id']}", "a-admin") in actions
    assert ("token.create", f"token:{created['id']}", "a-admin") in actions
    assert all(e["remote"] == "127.0.0.1" for e in audit if e["actor"] == "a-admin")
    # Bolt's admin sees none of acme's audit trail.
    assert not any(
        "a-admin" in json.dumps(e)
        for e in t.server.get("/v1/audit", token=t.tokens["b-admin"])["entries"]
    )


def test_project_scoped_token_writes_and_reads_its_project_only(tenants: Tenants) -> None:
    t = tenants
    _, other = step_batch("nlp-run", range(0, 2), 1, ctx={"project": "nlp"})
    assert t.server.post(other, token=t.tokens["a-admin"])[0] == 200
    _, mine = step_batch("vision-run", range(0, 2), 1, ctx={"project": "nlp"})
    assert t.server.post(mine, token=t.tokens["a-vision"])[0] == 200
    runs = t.server.get("/v1/runs", token=t.tokens["a-vision"])["runs"]
    assert [(r["runId"], r["project"]) for r in runs] == [("vision-run", "vision")]
    assert t.server.request("GET", "/v1/runs/nlp-run", token=t.tokens["a-vision"])[0] == 404


def test_ingest_rate_quota_throttles_one_tenant_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = str(tmp_path / "data")
    os.makedirs(data)
    tokens, _ = _make_tokens(data, {"a": ("acme", "admin", ""), "b": ("bolt", "admin", "")})
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetlens",
            "tenants",
            "quota",
            "acme",
            "--data",
            data,
            "--ingest-bytes-per-s",
            "20000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and json.loads(out.stdout)["ingest_bytes_per_s"] == 20000
    server = Server(data, extra_args=("--auth", "required")).start()
    try:
        _, body = step_batch("q-run", range(0, 40), 16)  # about 30 kB
        codes_a = [server.post(body, token=tokens["a"]) for _ in range(4)]
        assert codes_a[0][0] == 200
        throttled = [c for c in codes_a if c[0] == 429]
        assert throttled and "over its ingest rate" in throttled[0][1]["error"]
        assert int(throttled[0][2]["retry-after"]) >= 1
        assert all(server.post(body, token=tokens["b"])[0] == 200 for _ in range(4))
        audit = server.get("/v1/audit", token=tokens["a"])["entries"]
        assert any(e["action"] == "quota.change" and e["actor"] == "cli" for e in audit)
    finally:
        server.stop()


def test_tokens_are_required_off_loopback_and_the_refusal_says_how(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = str(tmp_path / "data")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetlens",
            "serve",
            "--data",
            data,
            "--host",
            "0.0.0.0",
            "--port",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "fleetlens tokens create" in out.stderr and "--role admin" in out.stderr
    off = subprocess.run(
        [sys.executable, "-m", "fleetlens", "config", "--host", "10.1.2.3", "--data", data],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FLEETLENS_AUTH": "off"},
    )
    assert off.returncode == 2 and "refusing --auth off" in off.stderr
    # Doing what the message says works on a fresh install, before the directory exists.
    fresh = str(tmp_path / "fresh" / "data")
    made = subprocess.run(
        [sys.executable, "-m", "fleetlens", "tokens", "create", "--data", fresh,
         "--tenant", "acme", "--role", "admin"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert made.stdout.split()[0].startswith("fl_")


def test_loopback_without_tokens_serves_the_local_user(server: Server) -> None:
    _, body = step_batch("local-run", range(0, 2), 1)
    assert server.post(body)[0] == 200
    assert server.get("/v1/runs/local-run")["steps"] == 2


def test_a_tenant_admin_grants_only_its_tenants_roles(tenants: Tenants) -> None:
    # Issue 22 item 6: any tenant's admin minted an `oncall` token, which reads every tenant's
    # nodes and approves or rejects every tenant's remediations.
    t = tenants
    status, err = t.server.request(
        "POST", "/v1/tokens", {"role": "oncall", "name": "sneaky"}, token=t.tokens["a-admin"]
    )
    assert status == 403 and "fleetlens tokens create" in err["detail"], err
    listed = t.server.get("/v1/tokens", token=t.tokens["a-admin"])["tokens"]
    assert not any(x["role"] == "oncall" or x["name"] == "sneaky" for x in listed)
    status, _ = t.server.request(
        "POST", "/v1/tokens", {"role": "root", "name": "x"}, token=t.tokens["a-admin"]
    )
    assert status == 400
    status, made = t.server.request(
        "POST", "/v1/tokens", {"role": "editor", "name": "ci"}, token=t.tokens["a-admin"]
    )
    assert status == 201 and made["role"] == "editor"
    # The platform operator's CLI on the server's data directory still makes one.
    out = subprocess.run(
        [sys.executable, "-m", "fleetlens", "tokens", "create", "--data", t.server.data_dir,
         "--tenant", "ops", "--role", "oncall", "--name", "pager"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    token = re.search(r"fl_\S+", out.stdout)
    assert token is not None, out.stdout
    assert t.server.request("GET", "/v1/remediations", token=token.group(0))[0] == 200


def test_metrics_answer_the_callers_projects_only(tenants: Tenants) -> None:
    # Issue 22 item 10: /metrics answered any token, an ingest token included, and a
    # project-scoped viewer saw every project's runs and goodput.
    t = tenants
    for run, project, token in (
        ("nlp-run", "nlp", "a-admin"),
        ("vision-run", "vision", "a-vision"),
        ("bolt-run", "bolt-proj", "b-admin"),
    ):
        _, body = step_batch(run, range(0, 20), 2, t0=time.time() - 30, ctx={"project": project})
        assert t.server.post(body, token=t.tokens[token])[0] == 200

    def text(token: str) -> str:
        status, out = t.server.request("GET", "/metrics", token=t.tokens[token])
        assert status == 200, (token, status, out)
        return str(out)

    def runs_in(body: str) -> set[str]:
        return set(re.findall(r'run_id="([^"]+)"', body))

    wait_until(lambda: {"nlp-run", "vision-run", "bolt-run"} <= runs_in(text("b-admin"))
               | runs_in(text("a-admin")), timeout=60, what="run metrics")  # fmt: skip
    assert t.server.request("GET", "/metrics", token=t.tokens["a-ingest"])[0] == 403
    assert t.server.request("GET", "/metrics", token=t.tokens["b-ingest"])[0] == 403
    assert runs_in(text("a-admin")) == {"nlp-run", "vision-run"}
    assert runs_in(text("a-viewer")) == {"nlp-run", "vision-run"}
    vision = text("a-vision")
    assert runs_in(vision) == {"vision-run"} and 'project="nlp"' not in vision
    assert runs_in(text("b-admin")) == {"bolt-run"}
    # Server-wide counters say how busy the other tenants are: not for a tenant's caller.
    assert "fleetlens_ingest_batches_total{" not in text("a-admin")
    assert not runs_in(text("ops-oncall"))  # on-call sees hardware, not runs
