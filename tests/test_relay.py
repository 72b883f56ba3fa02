"""The node relay for real: SDK runs -> ``fleetlens agent`` (a subprocess) -> ``fleetlens serve``.

Every record a rank recorded is stored exactly once whatever happens between: the server down
while the ranks go on (the relay spools and acknowledges, then replays), the relay SIGKILLed
after acknowledging (its fsync'd spool is replayed by the next one), the relay replaying
batches the server had already stored (a crash between the server's answer and the spool's
delete), a bad batch among good ones in one multi-batch request (refused alone), and a server
from before the multi-batch route (each batch forwarded alone).
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import fleetlens
from fleetlens.agent.relay import Relay, RelayConfig
from fleetlens.api.ops_models import IngestBatchesOut
from fleetlens.sdk import route
from fleetlens.sdk.config import SDKConfig
from fleetlens.sdk.transport import UnixHTTPConnection
from fleetlens.store.access import AccessStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.testing import Server, free_port, step_batch, wait_until
from fleetlens.wire import BATCHES_CONTENT_TYPE, BatchFrame, encode_frames

pytestmark = pytest.mark.e2e


class Agent:
    """``fleetlens agent --relay-only`` in a subprocess, on a loopback port or a unix socket."""

    def __init__(self, server: str, spool: Path, *, port: int = 0, sock: str = "") -> None:
        self.server, self.spool, self.port, self.sock = server, spool, port, sock
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix:{self.sock}" if self.sock else f"http://127.0.0.1:{self.port}"

    def start(self) -> Agent:
        args = [sys.executable, "-m", "fleetlens", "agent", "--relay-only", "--server",
                self.server, "--relay-spool", str(self.spool), "--relay-interval", "0.1",
                "--relay", str(self.port) if self.port else "off"]  # fmt: skip
        if self.sock:
            args += ["--relay-socket", self.sock]
        self.log = open(self.spool.parent / f"agent-{time.time_ns()}.log", "wb")  # noqa: SIM115
        proc = self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: route.probe(self.url) or proc.poll() is not None, 30,
                   what="the relay to answer")  # fmt: skip
        assert proc.poll() is None, self.output()
        return self

    def stats(self) -> dict[str, Any]:
        conn = (
            UnixHTTPConnection(self.sock, 5)
            if self.sock
            else http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        )
        try:
            conn.request("GET", "/v1/relay")
            return dict(json.loads(conn.getresponse().read())["stats"])
        finally:
            conn.close()

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        if not self.log.closed:
            self.log.close()


@contextlib.contextmanager
def running(*procs: Server | Agent) -> Iterator[None]:
    try:
        yield
    finally:
        for p in procs:
            p.stop()


def _ranks(relay: str, tmp: Path, run_id: str, world: int) -> list[fleetlens.Run]:
    return [
        fleetlens.init(
            project="p",
            run_id=run_id,
            server="http://127.0.0.1:9",  # never used: everything goes through the relay
            relay=relay,
            rank=r,
            world_size=world,
            spool_dir=str(tmp / f"rank-{r}"),
            install_signal_handler=False,
            flush_interval=0.05,
            backoff_max=0.5,
        )
        for r in range(world)
    ]


def _train(runs: list[fleetlens.Run], steps: range, tokens: int = 100) -> None:
    for i in steps:
        for run in runs:
            with run.step(i, tokens=tokens):
                pass
            run.log(i, loss=1.0 / (1 + i), lr=3e-4)
        time.sleep(0.005)


def _run(server: Server, run_id: str) -> dict[str, Any]:
    """The run's summary, or {} while the server does not know it yet."""
    status, doc = server.request("GET", f"/v1/runs/{run_id}")
    return doc if status == 200 and isinstance(doc, dict) else {}


