"""Every CLI command that talks to a server takes its token the same way: ``--token``, else
``$FLEETLENS_TOKEN`` (``fleetlens.cli._common.client_opts`` and ``client``).

The commands run (in this process, through ``fleetlens.cli.main``) against a real server that
requires tokens: without one each is refused with HTTP 401; with ``--token`` or with
``$FLEETLENS_TOKEN`` it gets past authentication (whatever the command then answers: a 404 for
an id that does not exist is fine, a 401 is not). The list of commands is checked against the
parser, so a new command that talks to a server has to be added here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetlens import cli
from fleetlens.sdk.orphans import owner_digest
from fleetlens.sdk.spool import Spool
from fleetlens.store.access import AccessStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.testing import Server, wait_until
from fleetlens.testing.batches import step_batch

from .test_scheduler_import import SACCT, SINFO

pytestmark = pytest.mark.unit

DATA = Path(__file__).resolve().parent / "data"
REAL = DATA / "real"
CONSTRUCTED = DATA / "constructed"
TRACE = REAL / "kineto_traces" / "hta" / "amd_rocm" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
LOG = REAL / "training_logs" / "bigscience_megatron_deepspeed" / "meg_ds_3d_gpt2_perf_n16-ds-on.out"
FR = REAL / "nccl_flight_recorder" / "nvidia_resiliency_ext_16rank" / "gpu_error_1st"

# Group commands that only print a usage error without a subcommand (they contact nothing).
# Commands that take --server but do not contact it here: the groups, and `spool`, which reads
# this node's spools and sends only the batches bound for that server and token (none here; the
# token's part is test_spool_send_takes_the_tokens_batches_and_sends_them_with_it below).
NO_CONTACT = {"eval", "eval suites", "eval triggers", "spool"}


def _imports(tmp: Path) -> dict[str, list[str]]:
    """``import FORMAT``, each format with a file of its kind (real ones where we have them)."""
    (tmp / "metrics.csv").write_text("epoch,step,train_loss,time\n0,1,2.5,1.0\n0,2,2.4,2.0\n")
    hf = '{"log_history": [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.4, "train_runtime": 2}]}'
    (tmp / "trainer_state.json").write_text(hf)
    (tmp / "sacct.txt").write_text(SACCT)
    (tmp / "sinfo.txt").write_text(SINFO)
    files = {
        "megatron": LOG,
        "nemo": CONSTRUCTED / "nemo" / "nemo2_llama3_8b.log",
        "torchtitan": CONSTRUCTED / "torchtitan" / "torchtitan_llama3_8b.log",
        "lightning": tmp / "metrics.csv",
        "hf": tmp / "trainer_state.json",
        "hf-trainer": tmp / "trainer_state.json",
        "sacct": tmp / "sacct.txt",
        "sinfo": tmp / "sinfo.txt",
        "k8s": DATA / "k8s" / "pods_events.json",
        "alibaba": REAL / "cluster_traces" / "alibaba_openb_v2023" / "openb_pod_list_default.csv",
    }
    logs = ("megatron", "nemo", "torchtitan", "lightning", "hf", "hf-trainer")
    return {
        f"import {f}": ["import", f, str(path), *(["--run", f"tok-{f}"] if f in logs else [])]
        for f, path in files.items()
    }


def invocations(tmp: Path) -> dict[str, list[str]]:
    request, policies = tmp / "request.json", tmp / "policies.json"
    request.write_text("{}")
    policies.write_text("[]")
    (tmp / "task.yaml").write_text("task: t\n")
    run = "tok-run"
    return {
        "runs": ["runs"],
        "run show": ["run", "show", run],
        "goodput": ["goodput", run],
        "fleet goodput": ["fleet", "goodput"],
        "fleet allocations": ["fleet", "allocations", "--run", run],
        "fleet capacity": ["fleet", "capacity"],
        "sim run": ["sim", "run", "hang"],
        "agent": ["agent", "--once", "--no-gpu", "--node", "tok-node"],
        "traces import": ["traces", "import", str(TRACE), "--run", run],
        "traces show": ["traces", "show", run],
        "traces capture": ["traces", "capture", run, "--rank", "0"],
        "traces captures": ["traces", "captures", run],
        "fr import": ["fr", "import", str(FR), "--run", run],
        "incidents": ["incidents"],
        "failure-window": ["failure-window", run],
        "alerts": ["alerts"],
        "alerts list": ["alerts", "list"],
        "alerts ack": ["alerts", "ack", "987654"],
        "alerts resolve": ["alerts", "resolve", "987654"],
        "alerts incident": ["alerts", "incident", "987654"],
        "remediations": ["remediations"],
        "remediations list": ["remediations", "list"],
        "remediations show": ["remediations", "show", "987654"],
        "remediations approve": ["remediations", "approve", "987654"],
        "remediations reject": ["remediations", "reject", "987654"],
        "stragglers": ["stragglers", run],
        "diagnose": ["diagnose", run],
        "whatif": ["whatif", run],
        "regression": ["regression", run],
        "compare": ["compare", run, "tok-other"],
        "frontier": ["frontier", "tok-project"],
        "memory": ["memory", run],
        "logs": ["logs", run],
        **_imports(tmp),
        "lineage": ["lineage", "run", run],
        "models register": ["models", "register", "tok-model:1", "--run", run],
        "eval worker": ["eval", "worker", "--idle-exit", "0", "--max-shards", "1"],
        "eval submit": ["eval", "submit", str(request)],
        "eval lm-eval": ["eval", "lm-eval", str(tmp / "task.yaml"), "--adapter", '{"kind": "hf"}'],
        "eval status": ["eval", "status", "tok-eval"],
        "eval gate": ["eval", "gate", "tok-model", "1", "--policies", str(policies)],
        "eval promote": ["eval", "promote", "tok-model", "staging", "1"],
        "eval suites register": ["eval", "suites", "register", str(request)],
        "eval suites list": ["eval", "suites", "list"],
        "eval suites show": ["eval", "suites", "show", "tok-suite"],
        "eval triggers add": ["eval", "triggers", "add", "--on", "model", "--suite", "tok-suite"],
        "eval triggers list": ["eval", "triggers", "list"],
    }


def _server_commands() -> dict[str, set[str]]:
    """Every (sub)command path of the CLI that takes --server, with its options."""
    out: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        opts = {o for a in parser._actions for o in a.option_strings}
        if "--server" in opts:
            out[" ".join(path)] = opts
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    walk(sp, [*path, name])

    walk(cli.build_parser(), [])
    return out


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str, str]]:
    data = tmp_path_factory.mktemp("tokens") / "data"
    data.mkdir()
    meta = MetadataStore(f"sqlite:///{data}/metadata.db")
    access = AccessStore(meta)
    access.create_token("acme", "admin", name="admin")
    token, _ = access.create_token("acme", "editor", name="cli")
    # The server's own counters (rows stored, by kind) are the on-call role's to read.
    oncall, _ = access.create_token("ops", "oncall", name="oncall")
    meta.close()
    srv = Server(str(data), extra_args=("--auth", "required")).start()
    try:
        yield srv, token, oncall
    finally:
        srv.stop()


def _node_rows(srv: Server, token: str) -> int:
    req = urllib.request.Request(srv.url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    m = re.search(r'^fleetlens_ingest_rows_total\{kind="node"\} ([0-9.e+]+)$', text, re.M)
    return int(float(m.group(1))) if m else 0


def test_every_server_command_takes_token(tmp_path: Path) -> None:
    found = _server_commands()
    assert set(found) - NO_CONTACT == set(invocations(tmp_path)), "add the new command here"
    assert all("--token" in opts for opts in found.values()), found


@pytest.mark.e2e
def test_every_server_command_uses_the_token(
    secured: tuple[Server, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    srv, token, oncall = secured
    monkeypatch.delenv("FLEETLENS_TOKEN", raising=False)
    monkeypatch.setenv("FLEETLENS_SPOOL_DIR", str(tmp_path / "spool"))

    def run(argv: list[str]) -> tuple[int, str, str]:
        code = cli.main([*argv, "--server", srv.url])
        out = capsys.readouterr()
        return code, out.out, out.err

    wrong = []
    sims = []
    for name, argv in invocations(tmp_path).items():
        if name == "agent":
            continue
        code, out, err = run(argv)
        if code == 0 or "HTTP 401" not in err:
            wrong.append(f"{name} without a token: exit {code}: {err[-300:]}")
        code, out, err = run([*argv, "--token", token])
        if "HTTP 401" in err:
            wrong.append(f"{name} --token: {err[-300:]}")
        sims += [json.loads(out)["run_id"]] if name == "sim run" and code == 0 else []
        monkeypatch.setenv("FLEETLENS_TOKEN", token)
        try:
            code, out, err = run(argv)
        finally:
            monkeypatch.delenv("FLEETLENS_TOKEN")
        if "HTTP 401" in err:
            wrong.append(f"{name} $FLEETLENS_TOKEN: {err[-300:]}")
    assert wrong == [], "\n".join(wrong)
    # The simulated run sent with --token was stored, under the token's tenant.
    assert sims and sims[0] in {r["runId"] for r in srv.get("/v1/runs", token)["runs"]}

    # The agent never fails on a refused batch (it counts it): the server's rows tell.
    agent = invocations(tmp_path)["agent"]
    before = _node_rows(srv, oncall)
    assert run(agent)[0] == 0 and _node_rows(srv, oncall) == before
    assert run([*agent, "--token", token])[0] == 0
    assert _node_rows(srv, oncall) == before + 1
    monkeypatch.setenv("FLEETLENS_TOKEN", token)
    assert run(agent)[0] == 0 and _node_rows(srv, oncall) == before + 2


@pytest.mark.e2e
def test_spool_send_takes_the_tokens_batches_and_sends_them_with_it(
    secured: tuple[Server, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv, token, _ = secured
    monkeypatch.delenv("FLEETLENS_TOKEN", raising=False)
    root = tmp_path / "spools"
    gone = Spool(str(root / "tok-gone-0"), 1 << 20, owner=owner_digest(srv.url, token))
    bid, body = step_batch("tok-spooled", range(3), 2, ctx={"tenant": "acme"})
    assert gone.put(1, bid, body, records=6)
    assert gone._claim_fd is not None and gone._claim_fd >= 0
    os.close(gone._claim_fd)  # its process is gone: the kernel lets go of its lock
    send = ["spool", "--send", "--root", str(root), "--server", srv.url]
    # Without the token, or with another, these batches are not the caller's to send.
    assert cli.main(send) == 0 and cli.main([*send, "--token", "not-it"]) == 0
    assert len(list((root / "tok-gone-0").glob("*.batch"))) == 1
    # Bound for a token the server does not know: refused for the caller, not for the batch,
    # so it is kept (exit 1), not dropped as a bad one would be.
    other = Spool(str(root / "tok-other-0"), 1 << 20, owner=owner_digest(srv.url, "not-it"))
    assert other.put(1, *step_batch("tok-other", range(1), 1), records=1)
    other.release()
    assert cli.main([*send, "--token", "not-it"]) == 1
    assert sum(len(list(p.glob("*.batch"))) for p in root.glob("send-*")) == 1
    assert cli.main([*send, "--token", token]) == 0
    assert not (root / "tok-gone-0").exists()
    stored = wait_until(lambda: srv.get("/v1/runs/tok-spooled", token), 30)
    assert stored["steps"] == 3
