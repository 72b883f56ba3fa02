"""``fleetlens.client.Client`` against a real server that requires tokens."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from fleetlens.client import (
    DEFAULT_SERVER,
    APIError,
    APINotFound,
    Client,
    resolve_server,
    resolve_token,
)
from fleetlens.config import ServerConfig
from fleetlens.errors import FleetlensError, NotFound, TransportError
from fleetlens.testing import Server

pytestmark = pytest.mark.e2e

RUN = "sim-straggler_persistent"  # rank 13 is 15% slow for the whole run


@dataclass
class Secured:
    server: Server
    viewer: str
    ingest: str


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    from fleetlens.sim.emit import HttpSink
    from fleetlens.sim.library import run_scenario
    from fleetlens.store.access import AccessStore
    from fleetlens.store.metadata import MetadataStore

    data = tmp_path_factory.mktemp("client") / "data"
    data.mkdir()
    access = AccessStore(
        MetadataStore(ServerConfig.resolve({"data_dir": str(data)}, {}).resolved_database_url)
    )
    access.create_token("acme", "admin")
    viewer, _ = access.create_token("acme", "viewer")
    ingest, _ = access.create_token("acme", "ingest")
    srv = Server(str(data), extra_args=("--auth", "required")).start()
    try:
        run_scenario("straggler_persistent", sink=HttpSink(srv.url, token=ingest))
        with Client(srv.url, viewer) as c:
            deadline = time.monotonic() + 60
            while not c.stragglers(RUN) and time.monotonic() < deadline:
                time.sleep(0.5)
        yield Secured(srv, viewer, ingest)
    finally:
        srv.stop()


def test_server_and_token_resolution_order() -> None:
    env = {"FLEETLENS_SERVER": "http://env:1/", "FLEETLENS_TOKEN": "from-env"}
    assert resolve_server("http://arg:2/", env) == "http://arg:2"
    assert resolve_server(None, env) == "http://env:1"
    assert resolve_server(None, {}) == DEFAULT_SERVER == "http://127.0.0.1:8480"
    assert resolve_token("from-arg", env) == "from-arg"
    assert resolve_token(None, env) == "from-env"
    assert resolve_token("", env) == ""  # explicitly none, whatever the environment says
    assert resolve_token(None, {}) == ""
    with Client(environ=env) as c:
        assert (c.server, c.token) == ("http://env:1", "from-env")


def test_the_token_decides_against_a_server_that_requires_one(secured: Secured) -> None:
    url = secured.server.url
    env = {"FLEETLENS_SERVER": url, "FLEETLENS_TOKEN": secured.viewer}
    with Client(environ=env) as c:  # both from the environment
        assert RUN in [r["runId"] for r in c.runs()]
    with Client(url, "flt_wrong", environ=env) as c:  # the argument wins over the environment
        with pytest.raises(APIError) as bad:
            c.runs()
        assert bad.value.status == 401 and "token is unknown or revoked" in bad.value.message
    with Client(url, "", environ=env) as c, pytest.raises(APIError) as none:
        c.runs()
    assert none.value.status == 401 and "requires a token" in none.value.message
    with Client(url, secured.ingest) as c, pytest.raises(APIError) as role:
        c.runs()
    assert role.value.status == 403 and "may not read" in str(role.value)


def test_404_carries_the_servers_message(secured: Secured) -> None:
    with Client(secured.server.url, secured.viewer) as c, pytest.raises(APINotFound) as err:
        c.run("no-such-run")
    assert isinstance(err.value, NotFound) and isinstance(err.value, FleetlensError)
    assert err.value.status == 404 and err.value.message == "run 'no-such-run' does not exist"
    assert "HTTP 404" in str(err.value) and "/v1/runs/no-such-run" in str(err.value)


def test_unreachable_server_is_a_transport_error() -> None:
    with Client("http://127.0.0.1:9", "") as c, pytest.raises(TransportError) as err:
        c.runs()
    assert "cannot reach the fleetlens server at http://127.0.0.1:9" in str(err.value)
    assert isinstance(err.value.__cause__, Exception)  # the httpx error, chained


def test_the_notebook_methods_answer_rows(secured: Secured) -> None:
    with Client(secured.server.url, secured.viewer) as c:
        run = c.run(RUN)
        assert run["runId"] == RUN and run["worldSize"] == 64
        ranks = c.ranks(RUN, limit=3)
        assert ranks[0]["rank"] == 13 and len(ranks) == 3
        (finding,) = c.stragglers(RUN)
        assert finding["ranks"] == [13] and finding["diagnosis"] == "straggler.persistent"
        assert any(f["ranks"] == [13] for f in c.diagnosis(RUN))
        assert c.goodput(RUN)["breakdown"]["lines"]
        assert all("kind" in item for item in c.timeline(RUN, from_step=0, to_step=run["step"]))
        loss = c.metrics(RUN, "loss", points=10)
        assert 1 <= len(loss) <= 10 and loss[0]["step"] == 0
        assert c.fleet_goodput()[0]["pool"]
        assert isinstance(c.alerts(run_id=RUN), list)
        doc = c.ranks(RUN, limit=2, as_="json")  # the server's whole document
        assert doc["runId"] == RUN and len(doc["ranks"]) == 2 and "fromStep" in doc


def test_rows_as_tables(secured: Secured) -> None:
    pa = pytest.importorskip("pyarrow")
    with Client(secured.server.url, secured.viewer) as c:
        table = c.ranks(RUN, as_="arrow")
        assert isinstance(table, pa.Table) and table.num_rows == 64
        assert table.column("rank").to_pylist()[0] == 13
        pd = pytest.importorskip("pandas")
        frame = c.metrics(RUN, "loss", points=5, as_="pandas")
        assert isinstance(frame, pd.DataFrame) and list(frame.columns)[:2] == ["step", "value"]
        with pytest.raises(FleetlensError, match="expected records, pandas, arrow or json"):
            c.runs(as_="excel")  # type: ignore[arg-type]


def test_compare_two_runs(secured: Secured) -> None:
    from fleetlens.sim.emit import HttpSink
    from fleetlens.sim.library import run_scenario

    run_scenario("thermal", sink=HttpSink(secured.server.url, token=secured.ingest))
    with Client(secured.server.url, secured.viewer) as c:
        out = c.compare(RUN, "sim-thermal")
    assert out["runs"] == [RUN, "sim-thermal"] and out["conclusions"] is not None


def test_importing_fleetlens_does_not_import_httpx() -> None:
    code = "import sys, fleetlens, fleetlens.client; sys.exit('httpx' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
