"""JSON has one owner: the API's response models make the camelCase keys, and the read models
below them return typed values (docs/architecture.md). Here the two ways back to the old shape
are counted per module against ``tests/data/json_edge.json``: camelCase string literals outside
``fleetlens/api/`` (a JSON key built, or read, by hand) and functions of ``fleetlens/services/``
and ``fleetlens/evaluation/`` that return ``dict[str, Any]``.

A module may not gain one. A module that loses some must say so in the file (its count is
lowered, to 0 and out of the file when none is left), so that the file is what is left to
convert. Formats that are camelCase by their own definition are exempt, named with the reason.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
COUNTS = ROOT / "tests" / "data" / "json_edge.json"
CAMEL = re.compile(r"^[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+$")  # waitPerStepS, flushS too

EXEMPT = {
    "fleetlens/api/": "the edge: the response models and the routes make the JSON",
    "fleetlens/importers/k8s.py": "reads the Kubernetes API's own JSON (creationTimestamp, ...)",
    "fleetlens/grafana.py": "writes Grafana's dashboard JSON (gridPos, fieldConfig, ...)",
    "fleetlens/agent/nvml.py": "NVML's function names",
    "fleetlens/agent/dcgm.py": "DCGM's field names",
    "fleetlens/store/migrations/": "a migration names the stored keys of its time it rewrites",
}


NAMES = {
    "generatorURL": "Alertmanager's own field (its v2 API spells URL in capitals)",
    "rougeL": "the rouge-score library's name of its ROUGE-L measure",
}
"""Names another system spells, wherever they appear."""


def _exempt(rel: str) -> bool:
    return any(rel.startswith(prefix) for prefix in EXEMPT)


def _camel_literals() -> dict[str, int]:
    out: dict[str, int] = {}
    for p in sorted((ROOT / "fleetlens").rglob("*.py")):
        rel = str(p.relative_to(ROOT))
        if _exempt(rel):
            continue
        n = sum(
            1
            for node in ast.walk(ast.parse(p.read_text(), filename=rel))
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and CAMEL.match(node.value)
            and node.value not in NAMES
        )
        if n:
            out[rel] = n
    return out


def _dict_returns() -> dict[str, int]:
    out: dict[str, int] = {}
    for d in ("services", "evaluation"):
        for p in sorted((ROOT / "fleetlens" / d).rglob("*.py")):
            rel = str(p.relative_to(ROOT))
            n = sum(
                1
                for node in ast.walk(ast.parse(p.read_text(), filename=rel))
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.returns is not None
                and "dict[str, Any]" in ast.unparse(node.returns)
            )
            if n:
                out[rel] = n
    return out


def _compare(what: str, found: dict[str, int], allowed: dict[str, int]) -> list[str]:
    worse = [
        f"{m}: {n} {what} (allowed {allowed.get(m, 0)}): make it typed in the module, the "
        "JSON in fleetlens/api/"
        for m, n in sorted(found.items())
        if n > allowed.get(m, 0)
    ]
    better = [
        f"{m}: {found.get(m, 0)} {what}, fewer than the {n} in {COUNTS.name}: lower it there"
        for m, n in sorted(allowed.items())
        if found.get(m, 0) < n
    ]
    return worse + better


def test_camel_case_keys_are_made_only_in_the_api() -> None:
    allowed = json.loads(COUNTS.read_text())["camel_case_literals"]
    assert _compare("camelCase literals", _camel_literals(), allowed) == []


def test_read_models_return_typed_values_not_dicts() -> None:
    allowed = json.loads(COUNTS.read_text())["dict_returns"]
    assert _compare("functions returning dict[str, Any]", _dict_returns(), allowed) == []


def test_the_counts_catch_a_new_key_and_a_new_dict_return() -> None:
    """The counters see what they are for (a test that cannot fail is a defect)."""
    src = 'from typing import Any\n\ndef f() -> dict[str, Any]:\n    return {"runId": 1}\n'
    tree = ast.parse(src)
    assert [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)] == ["runId", 1]
    assert CAMEL.match("runId") and not CAMEL.match("run_id") and not CAMEL.match("GPU")
    assert CAMEL.match("flushS") and CAMEL.match("waitPerStepS") and not CAMEL.match("nccl")
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assert fn.returns is not None and "dict[str, Any]" in ast.unparse(fn.returns)
    assert _compare("x", {"m.py": 2}, {"m.py": 1}) and _compare("x", {}, {"m.py": 1})
    assert _compare("x", {"m.py": 1}, {"m.py": 1}) == []
