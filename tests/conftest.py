from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetlens.testing import InProcessServer, Server, postgres

# The tiers (pyproject's markers): every test carries one. `scripts/check --fast` runs the first
# two. A test that starts a process (a server, torchrun, PostgreSQL, Chromium) is e2e; a unit or
# api test that tries fails at once, so a tier cannot silently grow slow.
TIERS = ("unit", "api", "e2e")
_real_execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
_running: list[pytest.Item] = []  # the test being set up, run or torn down
_fixtures: list[str] = []  # the fixtures being set up, innermost last
_spawned_by: set[str] = set()  # tests and fixtures that started a process


def _execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any) -> Any:
    if _running:
        item = _running[-1]
        if item.get_closest_marker("e2e") is None:
            raise AssertionError(f"{item.nodeid} started a process ({args!r}): mark it e2e")
        _spawned_by.add(_fixtures[-1] if _fixtures else item.nodeid)
    return _real_execute_child(self, args, *rest)


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen._execute_child = _execute_child  # type: ignore[attr-defined]
    if not hasattr(config, "workerinput"):
        # The ranks the tests start spool under this session's own root (the workers inherit
        # it): a rank killed in an earlier session leaves a spool its run and rank would replay,
        # and the tests reuse run ids ("fin", "kill"): one session's batches must not reach the
        # next session's server.
        os.environ["FLEETLENS_SPOOL_ROOT"] = tempfile.mkdtemp(prefix="fleetlens-test-spool-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop("FLEETLENS_SPOOL_ROOT", ""), ignore_errors=True)


# The files that take longest (seconds of one lane, a full run of scripts/check on a 2-core
# machine; FLEETLENS_FILE_TIMES=FILE writes a run's). The full suite runs a file a worker
# (--dist loadfile --no-loadscope-reorder): these go first, so that the run does not end with one
# long file on one worker while the other has nothing left.
SLOWEST = json.loads((Path(__file__).with_name("file_times.json")).read_text())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    untiered = [i.nodeid for i in items if not any(i.get_closest_marker(t) for t in TIERS)]
    if untiered:
        raise pytest.UsageError(
            "tests without a tier marker (unit, api or e2e): " + ", ".join(untiered[:10])
        )
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda i: (-SLOWEST.get(i.nodeid.split("::")[0], 0.0), order[id(i)]))


_file_times: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::")[0]
    _file_times[path] = _file_times.get(path, 0.0) + report.duration


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _running.append(item)
    yield
    _running.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Iterator[None]:
    _fixtures.append(fixturedef.argname)
    yield
    _fixtures.pop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """``FLEETLENS_TIER_REPORT=FILE``: the e2e tests that started no process, neither themselves
    nor through a fixture they use (candidates for the api or unit tier).
    ``FLEETLENS_FILE_TIMES=FILE``: the seconds each file took (setup, call and teardown; in the
    controller under xdist), the slowest first, for :data:`SLOWEST`."""
    times = os.environ.get("FLEETLENS_FILE_TIMES")
    if times and _file_times and not hasattr(session.config, "workerinput"):
        slow = sorted(_file_times.items(), key=lambda kv: -kv[1])
        Path(times).write_text(json.dumps({k: round(v, 1) for k, v in slow if v >= 20}, indent=1))
    path = os.environ.get("FLEETLENS_TIER_REPORT")
    if not path:
        return
    idle = [
        i.nodeid
        for i in session.items
        if i.get_closest_marker("e2e")
        and i.nodeid not in _spawned_by
        and not _spawned_by & set(getattr(i, "fixturenames", ()))
    ]
    with open(path, "w") as fh:
        json.dump(idle, fh, indent=1)


@pytest.fixture(autouse=True, scope="module")
def _module_spool_root() -> Iterator[None]:
    """Each test file's ranks spool under a root of its own, below the session's. A rank's SDK
    adopts the spools that gone processes left beside its own for the same collector and token
    (fleetlens.sdk.orphans), and a server's loopback port may be reused by another file's: one
    file's killed ranks must not send their batches to the next file's server."""
    root = tempfile.mkdtemp(prefix="module-", dir=os.environ.get("FLEETLENS_SPOOL_ROOT"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLEETLENS_SPOOL_ROOT", root)
        yield


@pytest.fixture
def server(tmp_path) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    srv = Server(str(tmp_path / "data")).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def app(tmp_path) -> Iterator[InProcessServer]:  # type: ignore[no-untyped-def]
    """The server in this process (the api tier): what ``server`` answers, without a process."""
    with InProcessServer(str(tmp_path / "data")) as srv:
        yield srv


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    with postgres() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.e2e)])
def metadata_url(request, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """Each metadata test runs on both engines; PostgreSQL gets a fresh schema per test."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/meta.db"
    import sqlalchemy as sa

    schema = f"t_{abs(hash(str(tmp_path))) % 10**9}"
    pg_url: str = request.getfixturevalue("pg_url")  # started only for the PostgreSQL half
    engine = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {schema}"))
    engine.dispose()
    return pg_url.rsplit("/", 1)[0] + f"/{schema}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (the portal's tests)."""
    from playwright.sync_api import expect, sync_playwright

    from .test_portal import ARGS, CHROMIUM

    # An assertion on the page waits as long as a locator's action does (30 s), not 5 s: the
    # answer it waits for comes from a server sharing two cores with two other test files.
    expect.set_options(timeout=30_000)

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()
