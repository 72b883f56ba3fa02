"""The training-side SDK, end to end against a real loopback HTTP collector."""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest

import fleetlens
from fleetlens.errors import ConfigError
from fleetlens.schema import DTYPES, KINDS
from fleetlens.sdk import NullRun, SDKConfig
from fleetlens.sdk.spool import Spool
from fleetlens.sdk.transport import Cadence
from fleetlens.wire import Batch, DictColumn, TableBuilder, encode_batch

pytestmark = pytest.mark.unit

# -- a real collector on loopback ------------------------------------------------------------


class Collector:
    """ThreadingHTTPServer that records each POST and answers what it is told to."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answers: list[tuple[int, dict[str, str]]] = []  # consumed first, then `default`
        self.default: tuple[int, dict[str, str]] = (200, {})
        self.poisoned: set[str] = set()  # batch ids answered 500, every time
        self.delay = 0.0  # seconds each answer takes: a slow server
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.port = port
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with collector.lock:
                    status, headers = (
                        collector.answers.pop(0) if collector.answers else collector.default
                    )
                    if self.headers.get("X-Fleetlens-Batch-Id") in collector.poisoned:
                        status, headers = 500, {}
                    collector.requests.append(
                        {
                            "t": time.monotonic(),
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": body,
                            "status": status,
                        }
                    )
                time.sleep(collector.delay)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def acked(self) -> list[Batch]:
        with self.lock:
            reqs = [r for r in self.requests if r["status"] in (200, 201, 202)]
        return [decode(r["body"], r["headers"]) for r in reqs]


def decode(body: bytes, headers: dict[str, str]) -> Batch:
    if headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return msgspec.msgpack.decode(body, type=Batch)


def column(kind: str, value: Any, name: str) -> list[Any]:
    if isinstance(value, DictColumn):
        codes = array("I", value.codes) if isinstance(value.codes, bytes) else value.codes
        return [value.dict[c] for c in codes]
    if isinstance(value, bytes):
        return array(DTYPES[KINDS[kind].by_name[name].dtype][0], value).tolist()
    return list(value)


def rows(batches: list[Batch], kind: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in batches:
        table = b.tables.get(kind)
        if table is None:
            continue
        cols = {name: column(kind, v, name) for name, v in table.cols.items()}
        out.extend({k: cols[k][i] for k in cols} for i in range(table.n))
    return out


def events(batches: list[Batch], kind: str | None = None) -> list[dict[str, Any]]:
    evs = rows(batches, "event")
    for e in evs:
        e["attrs"] = json.loads(e["attrs"])
    return [e for e in evs if kind is None or e["kind"] == kind]


def wait_for(pred: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


_ENV_PREFIXES = ("FLEETLENS_", "SLURM_", "TORCHELASTIC_")
_ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES:
            monkeypatch.delenv(name)


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.stop()


def closed_port() -> int:
    c = Collector()
    port = c.port
    c.stop()
    return port


def make_run(tmp_path: Path, server: str, **kw: Any) -> fleetlens.Run:
    opts: dict[str, Any] = {
        "project": "llm",
        "run_id": "r1",
        "tenant": "acme",
        "server": server,
        "spool_dir": str(tmp_path / "spool"),
        "flush_interval": 0.02,
        "backoff_base": 0.05,
        "backoff_max": 0.2,
        "exit_flush_timeout": 3.0,
        "install_signal_handler": False,
        "memory_s": 0,  # the tests that want the memory samples ask for them
    }
    opts.update(kw)
    return fleetlens.init(**opts)


# -- public surface and configuration ---------------------------------------------------------


def test_public_api_is_pinned() -> None:
    assert fleetlens.__all__ == [
        "Client",
        "FleetlensError",
        "Run",
        "SDKConfig",
        "__version__",
        "callbacks",
        "init",
    ]
    assert fleetlens.__version__ == "0.1.0"
    assert issubclass(ConfigError, fleetlens.FleetlensError)


def test_torchrun_environment() -> None:
    env = {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "TORCHELASTIC_RUN_ID": "elastic-7",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    cfg = SDKConfig.resolve({}, env)
    assert (cfg.rank, cfg.local_rank, cfg.world_size, cfg.gpu) == (3, 1, 8, 1)
    assert (cfg.run_id, cfg.job_id, cfg.launcher) == ("elastic-7", "elastic-7-a2", "torchrun")
    assert cfg.launcher_env["TORCHELASTIC_RUN_ID"] == "elastic-7"


def test_slurm_environment() -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "16",
        "SLURM_JOB_ID": "998877",
        "SLURM_RESTART_COUNT": "1",
        "SLURM_NODEID": "2",
    }
    cfg = SDKConfig.resolve({}, env)
    assert (cfg.rank, cfg.local_rank, cfg.world_size, cfg.gpu) == (5, 1, 16, -1)
    moved = SDKConfig.resolve({}, {**env, "FLEETLENS_SPOOL_ROOT": "/var/spool/fl"})
    assert moved.spool_dir == os.path.join("/var/spool/fl", "998877-5")  # each rank its own
    assert (cfg.run_id, cfg.job_id, cfg.launcher) == ("998877", "998877-a1", "slurm")
    # One spool root per user: another user can neither read it nor plant batches in it.
    assert cfg.spool_dir.endswith(os.path.join(f"fleetlens-spool-{os.geteuid()}", "998877-5"))


def test_seconds_settings_from_the_environment_and_a_clear_error_for_a_bad_one() -> None:
    env = {"FLEETLENS_RUN_ID": "r", "FLEETLENS_EXIT_FLUSH_S": "60", "FLEETLENS_HEARTBEAT_S": "0"}
    cfg = SDKConfig.resolve({}, env)
    assert (cfg.exit_flush_timeout, cfg.heartbeat_s, cfg.memory_s) == (60.0, 0.0, 5.0)
    assert SDKConfig.resolve({"exit_flush_timeout": 2.0}, env).exit_flush_timeout == 2.0
    with pytest.raises(ConfigError, match="FLEETLENS_EXIT_FLUSH_S='soon' is not a number"):
        SDKConfig.resolve({}, {**env, "FLEETLENS_EXIT_FLUSH_S": "soon"})
    with pytest.raises(ConfigError, match=r"exit_flush_timeout=-1\.0 must be >= 0"):
        SDKConfig.resolve({}, {**env, "FLEETLENS_EXIT_FLUSH_S": "-1"})


def test_precedence_explicit_then_fleetlens_env_then_launcher_then_default() -> None:
    env = {
        "FLEETLENS_RUN_ID": "from-env",
        "FLEETLENS_PROJECT": "env-project",
        "FLEETLENS_SERVER": "http://collector:9000",
        "FLEETLENS_JOB_ID": "job-env",
        "TORCHELASTIC_RUN_ID": "elastic",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "FLEETLENS_GPU": "7",
    }
    cfg = SDKConfig.resolve({"project": "arg-project", "run_id": None}, env)
    assert (cfg.run_id, cfg.project, cfg.server) == (
        "from-env",
        "arg-project",
        "http://collector:9000",
    )
    assert (cfg.job_id, cfg.gpu, cfg.tenant) == ("job-env", 7, "default")
    assert SDKConfig.resolve({"run_id": "arg", "rank": 0}, env).run_id == "arg"
    assert SDKConfig.resolve({"run_id": "arg", "rank": 0}, env).rank == 0
    # torchrun's placeholder run id is not an id; Slurm's job id is used instead
    cfg = SDKConfig.resolve({}, {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "42"})
    assert (cfg.run_id, cfg.job_id) == ("42", "42-a0")
    generated = SDKConfig.resolve({}, {})
    assert generated.run_id.startswith("run-") and generated.world_size == 1


@pytest.mark.parametrize(
    ("env", "must_name"),
    [
        ({"WORLD_SIZE": "abc", "RANK": "0"}, ["WORLD_SIZE", "'abc'"]),
        ({"WORLD_SIZE": "8", "RANK": "8"}, ["RANK=8", "WORLD_SIZE=8"]),
        ({"SLURM_NTASKS": "4", "SLURM_PROCID": "-1"}, ["SLURM_PROCID=-1", ">= 0"]),
        ({"FLEETLENS_SPOOL_MAX_BYTES": "lots"}, ["FLEETLENS_SPOOL_MAX_BYTES", "'lots'"]),
        ({"FLEETLENS_DISABLED": "maybe"}, ["FLEETLENS_DISABLED", "'maybe'"]),
        ({"FLEETLENS_SERVER": "collector:8480"}, ["collector:8480", "http"]),
        ({"FLEETLENS_SERVER": "http://"}, ["'http://'", "FLEETLENS_SERVER"]),
    ],
)
def test_bad_settings_raise_config_error_from_init(
    env: dict[str, str], must_name: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as info:
        fleetlens.init(project="p")
    for text in must_name:
        assert text in str(info.value)


def test_unknown_setting_is_refused() -> None:
    with pytest.raises(ConfigError, match="flush_intervall"):
        fleetlens.init(flush_intervall=1.0)


def test_disabled_run_does_nothing_and_starts_no_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = threading.active_count()
    for run in (
        fleetlens.init(enabled=False, spool_dir=str(tmp_path / "s")),
        (monkeypatch.setenv("FLEETLENS_DISABLED", "1"), fleetlens.init())[1],
    ):
        assert isinstance(run, NullRun)
        with run.step(1, tokens=5), run.phase("forward"):
            run.log(1, loss=1.0)
        run.event("config_change", step=1, key="lr")
        run.collective(step=1, seq=0, op="all_reduce", enter=0.0, exit=1.0)
        with run.checkpoint(1, path="x"):
            pass

        @run.step()
        def train() -> int:
            return 3

        assert train() == 3
        assert run.flush() is True
        run.finish()
    assert threading.active_count() == before
    assert not (tmp_path / "s").exists()


# -- records on the wire ------------------------------------------------------------------------


def test_scalars_keep_each_step_its_names_and_values_as_float_reads_them(
    tmp_path: Path, collector: Collector
) -> None:
    import numpy as np

    run = make_run(tmp_path, collector.url, rank=3, world_size=4)
    logged = [
        (0, {"loss": 2.0, "lr": 1e-3}),
        (1, {"loss": 1.5, "lr": 1e-3}),
        (2, {"lr": 5e-4, "loss": 1.25, "grad_norm": np.float32(0.5)}),  # other names, order
        (3, {"loss": "1.0", "tokens_seen": 7}),  # a numeric string and an int
        (4, {"loss": 0.75}),
    ]
    for step, values in logged:
        run.log(step, **values)
    assert run.flush(5.0) is True
    run.finish()
    got = sorted(
        (r["step"], r["name"], r["value"], r["rank"]) for r in rows(collector.acked(), "scalar")
    )
    want = sorted((s, k, float(v), 3) for s, values in logged for k, v in values.items())
    assert got == want and run.stats()["encode_errors"] == 0


def test_steps_phases_scalars_events_and_collectives_arrive(
    tmp_path: Path, collector: Collector
) -> None:
    run = make_run(
        tmp_path, collector.url, experiment_id="exp", config={"lr": 3e-4, "layers": 2}, rank=0
    )
    with run.step(10, tokens=4096):
        with run.phase("data"):
            time.sleep(0.002)
        with run.phase("forward"):
            pass
        with run.phase("data"):
            time.sleep(0.002)
    run.log(10, loss=1.9, lr=3e-4, grad_norm=0.8)
    run.event("config_change", step=10, message="lr 3e-4 -> 1e-4", key="lr", old=3e-4, new=1e-4)
    run.collective(step=10, seq=4, op="all_reduce", group="dp", enter=100.0, exit=100.5, bytes=64)
    assert run.flush(5.0) is True
    run.finish()
    batches = collector.acked()
    assert all(r["path"] == "/v1/ingest" for r in collector.requests)
    assert all(r["headers"]["Content-Type"] == "application/msgpack" for r in collector.requests)
    assert {b.batch_id for b in batches} == {
        r["headers"]["X-Fleetlens-Batch-Id"] for r in collector.requests
    }
    ctx = {"tenant": "acme", "project": "llm", "experiment_id": "exp", "run_id": "r1"}
    assert all(b.ctx == {**ctx, "job_id": "r1-a0"} for b in batches)

    (step,) = rows(batches, "step")
    assert (step["step"], step["rank"], step["tokens"]) == (10, 0, 4096)
    assert step["data_wait"] >= 0.004 and step["duration"] >= step["data_wait"]
    assert 0 <= step["forward"] < step["data_wait"]
    assert math.isnan(step["backward"]) and math.isnan(step["comm"])
    assert abs(step["time"] - time.time()) < 60

    scalars = {r["name"]: r["value"] for r in rows(batches, "scalar")}
    assert scalars == {"loss": 1.9, "lr": 3e-4, "grad_norm": 0.8}

    (change,) = events(batches, "config_change")
    assert change["step"] == 10 and change["message"] == "lr 3e-4 -> 1e-4"
    assert change["attrs"] == {"key": "lr", "old": 3e-4, "new": 1e-4}

    (coll,) = rows(batches, "collective")
    assert coll == {
        "step": 10,
        "rank": 0,
        "seq": 4,
        "op": "all_reduce",
        "group": "dp",
        "enter": 100.0,
        "exit": 100.5,
        "bytes": 64,
    }
    (placement,) = rows(batches, "placement")
    assert (placement["rank"], placement["world_size"]) == (0, 1)
    (start,) = events(batches, "job_start")
    assert start["attrs"]["config"] == {"lr": 3e-4, "layers": 2}
    assert start["attrs"]["pid"] == os.getpid() and start["attrs"]["world_size"] == 1
    assert [e["step"] for e in events(batches, "first_step")] == [10]
    assert len(events(batches, "finish")) == 1


def test_checkpoint_context_manager_call_and_error(tmp_path: Path, collector: Collector) -> None:
    run = make_run(tmp_path, collector.url)
    with run.checkpoint(100, path="s3://b/ckpt-100", size_bytes=2048):
        time.sleep(0.01)
    with pytest.raises(OSError, match="disk full"), run.checkpoint(200, path="s3://b/ckpt-200"):
        raise OSError("disk full")
    run.checkpoint(300, path="s3://b/ckpt-300", size_bytes=10, duration_s=4.5, sync=False)
    run.finish()
    batches = collector.acked()
    begins = events(batches, "checkpoint_begin")
    ends = {e["step"]: e["attrs"] for e in events(batches, "checkpoint_end")}
    assert [b["step"] for b in begins] == [100, 200]
    assert ends[100]["ok"] is True and ends[100]["duration_s"] >= 0.01
    assert ends[100]["size_bytes"] == 2048 and ends[100]["path"] == "s3://b/ckpt-100"
    assert ends[200]["ok"] is False and ends[200]["error"] == "OSError"
    assert ends[300] == {
        "path": "s3://b/ckpt-300",
        "sync": False,
        "size_bytes": 10,
        "duration_s": 4.5,
        "ok": True,
    }


def test_exception_in_step_is_reraised_untouched_and_reported(
    tmp_path: Path, collector: Collector
) -> None:
    run = make_run(tmp_path, collector.url)
    boom = RuntimeError("CUDA error: an illegal memory access")
    with pytest.raises(RuntimeError) as info, run.step(7):
        raise boom
    assert info.value is boom
    run.finish()
    batches = collector.acked()
    (exc,) = events(batches, "exception")
    assert exc["step"] == 7 and "illegal memory access" in exc["message"]
    assert exc["attrs"]["type"] == "RuntimeError" and "raise boom" in exc["attrs"]["traceback"]
    assert [s["step"] for s in rows(batches, "step")] == [7]
    # One request per flush: the failure travels with the step it broke, not a request of its own
    p0 = [b for b in batches if any(e["kind"] == "exception" for e in events([b]))]
    assert len(p0) == 1 and {"event", "step"} <= set(p0[0].tables)


def test_decorators_and_bad_values_never_raise(tmp_path: Path, collector: Collector) -> None:
    run = make_run(tmp_path, collector.url)

    @run.phase("backward")
    def backward() -> str:
        return "ok"

    @run.step(5)
    def train_step() -> str:
        return backward()

    assert [train_step(), train_step()] == ["ok", "ok"]
    run.log("not-a-step", loss=object())  # type: ignore[arg-type]
    run.log(7, loss=2.5)
    run.event("something_new", step=1, detail=object())
    run.finish()
    batches = collector.acked()
    steps = rows(batches, "step")
    assert [s["step"] for s in steps] == [5, 6]
    assert all(s["backward"] >= 0 for s in steps)
    assert [(r["step"], r["value"]) for r in rows(batches, "scalar")] == [(7, 2.5)]
    (custom,) = events(batches, "custom")
    assert (
        custom["attrs"]["custom_kind"] == "something_new" and "object" in custom["attrs"]["detail"]
    )
    assert run.stats()["encode_errors"] == 1


# -- failure modes of the collector -------------------------------------------------------------


def test_collector_down_bounded_memory_exact_drops_and_cheap_calls(tmp_path: Path) -> None:
    run = make_run(
        tmp_path,
        f"http://127.0.0.1:{closed_port()}",
        buffer_caps=(10, 10, 5, 5),
        flush_interval=60.0,  # the exporter never drains during the loop: drops are exact
        exit_flush_timeout=2.0,
    )
    for i in range(100):
        with run.step(i):
            pass
        run.log(i, **{f"s{k}": float(k) for k in range(10)})
    stats = run.stats()
    # P1 holds placement, job_start and first_step, then 7 steps; P2 holds 5 log calls
    assert stats["dropped_by_priority"] == {"P0": 0, "P1": 93, "P2": 950, "P3": 0}
    assert stats["buffered_entries"] == 15
    started = time.monotonic()
    run.finish()
    assert time.monotonic() - started < 2.0 + 10.0  # bounded by exit_flush_timeout, not hung
    stats = run.stats()
    # everything buffered is spooled, in one batch: the SDK sends one request per flush
    assert stats["exporter_alive"] is False and stats["spool_files"] == 1
    assert stats["records"] == 3 + 7 + 50
    assert stats["dropped_by_priority"]["P1"] == 94  # the finish event met a full P1 buffer too


def test_spooled_batches_are_replayed_once_when_collector_returns(tmp_path: Path) -> None:
    collector = Collector()
    port = collector.port
    collector.stop()
    run = make_run(tmp_path, f"http://127.0.0.1:{port}")
    for i in range(20):
        with run.step(i):
            pass
        run.log(i, loss=float(i))
        if i == 9:
            assert run.flush(0.5) is False  # one flush, one batch: two batches spooled
    assert run.flush(2.0) is False
    spooled = run.stats()["spooled_batches"]
    assert spooled >= 2 and list((tmp_path / "spool").glob("*.batch"))
    back = Collector(port)
    try:
        wait_for(lambda: run.stats()["spool_files"] == 0)
        assert run.flush(2.0) is True
        run.finish()
        ids = [r["headers"]["X-Fleetlens-Batch-Id"] for r in back.requests]
        assert len(ids) == len(set(ids))
        batches = back.acked()
        assert sorted(s["step"] for s in rows(batches, "step")) == list(range(20))
        assert sorted(r["value"] for r in rows(batches, "scalar")) == [float(i) for i in range(20)]
        assert run.stats()["replayed_batches"] == spooled
        assert not list((tmp_path / "spool").glob("*.batch"))
    finally:
        back.stop()


def test_an_unwritable_spool_keeps_the_outage_in_memory_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The spool's directory cannot be made (its parent is a file: what a full or read-only
    # disk does to every write). The outage's batches were lost (85% of the steps of an
    # outage with a read-only spool); they are held in memory and replayed.
    (tmp_path / "blocked").write_text("a file, not a directory")
    collector = Collector()
    port = collector.port
    collector.stop()
    with caplog.at_level(logging.WARNING, logger="fleetlens.sdk.spool"):
        run = make_run(
            tmp_path, f"http://127.0.0.1:{port}", spool_dir=str(tmp_path / "blocked" / "spool")
        )
        for i in range(200):
            with run.step(i):
                pass
            run.log(i, loss=float(i))
            if i % 20 == 19:
                run.flush(0.05)
        assert run.flush(1.0) is False
    stats = run.stats()
    assert stats["spool_in_memory_batches"] >= 5 and stats["dropped"] == 0, stats
    assert "NotADirectoryError" in stats["spool_unwritable"]
    warned = [r for r in caplog.records if "cannot be written" in r.getMessage()]
    assert len(warned) == 1 and "blocked" in warned[0].getMessage()
    back = Collector(port)
    try:
        wait_for(lambda: run.stats()["spool_files"] == 0)
        assert run.flush(2.0) is True
        run.finish()
        batches = back.acked()
        assert sorted(s["step"] for s in rows(batches, "step")) == list(range(200))
        assert sorted(r["value"] for r in rows(batches, "scalar")) == [float(i) for i in range(200)]
    finally:
        back.stop()


def test_the_memory_held_for_an_unwritable_spool_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "blocked").write_text("")
    spool = Spool(str(tmp_path / "blocked" / "s"), 1 << 20, memory_max_bytes=10_000)
    for i in range(30):  # 30 batches of 1,000 bytes, P2, then one P0 when memory is full
        assert spool.put(2, f"b{i}", bytes(1000), 10) is (i < 10)
    assert spool.put(0, "urgent", bytes(1000), 5)  # evicts the oldest P2 held
    assert len(spool) == 10 and spool.dropped[2] == 21 * 10 and spool.memory_batches == 11
    got = spool.oldest()
    assert got is not None and got[0].batch_id == "b1" and len(got[1]) == 1000
    # The relay acknowledges what it spools: memory is not durable, so it gets the error.
    with pytest.raises(OSError):
        Spool(str(tmp_path / "blocked" / "r"), 1 << 20, fsync=True).put(0, "x", b"x", 1)


def test_retry_after_is_honoured(tmp_path: Path, collector: Collector) -> None:
    collector.answers = [(429, {"Retry-After": "1"})]
    run = make_run(tmp_path, collector.url)
    run.log(1, loss=1.0)
    wait_for(lambda: len(collector.acked()) >= 1, timeout=5.0)
    run.finish()
    first, second = collector.requests[0], collector.requests[1]
    assert first["status"] == 429 and second["status"] == 200
    assert second["t"] - first["t"] >= 0.95
    assert second["body"] == first["body"]  # the spooled bytes, same batch id
    assert run.stats()["send_failures"] == 1


def test_a_sender_states_how_often_it_really_sends() -> None:
    cadence = Cadence()
    assert cadence.stated(0.2, now=10.0) == "0.200"  # the first request: its interval
    cadence.worked(0.5)  # a slow answer: waiting 0.2 s, it sends every 0.7 s
    assert cadence.stated(0.2, now=10.7) == "0.700"
    assert cadence.stated(0.2, now=10.75) == "0.050"  # a second request in the same cycle
    cadence.worked(0.1)
    assert cadence.stated(0.2, now=100.0) == "0.300"  # nothing to send for a while: not slower


def test_against_a_slow_server_the_stated_interval_counts_the_wait_for_its_answers(
    tmp_path: Path, collector: Collector
) -> None:
    # The server counts its senders from what they state; a sender waiting 0.1 s and then 0.3 s
    # for each answer sends every 0.4 s and must say so, or it is counted as a quarter sender.
    collector.delay = 0.3
    run = make_run(tmp_path, collector.url, flush_interval=0.1)
    for step in range(1000):
        run.log(step, loss=1.0)
        if len(collector.requests) >= 5:
            break
        time.sleep(0.01)
    run.finish()
    stated = [float(r["headers"]["X-Fleetlens-Flush-S"]) for r in collector.requests]
    assert len(stated) >= 5 and stated[0] == pytest.approx(0.1)
    assert min(stated[1:4]) >= 0.4, stated


def test_bad_request_is_dropped_counted_and_not_retried(
    tmp_path: Path, collector: Collector
) -> None:
    collector.default = (400, {})
    run = make_run(tmp_path, collector.url)
    run.log(1, loss=1.0)
    run.flush(2.0)
    run.finish()
    time.sleep(0.1)
    ids = [r["headers"]["X-Fleetlens-Batch-Id"] for r in collector.requests]
    assert ids and len(ids) == len(set(ids))
    stats = run.stats()
    assert stats["rejected_batches"] == len(ids) and stats["send_failures"] == 0
    assert stats["spool_files"] == 0


def test_server_errors_are_retried_until_delivered(tmp_path: Path, collector: Collector) -> None:
    collector.answers = [(500, {}), (502, {})]
    run = make_run(tmp_path, collector.url)
    run.log(3, loss=0.5)
    wait_for(lambda: rows(collector.acked(), "scalar"))
    run.finish()
    assert [r["value"] for r in rows(collector.acked(), "scalar")] == [0.5]
    assert run.stats()["send_failures"] >= 2


def test_spool_cap_evicts_lower_priorities_first(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "s"), max_bytes=1000)
    body = b"x" * 300
    assert spool.put(3, "b3", body, records=30)
    assert spool.put(2, "b2", body, records=20)
    assert spool.put(1, "b1", body, records=10)
    assert spool.put(0, "b0a", body, records=1)  # evicts P3
    assert spool.dropped == [0, 0, 0, 30]
    assert spool.put(1, "b1b", body, records=10)  # evicts P2
    assert spool.dropped == [0, 0, 20, 30]
    assert not spool.put(1, "b1c", body, records=10)  # nothing below P1 left: the new one goes
    assert spool.dropped == [0, 10, 20, 30]
    assert spool.put(0, "b0b", body, records=1)  # evicts the oldest P1
    assert spool.dropped == [0, 20, 20, 30]
    names = sorted(p.name.split("-")[-1] for p in (tmp_path / "s").iterdir())
    assert names == ["b0a.batch", "b0b.batch", "b1b.batch"]
    assert spool.total_bytes == 900
    assert spool.put(0, "b0c", body, records=1)  # the last P1 goes
    assert spool.dropped == [0, 30, 20, 30]
    assert not spool.put(0, "b0d", body, records=1)  # only a spool full of P0 drops P0
    assert spool.dropped == [1, 30, 20, 30] and spool.total_bytes == 900
    assert Spool(str(tmp_path / "s"), max_bytes=1000).oldest() is not None  # reopens from disk


def test_spool_left_by_a_killed_process_is_replayed(tmp_path: Path, collector: Collector) -> None:
    spool_dir = tmp_path / "spool"
    left = Spool(str(spool_dir), max_bytes=10_000_000)
    sent_ids = []
    for step in (1, 2):
        table = TableBuilder("scalar").add("step", [step]).add("name", ["loss"])
        table.add("time", [1.0]).add("value", [float(step)]).add("rank", [0])
        bid, body = encode_batch({"scalar": table.build()}, {"run_id": "old"}, compress=True)
        assert left.put(2, bid, body, records=1)
        sent_ids.append(bid)
    (spool_dir / "p2-00000000000000000009-000009-1-halfwritten.batch.tmp").write_bytes(b"\x00")
    run = make_run(tmp_path, collector.url, spool_dir=str(spool_dir))
    wait_for(lambda: run.stats()["replayed_batches"] == 2)
    run.finish()
    got = [r["headers"]["X-Fleetlens-Batch-Id"] for r in collector.requests]
    assert [i for i in got if i in sent_ids] == sent_ids  # oldest first, once each
    old = [b for b in collector.acked() if b.ctx == {"run_id": "old"}]
    assert [r["value"] for r in rows(old, "scalar")] == [1.0, 2.0]
    # No batch left, nor the half-written one: the finished run let go of its directory,
    # empty, and removed it (fleetlens.sdk.orphans).
    assert not spool_dir.exists()


def _spooled(spool: Spool, run_id: str, steps: range) -> list[str]:
    ids = []
    for step in steps:
        table = TableBuilder("scalar").add("step", [step]).add("name", ["loss"])
        table.add("time", [1.0]).add("value", [float(step)]).add("rank", [0])
        bid, body = encode_batch({"scalar": table.build()}, {"run_id": run_id}, compress=True)
        assert spool.put(2, bid, body, records=1)
        ids.append(bid)
    return ids


def test_a_batch_the_server_keeps_failing_is_quarantined_not_blocking(
    tmp_path: Path, collector: Collector
) -> None:
    # Issue 22 item 3: the oldest spooled batch answers 500 every time. Replay used to stop at it
    # for good, so the batches behind it (and every new one spooled meanwhile) never left.
    spool_dir = tmp_path / "spool"
    poisoned, *good = _spooled(Spool(str(spool_dir), max_bytes=10_000_000), "old", range(4))
    collector.poisoned.add(poisoned)
    run = make_run(tmp_path, collector.url, spool_dir=str(spool_dir))
    run.log(1, loss=0.25)
    wait_for(lambda: run.stats()["quarantined_batches"] == 1, timeout=10.0)
    wait_for(lambda: run.stats()["spool_files"] == 0)
    assert run.flush(3.0) is True
    run.finish()
    acked = [b.batch_id for b in collector.acked()]
    assert [i for i in acked if i in good] == good and poisoned not in acked
    assert [r["value"] for b in collector.acked() for r in rows([b], "scalar")].count(0.25) == 1
    tries = [r for r in collector.requests if r["headers"]["X-Fleetlens-Batch-Id"] == poisoned]
    assert len(tries) == 3  # _POISON_STRIKES, then moved aside
    (kept,) = (spool_dir / "quarantine").iterdir()
    assert kept.name.endswith(f"-{poisoned}.batch")
    assert run.stats()["quarantined_batches"] == 1 and run.stats()["replayed_batches"] >= 3


def test_a_server_failing_every_batch_quarantines_nothing(
    tmp_path: Path, collector: Collector
) -> None:
    # A 500 for everything is the server's fault, not a batch's: keep them all, in order.
    spool_dir = tmp_path / "spool"
    ids = _spooled(Spool(str(spool_dir), max_bytes=10_000_000), "old", range(3))
    collector.default = (500, {})
    run = make_run(tmp_path, collector.url, spool_dir=str(spool_dir))
    wait_for(lambda: len(collector.requests) >= 8, timeout=10.0)
    collector.default = (200, {})
    wait_for(lambda: run.stats()["spool_files"] == 0, timeout=10.0)
    run.finish()
    assert run.stats()["quarantined_batches"] == 0
    acked = [b.batch_id for b in collector.acked()]
    # Each once; the probe past a failure may deliver a batch before the one ahead of it.
    assert sorted(i for i in acked if i in ids) == sorted(ids)


def test_spool_is_private_and_ignores_files_it_did_not_write(tmp_path: Path) -> None:
    # Issue 22 item 10: the spool was 0755/0644 (the job's config readable by anyone on the
    # node), and a batch planted in it was replayed with the job's token.
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir(mode=0o777)
    os.chmod(spool_dir, 0o777)
    run = make_run(tmp_path, f"http://127.0.0.1:{closed_port()}", spool_dir=str(spool_dir))
    run.log(1, loss=1.0)
    run.finish()
    files = list(spool_dir.glob("*.batch"))
    assert files
    assert spool_dir.stat().st_mode & 0o777 == 0o700
    assert {f.stat().st_mode & 0o777 for f in files} == {0o600}
    # A planted batch: a symlink to a batch elsewhere, and (as root) another user's file.
    elsewhere = tmp_path / "planted"
    elsewhere.mkdir()
    (planted,) = _spooled(Spool(str(elsewhere), max_bytes=10_000_000), "evil", range(1))
    (src,) = elsewhere.glob("*.batch")
    (spool_dir / ("p0-00000000000000000001-000000-1-" + planted + ".batch")).symlink_to(src)
    foreign = 1
    if os.geteuid() == 0:
        other = spool_dir / src.name.replace(planted, "other")
        other.write_bytes(src.read_bytes())
        os.chown(other, 65534, 65534)
        foreign = 2
    reopened = Spool(str(spool_dir), max_bytes=10_000_000)
    assert len(reopened) == len(files) and reopened.foreign_files == foreign
    assert all(planted not in e.name for e in reopened._entries)
    if os.geteuid() == 0:  # a spool directory of another user is not used at all
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        _spooled(Spool(str(theirs), max_bytes=10_000_000), "x", range(1))
        os.chown(theirs, 65534, 65534)
        taken = Spool(str(theirs), max_bytes=10_000_000)
        assert len(taken) == 0 and taken.foreign_files == 1
        before = sorted(os.listdir(theirs))
        assert taken.put(0, "b", b"x", records=1)  # held in memory, not written there
        assert sorted(os.listdir(theirs)) == before and "belongs to uid 65534" in taken.unwritable
        with pytest.raises(OSError, match="belongs to uid 65534"):  # a relay's is refused
            Spool(str(theirs), max_bytes=10_000_000, fsync=True).put(0, "b", b"x", records=1)


def test_finish_flushes_stops_the_thread_and_is_idempotent(
    tmp_path: Path, collector: Collector
) -> None:
    run = make_run(tmp_path, collector.url, flush_interval=30.0)
    with run.step(1):
        pass
    run.finish(status="ok")
    run.finish(status="crashed")
    batches = collector.acked()
    assert len(events(batches, "finish")) == 1 and not events(batches, "failure")
    assert [s["step"] for s in rows(batches, "step")] == [1]
    assert run.stats()["exporter_alive"] is False
    assert not any(t.name == "fleetlens-exporter" and t.is_alive() for t in threading.enumerate())
    run.log(2, loss=1.0)  # after finish: still never raises
    failed = make_run(tmp_path / "b", collector.url)
    failed.finish(status="oom", message="CUDA OOM")
    (failure,) = events(collector.acked(), "failure")
    assert failure["attrs"] == {"status": "oom"} and failure["message"] == "CUDA OOM"


_SIGTERM_SCRIPT = """
import sys, time
import fleetlens
run = fleetlens.init(project="p", run_id="sig", server=sys.argv[1], spool_dir=sys.argv[2],
                     flush_interval=0.05)
