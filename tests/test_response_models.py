"""Every route documents the JSON it answers as a model of its own, in the app ``fleetlens serve``
runs: a client generated from ``/openapi.json`` gets typed answers, not free-form objects.

A route whose handler returns a bare ``dict`` is documented as ``{"type": "object"}`` (or
nothing at all): its keys can change with no test or client noticing. Here every operation's
successful JSON answer must be a named schema (a ``$ref`` into ``components``, or a list of
them), and that schema must refuse keys it does not declare, so a key a service grows fails the
contract tests until it is declared.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetlens.testing import InProcessServer

pytestmark = pytest.mark.api


def _named(schema: dict[str, Any]) -> str | None:
    """The component a response schema names (directly or as a list's items), else None."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if schema.get("type") == "array" and "$ref" in schema.get("items", {}):
        return str(schema["items"]["$ref"]).rsplit("/", 1)[-1]
    return None


def _answers(doc: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(method, path, status, schema) of every successful JSON answer in the document."""
    out = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, resp in op.get("responses", {}).items():
                if not status.startswith("2") or status == "204":
                    continue
                content = resp.get("content") or {"application/json": {}}
                if "application/json" in content:
                    schema = content["application/json"].get("schema", {})
                    out.append((method.upper(), path, status, schema))
    return out


def test_every_route_answers_a_declared_model(app: InProcessServer) -> None:
    doc = app.get("/openapi.json")
    answers = _answers(doc)
    assert len(answers) >= 85, "the document lost routes"
    bare = [f"{m} {p} ({s}): {schema}" for m, p, s, schema in answers if _named(schema) is None]
    assert not bare, "routes without a response model:\n" + "\n".join(bare)


def test_every_response_model_refuses_undeclared_keys(app: InProcessServer) -> None:
    doc = app.get("/openapi.json")
    components = doc["components"]["schemas"]
    open_ = set()
    for _m, _p, _s, schema in _answers(doc):
        name = _named(schema)
        if name is not None and components[name].get("additionalProperties") is not False:
            open_.add(name)
    assert not open_, f"response models that accept any key: {sorted(open_)}"
