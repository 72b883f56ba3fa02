"""The command line, run as a user runs it: a real process against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fleetlens import cli
from fleetlens.config import ServerConfig

from .helpers import Server, step_batch


def fleetlens_cmd(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlens", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_cli_commands_are_pinned() -> None:
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert tuple(sub.choices) == cli.COMMANDS  # type: ignore[attr-defined]


def test_config_precedence_cli_over_env_over_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg_file = tmp_path / "fleetlens.toml"
    cfg_file.write_text('[server]\nport = 9001\nhost = "127.0.0.2"\nmax_inflight = 7\n')
    out = fleetlens_cmd(
        "config",
        "--config",
        str(cfg_file),
        "--port",
        "9003",
        env={"FLEETLENS_PORT": "9002", "FLEETLENS_HOST": "127.0.0.3"},
    )
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)
    assert (resolved["port"], resolved["host"], resolved["max_inflight"]) == (9003, "127.0.0.3", 7)
    bad = fleetlens_cmd("config", env={"FLEETLENS_PORT": "eighty"})
    assert bad.returncode == 2 and "port is 'eighty'; expected an integer" in bad.stderr


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


def test_default_data_dir_follows_xdg(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = ServerConfig.resolve({}, {"XDG_DATA_HOME": str(tmp_path)})
    assert cfg.data_dir == str(tmp_path / "fleetlens")
    assert cfg.resolved_database_url == f"sqlite:///{tmp_path}/fleetlens/metadata.db"