with run.step(1):
    pass
run.flush(5.0)
print("ready", flush=True)
i = 2
while True:
    with run.step(i):
        time.sleep(0.01)
    i += 1
"""


@pytest.mark.e2e
def test_sigterm_delivers_a_signal_event_and_the_process_still_dies(
    tmp_path: Path, collector: Collector
) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SIGTERM_SCRIPT))
    root = str(Path(fleetlens.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.Popen(
        [sys.executable, str(script), collector.url, str(tmp_path / "spool")],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    (sig,) = events(collector.acked(), "signal")
    assert sig["attrs"] == {"signal": int(signal.SIGTERM)} and "SIGTERM" in sig["message"]


@pytest.mark.e2e
def test_import_is_light_reads_no_environment_and_starts_nothing(tmp_path: Path) -> None:
    code = (
        "import sys, threading, os\n"
        "os.environ['WORLD_SIZE'] = 'not-a-number'\n"
        "import fleetlens\n"
        "heavy = {'fastapi', 'uvicorn', 'chdb', 'numpy', 'torch', 'pyarrow', 'sqlalchemy'}\n"
        "print(sorted(heavy & set(sys.modules)), threading.active_count())\n"
    )
    root = str(Path(fleetlens.__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": root},
        check=True,
        cwd=tmp_path,
    )
    assert out.stdout.split() == ["[]", "1"]


def test_heartbeats_say_where_a_rank_is_while_no_step_ends(
    tmp_path: Path, collector: Collector
) -> None:
    """A rank stuck inside a step (a collective that never returns) still reports, every
    heartbeat_s, that it is alive and where it stopped: the server's hang rule depends on it."""
    run = make_run(tmp_path, collector.url, heartbeat_s=0.05)

    def beats() -> list[dict[str, Any]]:
        return rows(collector.acked(), "heartbeat")

    before = time.time()
    with run.step(7), run.phase("backward"):
        entered = time.time()
        # No step ends while we wait: the heartbeats come anyway.
        assert wait_for(lambda: [b for b in beats() if b["phase"] == "backward"])
    assert wait_for(lambda: [b for b in beats() if b["phase"] == "idle" and b["step"] == 7])
    with run.checkpoint(7, path=str(tmp_path / "ckpt")):  # a save that takes long
        assert wait_for(lambda: [b for b in beats() if b["phase"] == "checkpoint"])
    run.finish()
    assert {b["step"] for b in beats() if b["phase"] == "checkpoint"} == {7}
    inside = [b for b in beats() if b["phase"] == "backward"]
    assert {(b["rank"], b["step"]) for b in inside} == {(0, 7)}
    # Since the phase was entered (between the two clock reads, whatever a busy machine took).
    assert all(before - 0.01 <= b["since"] <= entered + 0.01 <= b["time"] + 0.01 for b in inside)
    # Not the user's records: none counted, none dropped, none left unsent.
    s = run.stats()
    assert s["records"] == s["records_sent"] and s["dropped"] == 0


