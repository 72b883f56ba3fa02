"""Every route the server documents is served by its handler, in the app ``fleetlens serve`` runs.

A router left out of the app, or included after a route that shadows it, is invisible to tests
that only call the routes they know. These read the server's own OpenAPI document and call every
path and method in it with an id that does not exist and an empty body: each must reach its
handler (a validation error, or the handler's own 404 that names the id), never the framework's
bare ``{"detail": "Not Found"}`` or a 405. A minimal set of paths per router must be documented,
so a router missing from the app fails here even though its paths vanish from the document too.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetlens.testing import InProcessServer

pytestmark = pytest.mark.api

# At least one path of every router, so that dropping any `include_router` fails the test.
EXPECTED = {
    "app (collector, health, metrics)": [
        ("POST", "/v1/ingest"),
        ("POST", "/v1/ingest/batches"),
        ("GET", "/healthz"),
        ("GET", "/metrics"),
    ],
    "graph": [
        ("GET", "/v1/runs/compare"),
        ("GET", "/v1/lineage/runs/{run_id}"),
        ("GET", "/v1/lineage/models/{model_id}/{version}"),
        ("POST", "/v1/runs/{run_id}/checkpoints"),
        ("POST", "/v1/models"),
        ("POST", "/v1/datasets"),
    ],
    "runs": [("GET", "/v1/runs"), ("GET", "/v1/runs/{run_id}"), ("GET", "/v1/runs/{run_id}/ranks")],
    "series": [("GET", "/v1/runs/{run_id}/metrics")],
    "findings": [("GET", "/v1/runs/{run_id}/stragglers"), ("GET", "/v1/runs/{run_id}/diagnosis")],
    "flight_recorder": [("POST", "/v1/runs/{run_id}/flight-recorder")],
    "scheduler": [
        ("POST", "/v1/scheduler/import"),
        ("GET", "/v1/scheduler/allocations"),
        ("GET", "/v1/scheduler/capacity"),
    ],
    "alerts": [("GET", "/v1/alerts"), ("POST", "/v1/alerts/{alert_id}/ack")],
    "incidents": [
        ("GET", "/v1/incidents"),
        ("GET", "/v1/runs/{run_id}/preserved"),
        ("GET", "/v1/runs/{run_id}/preserved/{window_id}"),
    ],
    "traces": [("GET", "/v1/runs/{run_id}/traces")],
    "goodput": [
        ("GET", "/v1/runs/{run_id}/goodput"),
        ("POST", "/v1/runs/{run_id}/whatif"),
        ("GET", "/v1/fleet/goodput"),
    ],
    "admin": [("GET", "/v1/tokens"), ("POST", "/v1/tokens"), ("GET", "/v1/audit")],
    "portal": [("GET", "/v1/runs/{run_id}/overview"), ("GET", "/v1/runs/{run_id}/failure")],
    "portal_fleet": [("GET", "/v1/portal/oncall"), ("GET", "/v1/portal/capacity")],
    "evaluations": [
        ("POST", "/v1/evaluations"),
        ("GET", "/v1/evaluations/{evaluation_id}"),
        ("POST", "/v1/eval-shards/lease"),
        ("POST", "/v1/gates"),
        ("POST", "/v1/evaluation-suites"),
        ("GET", "/v1/evaluation-suites/{ref}"),
        ("POST", "/v1/evaluation-triggers"),
    ],
    "remediation": [("GET", "/v1/remediations"), ("GET", "/v1/runs/{run_id}/control")],
}

# The portal's pages are not in the OpenAPI document (include_in_schema=False).
PAGES = ["/", "/oncall", "/capacity", "/ui/static/app.js"]

MISSING_ID, MISSING_INT = "no-such-id", 987654321
DEFAULT_404 = {"detail": "Not Found"}  # what the framework answers for a path no route matches


def _fill(path: str, params: list[dict[str, Any]]) -> tuple[str, str]:
    """The path with every path parameter set to an id that does not exist, and its query."""
    query = []
    for p in params:
        kind = p.get("schema", {}).get("type")
        value = str(MISSING_INT) if kind == "integer" else MISSING_ID
        if p["in"] == "path":
            path = path.replace("{" + p["name"] + "}", value)
        elif p["in"] == "query" and p.get("required"):
            query.append(f"{p['name']}={value}")
    return path, "?" + "&".join(query) if query else ""


def _problem(template: str, status: int, body: Any) -> str | None:
    """Why this answer did not come from the route's handler (None: it did)."""
    if status == 405:
        return "405: no route for this method"
    if status >= 500:
        return f"{status}: the handler failed on a minimal request: {body}"
    if status != 404:
        return None
    if body == DEFAULT_404:
        return "404 with the framework's default body: no route matched"
    if "{" not in template:
        return f"404 on a path without parameters (shadowed by another route?): {body}"
    message = str(body.get("error") or body.get("detail")) if isinstance(body, dict) else str(body)
    if MISSING_ID not in message and str(MISSING_INT) not in message:
        return f"404 that does not name the id it was asked for (another route's?): {body}"
    return None


def test_openapi_documents_every_routers_paths(app: InProcessServer) -> None:
    doc = app.get("/openapi.json")
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    missing = {
        router: [f"{m} {p}" for m, p in routes if (m, p) not in documented]
        for router, routes in EXPECTED.items()
    }
    assert {r: m for r, m in missing.items() if m} == {}, "routers missing from the app"
    # The premise of the next test: an unknown route gets the framework's default 404.
    assert app.request("GET", "/v1/no-such-route") == (404, DEFAULT_404)


def test_every_documented_route_is_answered_by_its_handler(app: InProcessServer) -> None:
    doc = app.get("/openapi.json")
    problems = []
    calls = 0
    for template, ops in doc["paths"].items():
        for method, op in ops.items():
            path, query = _fill(template, op.get("parameters", []))
            body = {} if method in ("post", "put", "patch") else None
            status, out = app.request(method.upper(), path + query, body)
            calls += 1
            why = _problem(template, status, out)
            if why:
                problems.append(f"{method.upper()} {path}{query}: {why}")
    assert calls >= sum(len(r) for r in EXPECTED.values())
    assert problems == [], "\n".join(problems)

    for page in PAGES:
        status, out = app.request("GET", page)
        assert status == 200 and isinstance(out, str) and out, (page, status, out)
    status, out = app.request("GET", f"/runs/{MISSING_ID}")
    assert _problem("/runs/{run_id}", status, out) is None, out