def _stored_once(server: Server, run_id: str, world: int, steps: int, tokens: int = 100) -> None:
    def done() -> dict[str, Any] | None:
        r = _run(server, run_id)
        return r if r.get("status") == "FINISHED" and r.get("step") == steps - 1 else None

    wait_until(done, 60, what="every step stored")
    ranks = server.get(f"/v1/runs/{run_id}/ranks?fromStep=0&toStep={steps}")["ranks"]
    assert sorted((r["rank"], r["steps"]) for r in ranks) == [(r, steps) for r in range(world)]
    assert server.get(f"/v1/runs/{run_id}")["tokensProcessed"] == steps * world * tokens


def test_ranks_through_the_relay_survive_a_server_outage_and_are_stored_once(
    tmp_path: Path,
) -> None:
    server = Server(str(tmp_path / "data")).start()
    agent = Agent(server.url, tmp_path / "spool", port=free_port())
    with running(server, agent):  # both stopped, whatever fails
        agent.start()
        runs = _ranks(agent.url, tmp_path, "relayed", 4)
        _train(runs, range(0, 100))
        assert all(run.flush(10) for run in runs)
        wait_until(lambda: _run(server, "relayed").get("step") == 99, 30, what="steps 0-99")

        server.kill()  # the server dies; the ranks go on through the relay
        _train(runs, range(100, 200))
        assert all(run.flush(10) for run in runs)  # acknowledged by the relay, durable there
        during = agent.stats()
        assert during["spooled_batches"] > 0 and during["server_down"], during
        for run in runs:
            stats = run.stats()
            assert stats["relay"] == agent.url and stats["spool_files"] == 0, stats
            assert stats["send_failures"] == 0 and stats["dropped"] == 0, stats

        server.start()  # back on the same port and data: the relay replays its spool
        for run in runs:
            run.finish()
        _stored_once(server, "relayed", 4, 200)
        after = wait_until(lambda: (s := agent.stats())["spooled_batches"] == 0 and s, 30)
        assert after["forwarded"] == after["received"] and after["refused"] == 0, after
        # Coalesced: the server got far fewer requests than the ranks sent batches.
        assert after["forward_requests"] < after["received"] / 2, after


