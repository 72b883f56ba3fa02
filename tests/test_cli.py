"""The command line, run as a user runs it: a real process against a real server.

One smoke test per command. They share one server (``fleet``) into which the simulator played
two runs with known faults, and write only under run ids of their own; a test that needs
another server configuration or a fresh data directory makes its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetlens import cli
from fleetlens.config import ServerConfig
from fleetlens.testing import Server, step_batch

pytestmark = pytest.mark.e2e

DATA = Path(__file__).resolve().parent / "data" / "real"
STRAGGLER = "sim-straggler_persistent"  # rank 13 (node-0001 GPU 5) 15% slow for the whole run
STRAGGLER_NODE = f"{STRAGGLER}-node-0001"  # each scenario is a fleet of its own
THERMAL = "sim-thermal"


def fleetlens_cmd(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlens", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def ok(*args: str, env: dict[str, str] | None = None) -> str:
    out = fleetlens_cmd(*args, env=env)
    assert out.returncode == 0, f"fleetlens {' '.join(args)}:\n{out.stderr}"
    return out.stdout


def poll(what: Callable[[], Any], timeout: float = 60.0) -> Any:
    """``what()`` once it is truthy; the analysis loop runs on its own clock."""
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(str(tmp_path_factory.mktemp("fleet") / "data")).start()
    try:
        for scenario in ("straggler_persistent", "thermal"):
            ok("sim", "run", scenario, "--server", srv.url)
        found = poll(lambda: srv.get(f"/v1/runs/{STRAGGLER}/stragglers")["stragglers"])
        assert found, srv.log()
        yield srv
    finally:
        srv.stop()


def test_cli_commands_are_pinned() -> None:
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert tuple(sub.choices) == cli.COMMANDS  # type: ignore[attr-defined]


def test_config_precedence_cli_over_env_over_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg_file = tmp_path / "fleetlens.toml"
    cfg_file.write_text(
        '[server]\nport = 9001\nhost = "127.0.0.2"\n'
        '[collector]\nmax_inflight = 7\n[remediation]\nmode = "approve"\nrestart_cost_s = 120\n'
    )
    out = fleetlens_cmd(
        "config",
        "show",
        "--json",
        "--config",
        str(cfg_file),
        "--port",
        "9003",
        env={"FLEETLENS_PORT": "9002", "FLEETLENS_HOST": "127.0.0.3", "FLEETLENS_HANG_S": "90"},
    )
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)
    assert (resolved["port"], resolved["host"]) == (9003, "127.0.0.3")
    assert resolved["collector"]["max_inflight"] == 7
    assert resolved["remediation"] == {
        "mode": "approve",
        "actuators": "torchrun",
        "restart_cost_s": 120.0,
        "straggler_persist_s": 300.0,
    }
    assert resolved["analyzer"]["hang_floor_s"] == 90.0  # one hang floor, from FLEETLENS_HANG_S
    bad = fleetlens_cmd("config", env={"FLEETLENS_PORT": "eighty"})
    assert bad.returncode == 2 and "port is 'eighty'; expected an integer" in bad.stderr


def test_config_show_prints_a_file_the_server_reads_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    shown = ok("config", "show", "--data", str(tmp_path / "d"), "--port", "9010")
    assert "[server]" in shown and "[remediation]" in shown and 'mode = "recommend"' in shown
    cfg_file = tmp_path / "shown.toml"
    cfg_file.write_text(shown)
    again = json.loads(ok("config", "--json", "--config", str(cfg_file)))
    assert again["port"] == 9010 and again["data_dir"] == str(tmp_path / "d")
    old = tmp_path / "old.toml"
    old.write_text("[server]\nhang_s = 30\n")
    moved = fleetlens_cmd("config", "--config", str(old))
    assert (
        moved.returncode == 2 and "server.hang_s (it is analyzer.hang_floor_s now)" in moved.stderr
    )


def test_runs_and_run_show_read_the_server(server: Server) -> None:
    _, body = step_batch("cli-run", range(0, 20), 8, slow={6: 1.3})
    assert server.post(body)[0] == 200
    listing = fleetlens_cmd("runs", "--server", server.url)
    assert listing.returncode == 0 and "cli-run" in listing.stdout
    show = fleetlens_cmd("run", "show", "cli-run", "--server", server.url, "--top", "3")
    assert show.returncode == 0, show.stderr
    lines = show.stdout.splitlines()
    slowest = lines[lines.index(next(x for x in lines if "RANK" in x)) + 1].split()
    assert slowest[0] == "6"  # the slow rank comes first
    assert "step 19" in show.stdout and "520.0 ms" in show.stdout


def test_unreachable_server_is_a_clear_error() -> None:
    out = fleetlens_cmd("runs", "--server", "http://127.0.0.1:9")
    assert out.returncode == 2
    assert "cannot reach the fleetlens server" in out.stderr and "fleetlens serve" in out.stderr


def test_server_comes_from_the_environment_when_not_given(fleet: Server) -> None:
    out = ok("runs", env={"FLEETLENS_SERVER": fleet.url})
    assert STRAGGLER in out and THERMAL in out


def test_an_unknown_run_is_the_servers_message_and_exit_2(fleet: Server) -> None:
    out = fleetlens_cmd("goodput", "no-such-run", "--server", fleet.url)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "HTTP 404" in out.stderr and "run 'no-such-run' does not exist" in out.stderr


def test_default_data_dir_follows_xdg(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = ServerConfig.resolve({}, {"XDG_DATA_HOME": str(tmp_path)})
    assert cfg.data_dir == str(tmp_path / "fleetlens")
    assert cfg.resolved_database_url == f"sqlite:///{tmp_path}/fleetlens/metadata.db"


def test_goodput_lines_and_factors(fleet: Server) -> None:
    out = ok("goodput", STRAGGLER, "--server", fleet.url, "--price", "2.5")
    lines = out.splitlines()
    assert lines[0].startswith(f"run {STRAGGLER}  wall ") and "attempts 1" in lines[0]
    assert lines[1].split() == ["LINE", "HOURS", "SHARE", "FACTOR"]
    productive = next(x for x in lines if x.split()[0] == "productive").split()
    assert productive[2].endswith("%") and float(productive[2][:-1]) > 50
    assert "runtime " in out and "MPG " in out and "cost per useful accelerator-hour" in out


def test_fleet_goodput_per_pool(fleet: Server) -> None:
    lines = ok("fleet", "goodput", "--server", fleet.url).splitlines()
    assert lines[0].split() == ["POOL", "SCHED", "AVAIL", "PARTIAL", "STRANDED", "WAIT", "p50"]
    pools = [x.split()[0] for x in lines[1:]]
    assert pools and all(x.split()[1].endswith("%") for x in lines[1:]), lines


def test_stragglers_name_the_injected_rank(fleet: Server) -> None:
    lines = ok("stragglers", STRAGGLER, "--server", fleet.url).splitlines()
    assert lines[0].split()[:3] == ["DIAGNOSIS", "RANKS", "NODES"]
    row = lines[1].split()
    assert row[:3] == ["straggler.persistent", "13", STRAGGLER_NODE]
    assert f"rank 13 ({STRAGGLER_NODE} GPU 5" in lines[2]


def _nodes(srv: Server, run_id: str) -> set[str]:
    ranks = srv.get(f"/v1/runs/{run_id}/ranks?limit=1000")["ranks"]
    return {r["node"] for r in ranks}


def test_scenarios_played_into_one_server_are_fleets_of_their_own(fleet: Server) -> None:
    """Two scenarios into one server: neither's nodes (nor its Xids and heat) are the other's."""
    straggler, thermal = _nodes(fleet, STRAGGLER), _nodes(fleet, THERMAL)
    assert STRAGGLER_NODE in straggler and f"{THERMAL}-node-0001" in thermal, (straggler, thermal)
    assert not straggler & thermal


def test_scenarios_given_one_fleet_share_its_nodes(server: Server) -> None:
    for scenario in ("hang", "oom"):
        ok("sim", "run", scenario, "--server", server.url, "--fleet", "lab")
    hang = poll(lambda: _nodes(server, "sim-hang"))
    oom = poll(lambda: _nodes(server, "sim-oom"))
    assert "lab-node-0001" in hang and hang & oom, (hang, oom)


def test_diagnose_prints_findings_with_evidence(fleet: Server) -> None:
    out = ok("diagnose", STRAGGLER, "--server", fleet.url)
    first = out.splitlines()[0].split()
    assert first[0] == "step" and "owner" in first and "confidence" in first
    assert "rank 13" in out
    # the slow rank priced by the what-if, under its finding, as `fleetlens whatif` prices it
    w = json.loads(ok("whatif", STRAGGLER, "--json", "--server", fleet.url))
    (f,) = [f for f in w["findings"] if f["diagnosis"] == "straggler.persistent"]
    want = f"what-if, fixed: {f['savedSeconds']:,.1f} s of steps {w['fromStep']}-{w['toStep']}"
    assert want in out, out


def test_whatif_prices_the_straggler_and_each_type(fleet: Server) -> None:
    """The slow rank fixed, how much faster the attempt's steps would have been."""
    w = json.loads(ok("whatif", STRAGGLER, "--json", "--server", fleet.url))
    (f,) = [f for f in w["findings"] if f["diagnosis"] == "straggler.persistent"]
    assert f["ranks"] == [13] and f["savedSeconds"] > 0 and 0 < f["share"] < 1
    assert w["byType"]["compute"] >= f["savedSeconds"] * 0.9 and w["slowdown"] > 0
    out = ok("whatif", STRAGGLER, "--server", fleet.url)
    assert "straggler.persistent" in out and "ranks 13:" in out and "compute" in out