def test_memory_is_sampled_every_memory_s_onto_the_step_the_rank_is_at(
    tmp_path: Path, collector: Collector
) -> None:
    """The exporter thread samples the process's memory (and the device's, where torch has
    initialised CUDA) as scalars of the step the training thread is at: memory over steps at no
    cost to the training loop. Nothing before the first step; never the user's records."""
    run = make_run(tmp_path, collector.url, memory_s=0.05)

    def samples() -> list[dict[str, Any]]:
        return [r for r in rows(collector.acked(), "scalar") if r["name"].startswith("host_")]

    run.flush()
    assert samples() == []  # no step yet: nothing to put it on
    with run.step(3):
        assert wait_for(lambda: {r["step"] for r in samples()} == {3})
    with run.step(4):
        assert wait_for(lambda: 4 in {r["step"] for r in samples()})
    run.finish()
    got = samples()
    assert {r["name"] for r in got} == {"host_used_bytes", "host_peak_bytes", "host_limit_bytes"}
    assert {r["rank"] for r in got} == {0}
    by = {(r["step"], r["name"]): r["value"] for r in got}
    assert 0 < by[(4, "host_used_bytes")] <= by[(4, "host_peak_bytes")]
    s = run.stats()
    assert s["records"] == s["records_sent"] and s["dropped"] == 0
