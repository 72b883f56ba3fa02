"""The package's shape, as docs/architecture.md states it: small modules, and a repository that
reads nothing outside itself. (The import layers are checked by `lint-imports` in scripts/check.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500


def _python_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def _imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _python_files("fleetlens")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split by concept (CONVENTIONS.md): {long}"


def test_the_formatter_is_turned_off_only_for_data_tables() -> None:
    """``# fmt: skip`` packs code under the line ceiling instead of splitting it: allowed only on
    a module-level assignment (a table of constants aligned by hand)."""
    packed = []
    for p in _python_files("fleetlens"):
        src = p.read_text()
        if "# fmt: skip" not in src:
            continue
        data = {
            line
            for node in ast.parse(src).body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
        }
        packed += [
            f"{p.relative_to(ROOT)}:{i}"
            for i, text in enumerate(src.splitlines(), 1)
            if "# fmt: skip" in text and i not in data
        ]
    assert packed == [], packed


def test_the_package_and_the_benchmarks_never_import_tests() -> None:
    bad = {}
    for p in _python_files("fleetlens", "bench", "examples"):
        mods = sorted(m for m in _imported_modules(p) if m == "tests" or m.startswith("tests."))
        if mods:
            bad[str(p.relative_to(ROOT))] = mods
    assert not bad, bad


def test_what_a_benchmark_imports_from_the_shared_harness_exists() -> None:
    """The benchmarks run only in scripts/check's last stage (and mypy does not read them): a
    name a bench imports from ``bench/_*.py`` that is gone fails here, at once."""
    defined: dict[str, set[str]] = {}
    for p in (ROOT / "bench").glob("_*.py"):
        names: set[str] = set()
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        defined[p.stem] = names
    missing = [
        f"{p.name}: {node.module}.{a.name}"
        for p in _python_files("bench")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom)
        and node.module
        and (mod := node.module.removeprefix("bench.")) in defined
        for a in node.names
        if a.name not in defined[mod]
    ]
    assert missing == [], missing


def test_nothing_outside_the_checkout_is_read() -> None:
    """A clone with nothing beside it must pass: no test, bench or module reads ../shared."""
    bad = [
        str(p.relative_to(ROOT))
        for p in _python_files("fleetlens", "bench", "tests", "examples")
        if p.name != "test_layout.py" and ("../shared" in (t := p.read_text()) or "/work/" in t)
    ]
    assert not bad, bad
