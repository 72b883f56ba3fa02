"""The run graph: registration, lineage both ways (both metadata engines), SDK events, API."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fleetlens.errors import ConfigError, NotFound
from fleetlens.store.graph import GraphStore
from fleetlens.store.graph_types import DatasetInfo
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope
from fleetlens.testing import Server, step_batch
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.e2e

A = Scope(tenant="acme", role="editor", actor="alice")
B = Scope(tenant="bolt", role="editor", actor="bob")


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_run_described_by_two_writers_at_once_is_described_once(
    metadata_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ranks of a job start together and each one's job_start describes the run: the second
    # writer to create its row lost the race on the unique key, and its batch got a 500.
    import fleetlens.store.graph_lineage as lineage
    from fleetlens.store.graph_models import RunExtra

    meta = MetadataStore(metadata_url)
    try:
        meta.observe("acme", "r1", job_id="j1", project="llm", first=1.0, last=2.0)
        original, raced = lineage._extra, []

        def racing(s, tenant, run_id):  # type: ignore[no-untyped-def]
            extra = original(s, tenant, run_id)
            if not raced:  # another rank's request creates the row before this one commits
                raced.append(True)
                with meta.session() as other:
                    other.add(RunExtra(tenant=tenant, run_id=run_id, code={},
                                       environment={"hostname": "n1"}, updated_at=0.0))  # fmt: skip
            return extra

        monkeypatch.setattr(lineage, "_extra", racing)
        GraphStore(meta).describe_run(A, "r1", code="abc123", environment={"python": "3.11"})
        lin = GraphStore(meta).run_lineage(A, "r1")
        assert raced and lin.code == {"commit": "abc123"}
        assert lin.environment == {"hostname": "n1", "python": "3.11"}
    finally:
        meta.close()


def test_lineage_round_trip_model_to_checkpoint_to_run_to_dataset(
    metadata_url: str, tmp_path: Path
) -> None:
    meta = MetadataStore(metadata_url)
    try:
        g = GraphStore(meta)
        meta.observe("acme", "r918", job_id="j1", project="llm", first=1.0, last=2.0, step=820000)
        shard = tmp_path / "shard-0.bin"
        shard.write_bytes(b"tokens" * 1000)
        ckpt = tmp_path / "ckpt-820000.pt"
        ckpt.write_bytes(b"weights" * 5000)
        g.register_dataset(
            A,
            "web",
            "v42",
            content_hash="sha256:abc",
            shards=[{"uri": str(shard), "sha256": _sha(shard)}],
        )
        g.describe_run(
            A,
            "r918",
            config={"optim": {"lr": 2e-4}, "batch": 1024},
            code="a94df2",
            dataset="web:v42",
            launch_command="torchrun train.py",
            experiment_id="exp-1",
        )
        ck = g.record_checkpoint(
            A,
            "r918",
            820000,
            uri=str(ckpt),
            job_id="j1",
            duration_s=12.5,
            sync=False,
            compute_checksum=True,
        )
        assert ck.checksum == "sha256:" + _sha(ckpt) and ck.size_bytes == 35000
        mv = g.register_model_version(
            A, "llama-x", "v142", "r918", step=820000, evaluation_id="e3491", metrics={"mmlu": 80.1}
        )
        assert mv.checkpoint_id == "r918@820000"

        lin = g.model_lineage(A, "llama-x", "v142", verify=True)
        assert lin.evaluation_id == "e3491"
        assert lin.checkpoint.job_id == "j1" and lin.checkpoint.sync is False
        assert lin.step == 820000
        run = lin.run
        assert run.run_id == "r918" and run.experiment_id == "exp-1"
        assert run.config == {"optim": {"lr": 2e-4}, "batch": 1024}
        assert run.code == {"commit": "a94df2"}
        assert isinstance(run.dataset, DatasetInfo)
        assert run.dataset.version == "v42" and run.dataset.shards[0]["uri"] == str(shard)
        assert lin.verification is not None and lin.verification["ok"] is True
        assert [c["what"] for c in lin.verification["checks"]] == ["checkpoint", "dataset shard"]

        # The other way: run -> its checkpoints and model versions.
        back = g.run_lineage(A, "r918")
        assert [m.version for m in back.model_versions] == ["v142"]
        assert back.checkpoints[0].checkpoint_id == "r918@820000"

        # A changed checkpoint file fails verification; a version is immutable.
        ckpt.write_bytes(b"tampered")
        bad = g.model_lineage(A, "llama-x", "v142", verify=True).verification
        assert bad is not None
        assert bad["ok"] is False and bad["checks"][0]["ok"] is False
        g.record_checkpoint(A, "r918", 830000, uri="s3://b/c", ok=False)
        with pytest.raises(ConfigError, match="ok=false"):
            g.register_model_version(A, "llama-x", "v143", "r918", step=830000)
        g.record_checkpoint(A, "r918", 820001, uri="s3://b/d")
        with pytest.raises(ConfigError, match="immutable"):
            g.register_model_version(A, "llama-x", "v142", "r918", checkpoint_id="r918@820001")

        # Another tenant sees none of it.
        with pytest.raises(NotFound):
            g.model_lineage(B, "llama-x", "v142")
        with pytest.raises(NotFound):
            g.run_lineage(B, "r918")
        with pytest.raises(NotFound):
            g.dataset(B, "web", "v42")
        assert g.model_versions(B) == []
        with pytest.raises(NotFound):
            g.record_checkpoint(B, "r918", 1)
    finally:
        meta.close()


def test_sdk_events_fill_the_graph(server: Server, tmp_path: Path) -> None:
    """job_start with dataset/code/config and checkpoint_end as the SDK sends them."""
    import fleetlens

    run = fleetlens.init(
        run_id="sdk-run",
        server=server.url,
        job_id="j1",
        config={"lr": 3e-4},
        dataset={"name": "web", "version": "v7"},
        code={"repo": "git@x:y", "commit": "a94df2"},
        spool_dir=str(tmp_path / "spool"),
        install_signal_handler=False,
    )
    with run.step(0):
        pass
    with run.checkpoint(0, path="/ckpt/0", size_bytes=123, sync=False):
        pass
    run.finish()
    lin = server.get("/v1/lineage/runs/sdk-run")
    assert lin["config"] == {"lr": 3e-4}
    assert lin["code"] == {"repo": "git@x:y", "commit": "a94df2"}
    assert lin["dataset"] == {"name": "web", "version": "v7"}
    assert lin["environment"]["python"] and lin["launchCommand"]
    ck = lin["checkpoints"]
    assert len(ck) == 1 and ck[0]["uri"] == "/ckpt/0" and ck[0]["jobId"] == "j1"
    assert ck[0]["sizeBytes"] == 123 and ck[0]["sync"] is False


def test_api_registration_lineage_and_tenancy(server: Server, tmp_path: Path) -> None:
    _, body = step_batch("api-run", range(0, 5), 2)
    assert server.post(body)[0] == 200
    ev = TableBuilder("event")
    ev.add("time", [1.7e9]).add("kind", ["config_change"])
    ev.add("attrs", [json.dumps({"key": "lr", "old": 1e-4, "new": 2e-4})])
    _, evb = encode_batch({"event": ev.build()}, {"run_id": "api-run", "job_id": "j1"})
    assert server.post(evb)[0] == 200
    st, out = server.request(
        "POST", "/v1/runs/api-run/describe", {"code": "c0ffee", "dataset": "web:v1"}
    )
    assert st == 200 and out["config"] == {"lr": 2e-4} and out["code"] == {"commit": "c0ffee"}
    st, ck = server.request(
        "POST",
        "/v1/runs/api-run/checkpoints",
        {"step": 4, "uri": "s3://bucket/ck4", "checksum": "sha256:00"},
    )
    assert st == 200 and ck["checkpointId"] == "api-run@4"
    st, mv = server.request(
        "POST", "/v1/models", {"modelId": "m", "version": "1", "runId": "api-run", "step": 4}
    )
    assert st == 201 and mv["checkpointId"] == "api-run@4"
    lin = server.get("/v1/lineage/models/m/1")
    assert lin["run"]["dataset"]["version"] == "v1" and lin["step"] == 4
    # The server will not read a local file outside DATA/artifacts to checksum it.
    st, err = server.request(
        "POST", "/v1/runs/api-run/artifacts", {"name": "passwd", "uri": "/etc/passwd"}
    )
    assert st == 400 and "sha256" in err["detail"]
    art_dir = Path(server.data_dir) / "artifacts"
    art_dir.mkdir()
    (art_dir / "trace.json").write_text("{}")
    st, art = server.request(
        "POST",
        "/v1/runs/api-run/artifacts",
        {"name": "trace", "uri": str(art_dir / "trace.json"), "kind": "trace"},
    )
    assert st == 200 and art["sha256"] == hashlib.sha256(b"{}").hexdigest()
    infra = server.get("/v1/lineage/runs/api-run")["infrastructure"]
    assert infra["speed"]["n_steps"] == 5
    assert server.request("GET", "/v1/lineage/models/m/2")[0] == 404
    assert server.request("GET", "/v1/runs/compare?left=api-run")[0] == 400


def _deep(levels: int) -> dict[str, object]:
    out: dict[str, object] = {"lr": 1e-4}
    for _ in range(levels - 1):
        out = {"nested": out}
    return out


def test_a_config_nested_700_deep_is_refused_at_the_door_and_the_run_stays_readable(
    server: Server,
) -> None:
    """A 700-deep config was stored and every GET of the run answered 500 after (its JSON too
    deep to serialize). Refused by name through describe (422) and in a job_start event (the
    row, by field); a real config's depth passes."""
    _, body = step_batch("deep-run", range(0, 5), 2)
    assert server.post(body)[0] == 200
    st, err = server.request("POST", "/v1/runs/deep-run/describe", {"config": _deep(700)})
    assert st == 422 and "nests deeper than 32 levels" in json.dumps(err), err
    ev = TableBuilder("event")
    ev.add("time", [1.7e9]).add("kind", ["job_start"])
    ev.add("attrs", [json.dumps({"config": _deep(700)})])
    _, evb = encode_batch({"event": ev.build()}, {"run_id": "deep-run", "job_id": "j1"})
    st, answer, _ = server.post(evb)  # its only row refused: the batch is
    assert st == 400 and "attrs.config nests deeper than 32 levels" in answer["detail"], answer
    st, ok = server.request("POST", "/v1/runs/deep-run/describe", {"config": _deep(6)})
    assert st == 200, ok
    run = server.get("/v1/runs/deep-run")
    assert run["config"] == _deep(6)