def test_compare_two_runs(fleet: Server) -> None:
    lines = ok("compare", STRAGGLER, THERMAL, "--server", fleet.url).splitlines()
    assert lines[0].split() == [STRAGGLER, THERMAL]
    labels = ("step time (s)", "tokens/s", "goodput (job)", "runtime goodput", "health")
    for label in labels:
        assert any(x.startswith(label) for x in lines), (label, lines)
    one = fleetlens_cmd("compare", STRAGGLER, "--server", fleet.url)
    assert one.returncode == 2 and "name two or more runs" in one.stderr


def test_lineage_of_a_run_and_a_bad_model_name(fleet: Server) -> None:
    data = json.loads(ok("lineage", "run", STRAGGLER, "--server", fleet.url))
    assert data["runId"] == STRAGGLER and data["checkpoints"]
    bad = fleetlens_cmd("lineage", "model", "no-version", "--server", fleet.url)
    assert bad.returncode == 2 and "MODEL:VERSION" in bad.stderr


def test_models_register_from_a_checkpoint(fleet: Server) -> None:
    ckpt = fleet.get(f"/v1/lineage/runs/{STRAGGLER}")["checkpoints"][0]
    step = str(ckpt["step"])
    made = json.loads(
        ok(
            "models",
            "register",
            "cli-model:1",
            "--run",
            STRAGGLER,
            "--step",
            step,
            "--server",
            fleet.url,
        )
    )
    assert (made["modelId"], made["version"]) == ("cli-model", "1")
    lineage = json.loads(ok("lineage", "model", "cli-model:1", "--server", fleet.url))
    assert lineage["run"]["runId"] == STRAGGLER
    assert lineage["checkpoint"]["checkpointId"] == ckpt["checkpointId"]


