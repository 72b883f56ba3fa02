"""How the CLI prints: one "-" formatter, one table printer, the server's JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = ["Table", "fmt", "pct", "print_json", "value"]


def fmt(v: Any, spec: str = "") -> str:
    """``v`` formatted with ``spec``; ``-`` for a missing value."""
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def pct(v: Any) -> str:
    """A share in [0, 1] as ``12.3%``; ``-`` when missing."""
    return "-" if v is None else f"{100.0 * float(v):.1f}%"


def value(v: Any) -> str:
    """A config or tag value: floats to 4 significant digits, the rest as they are."""
    return fmt(v, ".4g") if isinstance(v, float) else fmt(v)


def print_json(data: Any) -> None:
    """The server's JSON, indented (what ``--json`` prints)."""
    print(json.dumps(data, indent=2))


class Table:
    """Fixed-width columns: ``Table(("RUN", "<32"), ("STEP", ">9"))``; cells joined by a space.

    A cell is formatted with its column's spec (``"<32"``, ``">9"``, or ``""`` for a last,
    unpadded column); None prints as ``-``. Numbers that need a precision are formatted by the
    caller with :func:`fmt` first.
    """

    def __init__(self, *columns: tuple[str, str], indent: str = "") -> None:
        self.columns: Sequence[tuple[str, str]] = columns
        self.indent = indent

    def header(self) -> str:
        return self.row(*(name for name, _ in self.columns))

    def row(self, *cells: Any) -> str:
        return self.indent + " ".join(
            format(fmt(c), spec) for c, (_, spec) in zip(cells, self.columns, strict=True)
        )
