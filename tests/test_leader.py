"""Several servers on one PostgreSQL: one leads (monitoring, alerts, remediation), the others
ingest and serve reads and pass a job's control channel to the leader; when the leader dies
another takes over within seconds. A SQLite server is alone and always leads."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from fleetlens.config import ServerConfig
from fleetlens.errors import ConfigError
from fleetlens.store.leader import open_election
from fleetlens.testing import Server, monitor_passes, step_batch, wait_passes, wait_until
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.e2e


def _database(pg_url: str, name: str) -> str:
    """A fresh database on the session's PostgreSQL (advisory locks are per database)."""
    engine = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return pg_url.rsplit("/", 1)[0] + f"/{name}"


def _servers(tmp_path: Path, url: str, n: int, env: dict[str, str] | None = None) -> list[Server]:
    """``n`` servers on one metadata database, each with its own data directory; started one
    after the other, so the first takes the lead."""
    out = []
    for i in range(n):
        srv = Server(str(tmp_path / f"s{i}"), extra_args=("--database-url", url), env=env or {})
        out.append(srv.start())
    return out


def _healthz(srv: Server) -> dict[str, Any]:
    return srv.get("/healthz")  # type: ignore[no-any-return]


def _metrics(srv: Server) -> list[str]:
    with urllib.request.urlopen(srv.url + "/metrics", timeout=10) as r:
        return r.read().decode().splitlines()


def _gauge(srv: Server) -> float:
    (line,) = [ln for ln in _metrics(srv) if ln.startswith("fleetlens_leader ")]
    return float(line.split()[1])


def _control(srv: Server, run_id: str) -> tuple[int, dict[str, Any], str]:
    """A rank's control poll: (status, answer, the leader that answered)."""
    req = urllib.request.Request(f"{srv.url}/v1/runs/{run_id}/control?rank=0&world=1&jobId=a0")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.load(r), r.headers.get("X-Fleetlens-Leader", "")


def test_a_sqlite_server_leads(server: Server) -> None:
    assert _healthz(server)["leader"] is True
    assert _gauge(server) == 1.0


def test_a_leader_whose_connection_dies_loses_the_lead(pg_url: str) -> None:
    engine = sa.create_engine(_database(pg_url, "lead_conn"))
    first = open_election(engine, "http://10.0.0.1:8000")
    second = open_election(engine, "http://10.0.0.2:8000")
    try:
        assert (first.check(), second.check()) == (True, False)
        assert second.leader_url == "http://10.0.0.1:8000"
        with engine.connect() as conn:  # the leader's session ends under it
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'http://10.0.0.1:8000'"
                )
            )
        assert first.check() is False  # its session is gone, and the lead with it
        # The lock is free once the backend has exited (asynchronous on the database's side).
        wait_until(second.check, 10, what="the other takes the lead")
        assert first.check() is False and first.leader_url == "http://10.0.0.2:8000"
        second.close()  # giving up the lead frees it (once the session has ended)
        wait_until(first.check, 10, what="the lead is free again")
    finally:
        first.close()
        second.close()
        engine.dispose()


def test_the_advertised_url() -> None:
    def url(**cli: Any) -> str:
        return ServerConfig.resolve(cli, environ={}).advertised_url

    assert url(port=9000) == "http://127.0.0.1:9000"
    assert url(host="::1", port=9000) == "http://[::1]:9000"
    assert url(advertise_url="http://fl-2.internal:8000/") == "http://fl-2.internal:8000"
    with pytest.raises(ConfigError, match="advertise_url"):
        url(advertise_url="fl-2:8000")
    long = "http://" + "a" * 60 + ":8000"
    with pytest.raises(ConfigError, match="63 bytes"):
        open_election(sa.create_engine("postgresql+psycopg://x@127.0.0.1:1/x"), long)