def test_alerts_list_ack_incident_and_rules(fleet: Server) -> None:
    def spread() -> list[dict[str, Any]]:
        alerts = fleet.get(f"/v1/alerts?runId={STRAGGLER}")["alerts"]
        return [a for a in alerts if a["alertname"] == "StragglerSpread"]

    (alert,) = poll(spread)
    lines = ok("alerts", "list", "--run", STRAGGLER, "--server", fleet.url).splitlines()
    assert lines[0].split() == ["ID", "STATE", "SEVERITY", "ALERT", "RUN", "WHERE"]
    row = next(x for x in lines if "StragglerSpread" in x)
    assert row.split()[0] == str(alert["id"]) and "rank=13" in row
    acked = json.loads(ok("alerts", "ack", str(alert["id"]), "--server", fleet.url))
    assert acked["id"] == alert["id"] and acked["ackedBy"]
    incident = json.loads(ok("alerts", "incident", str(alert["incidentId"]), "--server", fleet.url))
    assert alert["id"] in [a["id"] for a in incident["alerts"]]
    assert "groups:" in ok("alerts", "prometheus-rules")


def test_remediations_list(fleet: Server) -> None:
    out = ok("remediations", "--server", fleet.url)
    assert out.splitlines()[0] == "mode: recommend"
    assert out.splitlines()[1].split()[:3] == ["ID", "STATE", "NODE"]


def test_sim_list_and_sim_run_honours_fleetlens_token(tmp_path: Path) -> None:
    assert "straggler_persistent" in json.loads(ok("sim", "list", "--json"))
    data = str(tmp_path / "data")
    ok("tokens", "create", "--tenant", "acme", "--role", "admin", "--data", data)
    token = ok("tokens", "create", "--tenant", "acme", "--role", "ingest", "--data", data).strip()
    srv = Server(data, extra_args=("--auth", "required")).start()
    try:
        refused = fleetlens_cmd("sim", "run", "straggler_persistent", "--server", srv.url)
        assert refused.returncode == 2 and "HTTP 401" in refused.stderr
        sent = ok("sim", "run", "straggler_persistent", "--server", srv.url,
                  env={"FLEETLENS_TOKEN": token})  # fmt: skip
        assert json.loads(sent)["run_id"] == STRAGGLER
        reader = ok("tokens", "create", "--tenant", "acme", "--role", "viewer", "--data", data)
        runs = ok("runs", "--server", srv.url, env={"FLEETLENS_TOKEN": reader.strip()})
        assert STRAGGLER in runs
    finally:
        srv.stop()