def test_relay_killed_after_acking_loses_nothing_and_replays_store_nothing_twice(
    tmp_path: Path,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spool = tmp_path / "spool"
    sock = str(tmp_path / "r.sock")
    agent = Agent(url, spool, sock=sock).start()  # the server is not there yet
    runs = _ranks(f"unix:{sock}", tmp_path, "killed", 2)
    _train(runs, range(0, 150))
    for run in runs:
        run.finish()  # everything acknowledged by the relay, nothing by the server
        assert run.stats()["spool_files"] == 0 and run.stats()["batches_sent"] > 0
    agent.kill()
    snapshot = tmp_path / "snapshot"
    shutil.copytree(spool, snapshot)  # what the relay had acknowledged when it died
    assert len(os.listdir(snapshot)) > 0

    server = Server(str(tmp_path / "data"), port=port).start()
    agent = Agent(url, spool, sock=sock).start()  # the next relay replays the killed one's spool
    try:
        _stored_once(server, "killed", 2, 150)
        wait_until(lambda: agent.stats()["spooled_batches"] == 0, 30, what="spool empty")
        # A relay that crashed after the server stored its batches but before it deleted them
        # from its spool sends them all again: each is acknowledged, none stored twice.
        agent.stop()
        shutil.rmtree(spool)
        shutil.copytree(snapshot, spool)
        agent = Agent(url, spool, sock=sock).start()
        replayed = wait_until(lambda: (s := agent.stats())["spooled_batches"] == 0 and s, 30)
        assert replayed["forwarded"] > 0 and replayed["refused"] == 0, replayed
        _stored_once(server, "killed", 2, 150)
    finally:
        agent.stop()
        server.stop()


def test_the_relay_forwards_each_rank_with_its_own_token(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    meta = MetadataStore(f"sqlite:///{data}/metadata.db")
    tokens = {t: AccessStore(meta).create_token(t, "admin", name=t)[0] for t in ("acme", "bolt")}
    meta.close()
    server = Server(str(data), extra_args=("--auth", "required")).start()
    agent = Agent(server.url, tmp_path / "spool", port=free_port())
    with running(server, agent):  # both stopped, whatever fails
        agent.start()
        runs = {
            name: fleetlens.init(
                project="p",
                run_id=f"run-{name}",
                server=server.url,
                relay=agent.url,
                token=token,
                spool_dir=str(tmp_path / name),
                install_signal_handler=False,
                flush_interval=0.05,
            )
            for name, token in {**tokens, "bogus": "not-a-token"}.items()
        }
        for step in range(40):
            for run in runs.values():
                with run.step(step, tokens=10):
                    pass
            time.sleep(0.005)
        for run in runs.values():
            run.finish()
        stats = wait_until(lambda: (s := agent.stats())["spooled_batches"] == 0 and s, 30)
        # The bogus token's batches were refused by the server, alone; each tenant's run is
        # stored in its own tenant, never coalesced under another's token.
        assert stats["refused"] > 0 and stats["forwarded"] > 0, stats
        for name, token in tokens.items():
            wait_until(_steps_are(server, f"run-{name}", token, 40), 30)
            other = tokens["bolt" if name == "acme" else "acme"]
            assert server.request("GET", f"/v1/runs/run-{name}", token=other)[0] == 404
            assert _run_as(server, f"run-{name}", token)["tokensProcessed"] == 400


def _steps_are(server: Server, run_id: str, token: str, steps: int) -> Any:
    return lambda: _run_as(server, run_id, token).get("steps") == steps


def _run_as(server: Server, run_id: str, token: str) -> dict[str, Any]:
    status, doc = server.request("GET", f"/v1/runs/{run_id}", token=token)
    return doc if status == 200 and isinstance(doc, dict) else {}


def _post_frames(server: Server, frames: list[BatchFrame]) -> tuple[int, dict[str, Any]]:
    body = encode_frames(frames)
    status, answer, _ = server.post(body, BATCHES_CONTENT_TYPE, path="/v1/ingest/batches")
    return status, answer


def test_a_bad_batch_among_good_ones_is_refused_alone(server: Server) -> None:
    good = [step_batch("mixed", range(i, i + 1), 4, batch_id=f"g{i}")[1] for i in range(6)]
    bad_ctx = step_batch("no/slash", range(0, 1), 4)[1]  # decodes, but its run id is bad
    frames = [BatchFrame(body=b) for b in good[:3]]
    frames += [BatchFrame(body=bad_ctx), BatchFrame(body=b"\x92\x01\x02")]
    frames += [BatchFrame(body=b) for b in good[3:]]
    status, answer = _post_frames(server, frames)
    assert status == 200
    codes = [r["status"] for r in answer["results"]]
    assert codes == [200, 200, 200, 400, 400, 200, 200, 200], answer
    assert answer["results"][3]["field"] == "ctx.run_id", answer["results"][3]
    assert answer["results"][0]["rows"] == {"step": 4} and answer["flushS"] >= 0
    IngestBatchesOut.model_validate(answer)  # the fast path's answer is the documented one
    assert server.get("/v1/runs/mixed")["steps"] == 6
    # The whole request again (a relay that lost the answer): acknowledged, stored once.
    status, again = _post_frames(server, frames)
    assert [r["status"] for r in again["results"]] == codes
    ranks = server.get("/v1/runs/mixed/ranks?fromStep=0&toStep=10")["ranks"]
    assert {r["steps"] for r in ranks} == {6}
    assert server.get("/v1/runs/mixed")["tokensProcessed"] == 6 * 4 * 1000
    # Not an array of batches: the request is refused whole, naming what is wrong.
    status, refused = _post_frames(server, [])
    assert status == 400 and refused["field"] == "frames"
    not_frames = msgspec.msgpack.encode({"not": "frames"})
    status, refused, _ = server.post(not_frames, BATCHES_CONTENT_TYPE, path="/v1/ingest/batches")
    assert status == 400 and refused["field"] == "frames"
    doc = server.get("/openapi.json")
    assert BATCHES_CONTENT_TYPE in str(doc["paths"]["/v1/ingest/batches"]["post"])


def test_the_sdk_finds_a_relay_forwarding_to_its_server_and_only_that(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = "http://collector.example:8480"
    relay = Relay(
        RelayConfig(server=upstream, spool_dir=str(tmp_path / "s"), listen="127.0.0.1:0")
    ).start()
    try:
        assert relay.address is not None
        here = f"http://127.0.0.1:{relay.address[1]}"
        monkeypatch.setattr(route, "DEFAULT_URL", here)
        monkeypatch.setattr(route, "DEFAULT_SOCKET", str(tmp_path / "none.sock"))

        def cfg(**kw: Any) -> SDKConfig:
            return SDKConfig.resolve({"run_id": "r", **kw}, {})

        assert route.relay_for(cfg(server=upstream + "/")) == here
        assert route.relay_for(cfg(server="http://elsewhere:8480")) is None  # not its server
        assert route.relay_for(cfg(server=upstream, relay="off")) is None
        assert route.relay_for(cfg(relay="unix:/x.sock")) == "unix:/x.sock"
        with pytest.raises(fleetlens.errors.ConfigError, match="FLEETLENS_RELAY"):
            cfg(relay="ftp://x")
        assert SDKConfig.resolve({"run_id": "r"}, {"FLEETLENS_RELAY": here}).relay == here
        # Nobody there: a refused loopback connection, silent and not a wait for the timeout
        # (10 s here, so a busy machine's pause is not mistaken for one).
        t0 = time.perf_counter()
        assert route.probe(f"http://127.0.0.1:{free_port()}", timeout=10) is None
        assert route.probe(f"unix:{tmp_path / 'absent.sock'}", timeout=10) is None
        assert time.perf_counter() - t0 < 5
        # A rank's body that is not a batch is refused by the relay itself, never spooled.
        status, answer = relay.accept(b"\x92\x01\x02", {"content-type": "application/msgpack"})
        assert status == 400 and "not a batch" in answer["error"]
        assert relay.stats()["bad_batches"] == 1 and len(relay.spool) == 0
    finally:
        relay.stop(0.5)


def test_a_rank_goes_around_a_relay_it_cannot_reach(server: Server, tmp_path: Path) -> None:
    # The agent is down (restarting): its port refuses; the batches go to the server directly.
    gone = f"http://127.0.0.1:{free_port()}"
    run = fleetlens.init(
        project="p",
        run_id="around",
        server=server.url,
        relay=gone,
        spool_dir=str(tmp_path / "s"),
        install_signal_handler=False,
        flush_interval=0.05,
    )
    _train([run], range(0, 30))
    run.finish()
    stats = run.stats()
    assert stats["relay"] == gone and stats["send_failures"] == 0 and stats["spool_files"] == 0
    assert run._transport.direct > 0  # type: ignore[attr-defined]
    assert wait_until(lambda: _run(server, "around").get("steps") == 30, 30)


def test_a_full_relay_spool_evicts_less_important_batches_and_turns_the_rest_away(
    tmp_path: Path,
) -> None:
    # The server is away; the spool holds about three batches.
    body = step_batch("full", range(0, 1), 4)[1]
    relay = Relay(
        RelayConfig(
            server=f"http://127.0.0.1:{free_port()}",
            spool_dir=str(tmp_path / "s"),
            listen="",
            spool_max_bytes=3 * (len(body) + 64),
        )
    )
    try:

        def send(prio: int) -> int:
            headers = {"content-type": "application/msgpack", "x-fleetlens-priority": str(prio)}
            return relay.accept(body, headers)[0]

        assert [send(2) for _ in range(3)] == [200, 200, 200]
        assert send(2) == 503  # as important as all it holds: the rank keeps it, nothing lost
        assert send(1) == 200  # more important: the oldest P2 batch makes room, counted
        stats = relay.stats()
        assert stats["refused_full"] == 1 and stats["evicted_batches"] == 1, stats
        assert stats["evicted_records"] == 4 and stats["received"] == 4, stats
        assert stats["spooled_batches"] == 3 and stats["spool_bytes"] <= 3 * (len(body) + 64)
    finally:
        relay.stop(0.1)


def test_a_spool_file_that_is_not_a_relay_batch_is_set_aside(tmp_path: Path) -> None:
    spool = tmp_path / "s"
    relay = Relay(RelayConfig(server=f"http://127.0.0.1:{free_port()}", spool_dir=str(spool)))
    body = step_batch("aside", range(0, 1), 2)[1]
    assert relay.accept(body, {"content-type": "application/msgpack"})[0] == 200
    (spool / "p2-00000000000000000001-000000-1-junk.batch").write_bytes(b"not msgpack \xc1")
    os.chmod(spool / "p2-00000000000000000001-000000-1-junk.batch", 0o600)
    relay = Relay(relay.cfg)  # a restarted relay finds both
    relay.forward()  # the server is away: the good batch stays, the junk is quarantined
    stats = relay.stats()
    assert stats["unreadable"] == 1 and stats["quarantined"] == 1, stats
    assert stats["spooled_batches"] == 1 and stats["send_failures"] == 1, stats
    assert os.listdir(spool / "quarantine") == ["p2-00000000000000000001-000000-1-junk.batch"]


class _OlderServer(http.server.ThreadingHTTPServer):
    """A server from before ``/v1/ingest/batches``: that route answers 404, every other request
    goes to the real server behind it as it came."""

    daemon_threads = True

    def __init__(self, upstream: Server) -> None:
        self.upstream = upstream
        self.batch_posts = 0
        super().__init__(("127.0.0.1", 0), _OlderHandler)


class _OlderHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _OlderServer

    def log_message(self, *args: Any) -> None:
        pass

    def _relay(self, method: str) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/v1/ingest/batches"):
            self.server.batch_posts += 1
            status, headers, answer = (
                404,
                {"Content-Type": "application/json"},
                b'{"detail":"Not Found"}',
            )
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.server.upstream.port, timeout=30)
            keep = ("Content-Type", "Content-Encoding", "Authorization", "X-Fleetlens-Priority",
                    "X-Fleetlens-Sent-At", "X-Fleetlens-Flush-S")  # fmt: skip
            conn.request(method, self.path, body=body or None,
                         headers={k: v for k, v in self.headers.items() if k in keep})  # fmt: skip
            resp = conn.getresponse()
            status, answer = resp.status, resp.read()
            headers = {k: v for k, v in resp.getheaders() if k.lower() == "content-type"}
            conn.close()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self) -> None:
        self._relay("GET")

    def do_POST(self) -> None:
        self._relay("POST")


def test_a_relay_in_front_of_an_older_server_forwards_batch_by_batch(tmp_path: Path) -> None:
    server = Server(str(tmp_path / "data")).start()
    older = _OlderServer(server)
    threading.Thread(target=older.serve_forever, daemon=True).start()
    agent = Agent(f"http://127.0.0.1:{older.server_address[1]}", tmp_path / "spool",
                  port=free_port())  # fmt: skip
    try:
        with running(server, agent):  # both stopped, whatever fails
            agent.start()
            runs = _ranks(agent.url, tmp_path, "older", 2)
            _train(runs, range(0, 40))
            for run in runs:
                run.finish()
            # Batch by batch, in spool order: one rank's last batch may land after the other's.
            done = wait_until(lambda: (s := agent.stats())["spooled_batches"] == 0 and s, 30)
            _stored_once(server, "older", 2, 40)
            assert done["forwarded"] == done["received"] == done["forwarded_singly"], done
            assert done["refused"] == 0, done
            assert older.batch_posts == 1  # tried once, then batch by batch
    finally:
        older.shutdown()
        older.server_close()
