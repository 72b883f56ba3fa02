"""``fleetlens incidents`` and ``fleetlens failure-window RUN [--window ID --table T]``."""

from __future__ import annotations

import argparse
import re
import time
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ._common import client, client_opts, decode
from ._output import Table, fmt, print_json

if TYPE_CHECKING:
    from ..api.incident_models import IncidentOut

__all__ = ["add_parsers", "cmd_failure_window", "cmd_incidents", "parse_since"]

TABLES = ("steps", "scalars", "collectives", "events", "gpu_samples", "node_samples")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str | None, now: float | None = None) -> float | None:
    """``--since``: a UNIX time (``1718000000``) or an age (``90s``, ``30m``, ``2h``, ``7d``)."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if m is None:
        raise ConfigError(f"--since {text!r}: give a UNIX time or an age such as 30m, 2h or 7d")
    value, unit = float(m.group(1)), m.group(2)
    if not unit:
        return value
    return (time.time() if now is None else now) - value * _UNITS[unit]


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))


def _age(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.0f}{unit}"
    return f"{s:.0f}s"


def _where(e: IncidentOut) -> str:
    parts = []
    if e.nodes:
        parts.append("nodes " + ",".join(e.nodes[:4]) + ("..." if len(e.nodes) > 4 else ""))
    if e.ranks:
        parts.append("ranks " + ",".join(map(str, e.ranks[:8])))
    return " ".join(parts) or "-"


def cmd_incidents(args: argparse.Namespace) -> int:
    from ..api.incident_models import IncidentListOut

    with client(args) as c:
        doc = c.incidents(
            state=args.state,
            since=parse_since(args.since),
            run_id=args.run,
            limit=args.limit,
            offset=args.offset,
            as_="json",
        )
    if args.json:
        print_json(doc)
        return 0
    data = decode(IncidentListOut, doc)
    t = Table(
        ("WHEN", "<21"),
        ("STATE", "<9"),
        ("AGE", ">5"),
        ("SEVERITY", "<8"),
        ("RUN", "<24"),
        ("DIAGNOSIS", "<16"),
        ("OWNER", "<14"),
        ("ALERTS", "<28"),
        ("WHERE", ""),
    )
    print(t.header())
    for e in data.incidents:
        alerts = ",".join(f"{a.alertname}:{a.state}" for a in e.alerts[:2]) or "-"
        cells = (_when(e.time), e.state, _age(e.age_s), e.severity, e.run_id)
        print(t.row(*cells, e.diagnosis, e.owner, alerts, _where(e)))
    if not data.incidents:
        print("(no incidents)")
    else:
        print("failure page of a run: /runs/RUN/failure; its windows: fleetlens failure-window RUN")
    return 0


def _print_windows(doc: dict[str, Any]) -> None:
    from ..api.incident_models import PreservedListOut

    got = decode(PreservedListOut, doc)
    windows = got.windows
    print(f"run {got.run_id}: {len(windows)} preserved failure window(s)")
    for w in windows:
        a, f = w.alert, w.failure
        why = f"{a.alertname} ({a.severity}, {a.state})" if a is not None else "alert gone"
        if f is not None:
            why += f": {f.diagnosis} (owner {f.owner}) {f.summary}"
        print(f"\nwindow {w.id}  failure at {_when(w.failure_at)}  {why}")
        state = "complete" if w.complete else f"copied until {_when(w.copied_until)}"
        nodes = ",".join(w.nodes) or "the run's nodes"
        print(f"  from {_when(w.start)} to {_when(w.to)} ({state}); node samples of {nodes}")
        print("  kept: " + ", ".join(f"{k} {n}" for k, n in w.kept.items()))
    if windows:
        print(
            f"\nrows: fleetlens failure-window {got.run_id} --window ID --table "
            f"{'|'.join(got.tables)}"
        )


def _cell(v: Any) -> str:
    """Times (UNIX seconds) to the millisecond, other floats to 6 significant digits."""
    if isinstance(v, float):
        return fmt(v, ".3f" if abs(v) >= 1e8 else ".6g")
    return fmt(v)


def _print_rows(doc: dict[str, Any]) -> None:
    from ..api.incident_models import PreservedRowsOut

    got = decode(PreservedRowsOut, doc)
    rows = got.rows
    end = got.offset + len(rows)
    print(
        f"window {got.window_id} of run {got.run_id}: {got.table} rows "
        f"{got.offset + 1 if rows else 0}-{end} of {got.total}"
    )
    if not rows:
        return
    cols = [k for k in rows[0] if k not in ("project", "run_id")]
    cells = [[_cell(r.get(k)) for k in cols] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(cols)]
    t = Table(*((k, f"<{min(w, 40)}") for k, w in zip(cols, widths, strict=True)))
    print(t.header())
    for c in cells:
        print(t.row(*c))
    if end < got.total:
        print(f"(more: --offset {end})")


def cmd_failure_window(args: argparse.Namespace) -> int:
    with client(args) as c:
        if args.window is None:
            doc = c.preserved(args.run, limit=args.limit, offset=args.offset)
        else:
            doc = c.preserved_rows(
                args.run, args.window, args.table, limit=args.limit, offset=args.offset, as_="json"
            )
    if args.json:
        print_json(doc)
    elif args.window is None:
        _print_windows(doc)
    else:
        _print_rows(doc)
    return 0


def add_parsers(sub: Any) -> None:
    """Add ``incidents`` and ``failure-window`` to the CLI's subparsers."""
    sp = sub.add_parser(
        "incidents", help="incidents, newest first: failures and alerts per run, with diagnosis"
    )
    sp.add_argument("--state", choices=("open", "closed", "unalerted"))
    sp.add_argument("--since", help="a UNIX time, or an age: 30m, 2h, 7d")
    sp.add_argument("--run", help="one run's incidents")
    sp.add_argument("--limit", type=int, default=50)
    sp.add_argument("--offset", type=int, default=0)
    client_opts(sp)
    sp.set_defaults(func=cmd_incidents)
    fw = sub.add_parser(
        "failure-window",
        help="a run's preserved failure windows (T-10..T+10 min), or one window's rows",
    )
    fw.add_argument("run")
    fw.add_argument("--window", type=int, help="a window's id: print its rows of --table")
    fw.add_argument("--table", choices=TABLES, default="steps")
    fw.add_argument("--limit", type=int, help="windows (default 20) or rows (default 1000)")
    fw.add_argument("--offset", type=int, default=0)
    client_opts(fw)
    fw.set_defaults(func=cmd_failure_window)
