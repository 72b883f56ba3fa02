"""Tenant scoping of the telemetry reads, added by the reader (fleetlens/store/reader.py).

Two tenants send a run of the same name: ``acme`` a 4-rank job ``acme-job`` of 20 steps,
``bolt`` a 16-rank job ``bolt-job`` of 100 steps with a slow rank. Every read route of the run,
asked as acme, must show acme's job only. A statement names no tenant (the reader filters every
tenant table it reads, subqueries and unions included), and no telemetry statement is written
outside the store: a scan of the package checks both.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetlens.errors import StoreError
from fleetlens.store.access import AccessStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.reader import TenantReader
from fleetlens.testing.batches import step_batch
from fleetlens.testing.inprocess import InProcessServer
from fleetlens.testing.waits import wait_until

ROOT = Path(__file__).resolve().parents[1]
RUN = "shared-name"


@pytest.fixture(scope="module")
def two_tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessServer, str]]:
    data = tmp_path_factory.mktemp("tenants") / "data"
    data.mkdir()
    meta = MetadataStore(f"sqlite:///{data}/metadata.db")
    access = AccessStore(meta)
    access.create_token("acme", "admin", name="admin")
    acme, _ = access.create_token("acme", "editor", name="acme")
    bolt, _ = access.create_token("bolt", "editor", name="bolt")
    meta.close()
    with InProcessServer(str(data), settings={"auth": "required"}) as app:
        for token, job, steps, ranks, slow in (
            (acme, "acme-job", range(20), 4, None),
            (bolt, "bolt-job", range(100), 16, {9: 3.0}),
        ):
            _, body = step_batch(RUN, steps, ranks, job_id=job, slow=slow, tokens=777)
            status, answer, _ = app.post(body, token=token)
            assert status == 200, answer
        wait_until(
            lambda: (
                app.get(f"/v1/runs/{RUN}", acme).get("step") == 19
                and app.get(f"/v1/runs/{RUN}", bolt).get("step") == 99
            ),
            what="both tenants' steps stored",
        )
        yield app, acme


def _leaks(value: Any, path: str = "") -> Iterator[str]:
    """Where an answer shows the other tenant's job: its name, a rank of 4 or more, a step of 20
    or more."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k in ("rank", "slowestRank") and isinstance(v, int) and v >= 4:
                yield f"{path}.{k} = {v}"
            if k in ("step", "lastStep", "endStep") and isinstance(v, int) and v >= 20:
                yield f"{path}.{k} = {v}"
            yield from _leaks(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaks(v, f"{path}[{i}]")
    elif isinstance(value, str) and "bolt" in value:
        yield f"{path} = {value[:80]!r}"


@pytest.mark.api
def test_every_read_of_a_run_shows_the_callers_tenant_only(
    two_tenants: tuple[InProcessServer, str],
) -> None:
    app, acme = two_tenants
    summary = app.get(f"/v1/runs/{RUN}", acme)
    assert (summary["step"], summary["worldSize"]) == (19, 4), summary
    paths = app.get("/openapi.json")["paths"]
    asked, leaks = [], []
    for template, ops in sorted(paths.items()):
        params = {p["name"] for p in ops.get("get", {}).get("parameters", []) if p["in"] == "path"}
        if "get" not in ops or not params or not params <= {"run_id", "rank"}:
            continue
        path = template.replace("{run_id}", RUN).replace("{rank}", "0")
        status, body = app.request("GET", path, token=acme)
        assert status in (200, 404), (path, status, body)
        asked.append(path)
        leaks += [f"{path}: {leak}" for leak in _leaks(body)]
    assert len(asked) >= 10, asked  # the run's summary, goodput, series, ranks, findings, ...
    assert leaks == [], leaks
    runs = app.get("/v1/runs", acme)["runs"]
    assert [r["runId"] for r in runs] == [RUN]
    assert "bolt" not in json.dumps(runs)


@pytest.mark.api
def test_a_table_made_after_the_first_read_is_filtered_too(
    two_tenants: tuple[InProcessServer, str],
) -> None:
    """The reader learns the tenant tables from the store, again when a statement names one it
    has not seen (the evaluation examples' table is made when its service starts)."""
    app, _ = two_tenants
    store = app._client.app.state.services.telemetry  # the server's own store (one per process)
    acme = TenantReader(store, "acme")
    assert acme.rows("SELECT max(step) AS s FROM {db}.steps") == [{"s": 19}]
    store.command(
        f"CREATE TABLE {store.database}.later (tenant String, v Int64)"
        " ENGINE = MergeTree ORDER BY tenant"
    )
    store.command(f"INSERT INTO {store.database}.later VALUES ('acme', 1), ('bolt', 2)")
    assert acme.rows("SELECT v FROM {db}.later") == [{"v": 1}]
    assert TenantReader(store, "bolt").rows("SELECT sum(v) AS s FROM {db}.later") == [{"s": 2}]


@pytest.mark.unit
def test_a_statement_that_names_the_tenant_is_refused() -> None:
    """The reader's filter is the only tenant predicate: a statement comparing or binding the
    tenant itself is refused before it runs."""
    reader = TenantReader(_Unused(), "acme")  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="tenant"):
        reader.table("SELECT 1 FROM {db}.steps WHERE tenant = {tenant:String}")
    with pytest.raises(StoreError, match="tenant"):
        reader.table("SELECT 1 FROM {db}.steps", tenant="bolt")


class _Unused:
    """A telemetry store that must never be queried."""

    database = "db"

    def query(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        raise AssertionError(f"queried: {sql}")


SQL = re.compile(r"^\s*(SELECT|INSERT INTO|WITH \w+ AS|ALTER TABLE|OPTIMIZE TABLE)\b|\{db\}")


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            yield node.lineno, text


@pytest.mark.unit
def test_telemetry_statements_live_in_the_store_and_never_name_the_tenant() -> None:
    outside, hand_written = [], []
    for p in sorted((ROOT / "fleetlens").rglob("*.py")):
        rel = p.relative_to(ROOT)
        for line, text in _strings(ast.parse(p.read_text())):
            if SQL.search(text) and rel.parts[1] != "store":
                outside.append(f"{rel}:{line}: {text[:60]!r}")
            if re.search(r"tenant\s*=\s*\{tenant", text):
                hand_written.append(f"{rel}:{line}")
    assert outside == [], outside
    assert hand_written == [], hand_written