def test_tokens_and_tenant_quotas_on_the_data_directory(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    ok("tokens", "create", "--tenant", "acme", "--role", "viewer", "--name", "nb", "--data", data)
    (tok,) = json.loads(ok("tokens", "list", "--tenant", "acme", "--json", "--data", data))
    assert (tok["role"], tok["name"], tok["tenant"]) == ("viewer", "nb", "acme")
    row = ok("tokens", "list", "--tenant", "acme", "--data", data).split()
    assert row[0] == str(tok["id"]) and row[2:4] == ["viewer", "*"] and row[4] == "active"
    ok("tokens", "revoke", "--tenant", "acme", str(tok["id"]), "--data", data)
    assert "revoked" in ok("tokens", "list", "--tenant", "acme", "--data", data)

    set_ = json.loads(ok("tenants", "quota", "acme", "--stored-bytes", "1000", "--data", data))
    assert set_["tenant"] == "acme" and set_["stored_bytes"] == 1000
    shown = json.loads(ok("tenants", "quota", "acme", "--data", data))
    assert shown["stored_bytes"] == 1000


def test_import_a_training_log(fleet: Server) -> None:
    log = DATA / "training_logs" / "bigscience_megatron_deepspeed"
    log /= "meg_ds_3d_gpt2_perf_n16-ds-off.out"
    summary = json.loads(
        ok("import", "megatron", str(log), "--run", "cli-imported", "--server", fleet.url, "--json")
    )
    assert summary["runId"] == "cli-imported" and summary["steps"] > 0
    # without --json, a summary a person reads (it printed 70 lines of raw JSON)
    text = ok("import", "megatron", str(log), "--run", "cli-imported", "--server", fleet.url)
    assert text.startswith("run cli-imported  (megatron, ") and "median step" in text, text
    assert "{" not in text.splitlines()[0]
    # Each format has its own --help with its own options (megatron's was the generic help,
    # Slurm flags and all).
    meg = ok("import", "megatron", "--help")
    assert "Megatron-LM" in meg and "--accelerator" in meg
    assert "--pool" not in meg and "--tz" not in meg
    sacct = ok("import", "sacct", "--help")
    assert "--tz" in sacct and "--accelerator" not in sacct and "--nodes" not in sacct
    run = poll(lambda: [r for r in fleet.get("/v1/runs")["runs"] if r["runId"] == "cli-imported"])
    assert run, fleet.log()


def test_traces_import_into_the_server(fleet: Server) -> None:
    trace = DATA / "kineto_traces" / "hta" / "cpu_only_gloo_world300"
    out = fleetlens_cmd("traces", "import", str(trace), "--run", "cli-tr", "--server", fleet.url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].split()[:2] == ["RANK", "STEPS"]
    assert f"imported into {fleet.url}, run cli-tr" in out.stderr
    assert fleet.get("/v1/runs/cli-tr/traces")["ranks"]


def test_agent_once_sends_host_samples(fleet: Server) -> None:
    out = fleetlens_cmd("agent", "--server", fleet.url, "--no-gpu", "--once", "--node", "n-cli")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr


def test_eval_status_of_an_unknown_evaluation(fleet: Server) -> None:
    out = fleetlens_cmd("eval", "status", "no-such-eval", "--server", fleet.url)
    assert out.returncode == 2 and "HTTP 404" in out.stderr and "Traceback" not in out.stderr


READS = (
    ("runs",),
    ("run", "show", STRAGGLER),
    ("goodput", STRAGGLER),
    ("fleet", "goodput"),
    ("stragglers", STRAGGLER),
    ("diagnose", STRAGGLER),
    ("whatif", STRAGGLER),
    ("compare", STRAGGLER, THERMAL),
    ("lineage", "run", STRAGGLER),
    ("alerts",),
    ("alerts", "list"),
    ("remediations",),
    ("remediations", "list"),
)


@pytest.mark.parametrize("argv", READS, ids=" ".join)
def test_json_on_every_read_command_is_the_servers_json(fleet: Server, argv: tuple[str]) -> None:
    data = json.loads(ok(*argv, "--json", "--server", fleet.url))
    assert isinstance(data, dict) and data


@pytest.mark.parametrize("reader", ["head -1", "true"])
def test_a_closed_pipe_exits_quietly(fleet: Server, reader: str) -> None:
    # `true` exits before fleetlens writes: its first write meets a closed pipe (EPIPE)
    cmd = f"{sys.executable} -m fleetlens runs --server {fleet.url} | {reader}"
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60)
    assert out.stderr == "" and out.returncode == 0
    if reader == "head -1":
        assert out.stdout.split() == ["RUN", "PROJECT", "STATUS", "STEP", "RANKS", "JOBS"]