def test_one_leader_and_another_takes_over_when_it_is_killed(tmp_path: Path, pg_url: str) -> None:
    url = _database(pg_url, "lead_takeover")
    a, b = _servers(tmp_path, url, 2)
    try:
        assert [_healthz(s)["leader"] for s in (a, b)] == [True, False]
        assert [_gauge(s) for s in (a, b)] == [1.0, 0.0]
        # A job's control poll reaches the leader through either server.
        assert b.post(step_batch("ctl-run", range(0, 3), 1, job_id="a0")[1])[0] == 200
        for srv in (a, b):
            status, answer, by = _control(srv, "ctl-run")
            assert status == 200 and answer["action"] is None and by == a.url
        # A rank's answer too; a request a follower already passed on is never passed again.
        ack = {"id": 0, "event": "resumed", "rank": 0, "jobId": "a0", "time": time.time()}
        assert b.request("POST", "/v1/runs/ctl-run/control", ack) == (
            200,
            {"id": None, "state": None},
        )
        looped = urllib.request.Request(
            f"{b.url}/v1/runs/ctl-run/control?rank=0", headers={"X-Fleetlens-Forwarded": "1"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(looped, timeout=10)
        refused.value.close()
        assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
        a.kill()  # SIGKILL: no goodbye; PostgreSQL ends its session and frees the lock
        killed = time.monotonic()
        wait_until(lambda: _healthz(b)["leader"], timeout=30, what="the follower to lead")
        assert time.monotonic() - killed < 10.0
        assert _gauge(b) == 1.0
        assert _control(b, "ctl-run")[2] == b.url
        # A third server joining now follows the new leader.
        (c,) = _servers(tmp_path / "late", url, 1)
        try:
            assert _healthz(c)["leader"] is False
            assert _control(c, "ctl-run")[2] == b.url
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()


class _Receiver(BaseHTTPRequestHandler):
    got: list[dict[str, Any]]

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self.got.append(json.loads(self.rfile.read(n)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    got: list[dict[str, Any]] = []
    handler = type("Receiver", (_Receiver,), {"got": got})
    http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}/hook", got
    finally:
        http.shutdown()
        http.server_close()


def _post_to(servers: list[Server], tables: dict[str, Any], run_id: str) -> None:
    ctx = {"run_id": run_id, "job_id": f"{run_id}-a0", "project": "llm"}
    _, body = encode_batch(tables, ctx)
    for srv in servers:
        assert srv.post(body)[0] == 200


def test_an_alert_raised_while_two_servers_run_is_notified_once(
    tmp_path: Path, pg_url: str, webhook: tuple[str, list[dict[str, Any]]]
) -> None:
    hook, got = webhook
    url = _database(pg_url, "lead_alerts")
    env = {"FLEETLENS_WEBHOOK_URL": hook, "FLEETLENS_ANALYSIS_INTERVAL_S": "0.3"}
    servers = _servers(tmp_path, url, 2, env)
    try:
        # Both servers hold the run's telemetry (as if both read one ClickHouse): either could
        # see the fault, only the leader evaluates it.
        t0 = time.time() - 40
        pl = TableBuilder("placement")
        pl.add("time", [t0] * 4).add("rank", [0, 1, 2, 3]).add("world_size", [4] * 4)
        pl.add("node_id", ["n1", "n1", "n2", "n2"]).add("gpu", [0, 1, 0, 1])
        _post_to(servers, {"placement": pl.build()}, "xid-run")
        _, steps = step_batch("xid-run", range(0, 60), 4, job_id="xid-run-a0", t0=t0, base=0.5)
        for srv in servers:
            assert srv.post(steps)[0] == 200
        ev = TableBuilder("event")
        ev.add("time", [time.time() - 5]).add("kind", ["hardware_fault"]).add("step", [59])
        ev.add("rank", [3]).add("node_id", ["n2"]).add("gpu", [1])
        ev.add("attrs", [json.dumps({"xid": 79})]).add("message", ["hardware_fault on n2"])
        _post_to(servers, {"event": ev.build()}, "xid-run")

        def fatal() -> list[dict[str, Any]]:
            return [
                a
                for post in list(got)
                for a in post["alerts"]
                if a["labels"].get("alertname") == "FatalHardwareFault"
                and a["labels"].get("run_id") == "xid-run"
            ]

        wait_until(fatal, timeout=60, what="the fatal XID to be notified")
        wait_passes(servers[0], 10)  # later passes on the leader send it no second time
        (sent,) = fatal()
        assert sent["status"] == "firing" and sent["labels"]["node"] == "n2"
        # The follower ran no monitoring pass: the run's series come from the leader alone.
        leader, follower = ([ln for ln in _metrics(s) if 'run_id="xid-run"' in ln] for s in servers)
        assert any(ln.startswith("fleetlens_run_last_step_age_seconds") for ln in leader)
        assert follower == [] and monitor_passes(servers[1]) == 0
    finally:
        for srv in servers:
            srv.stop()
