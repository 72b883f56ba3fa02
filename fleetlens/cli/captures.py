"""``fleetlens traces capture RUN --rank R...``: ask a running job for a short profiler trace of
some ranks; ``fleetlens traces captures RUN``: a run's captures, the ranks side by side.

A job captures when it runs with ``FLEETLENS_TRACE_CAPTURE=1`` (``fleetlens.torch``); the server
also asks on its own when a rank lags (``fleetlens.services.captures``).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.parse
from typing import TYPE_CHECKING, Any

from ..errors import FleetlensError
from ._common import client, client_opts, decode
from ._output import Table, fmt, print_json

if TYPE_CHECKING:
    from ..api.capture_models import CapturedRankOut, CaptureEvidenceOut, CaptureOut

__all__ = ["add_parsers", "cmd_capture", "cmd_captures", "evidence_lines", "side_by_side"]

_LINES = (
    ("step ms", "step_ms"),
    ("compute ms", "compute_ms"),
    ("exposed comm ms", "exposed_comm_ms"),
    ("idle ms", "idle_ms"),
    ("memcpy ms", "memcpy_ms"),
    ("kernels", "kernels"),
    ("collectives", "collectives"),
)


def _evidence(ev: dict[str, Any]) -> CaptureEvidenceOut:
    from ..api.capture_models import CaptureEvidenceOut

    return decode(CaptureEvidenceOut, ev)


def _heaviest_kernel(r: CapturedRankOut) -> str:
    top = r.top_kernels
    return f"{top[0].name[:40]} {fmt(top[0].total_ms, '.1f')}" if top else "-"


def _heaviest_collective(r: CapturedRankOut) -> str:
    top = r.top_collectives
    return f"{top[0].op[:40]} {fmt(top[0].total_ms, '.1f')}" if top else "-"


def _span(ev: CaptureEvidenceOut) -> str:
    return f"steps {ev.from_step}-{ev.to_step}" if ev.from_step is not None else "no steps"


def side_by_side(c: CaptureOut) -> list[str]:
    """A capture as lines of text: what asked it, then one column per rank."""
    ev = _evidence(c.evidence)
    out = [f"capture {c.capture_id} ({c.state}, {_span(ev)}): {c.reason}"]
    if c.message:
        out.append(f"  {c.message}")
    return out + rank_table(ev, "  ")


def evidence_lines(item: dict[str, Any], indent: str) -> list[str]:
    """A finding's ``trace_capture`` evidence item as ``fleetlens diagnose`` prints it."""
    ev = _evidence(item)
    head = f"{indent}trace capture {ev.capture_id} ({ev.state}, {_span(ev)}):"
    return [head, *rank_table(ev, indent + "  ")]


def rank_table(ev: CaptureEvidenceOut, indent: str) -> list[str]:
    """The captured ranks in columns, a line of the step's time in each row."""
    ranks = ev.ranks
    rows: list[list[str]] = []
    for label, key in _LINES:
        cells = [label]
        for r in ranks:
            if r.missing:
                cells.append("not in")
            elif key == "idle_ms" and r.host_only:
                cells.append("host only")
            else:
                v = getattr(r, key)
                cells.append(fmt(v, ".1f") if key.endswith("_ms") else fmt(v))
        rows.append(cells)
    rows.append(["heaviest kernel", *(_heaviest_kernel(r) for r in ranks)])
    rows.append(["heaviest coll.", *(_heaviest_collective(r) for r in ranks)])
    head = ["", *(f"rank {r.rank} ({r.role})" for r in ranks)]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    t = Table(
        ("", f"<{widths[0]}"),
        *((h, f">{w}") for h, w in zip(head[1:], widths[1:], strict=True)),
        indent=indent,
    )
    return [t.header(), *(t.row(*row) for row in rows)]


def cmd_captures(args: argparse.Namespace) -> int:
    from ..api.capture_models import CapturesOut

    run = urllib.parse.quote(args.run, safe="")
    with client(args) as c:
        doc = c.get(f"/v1/runs/{run}/traces/captures")
    if args.json:
        print_json(doc)
        return 0
    captures = decode(CapturesOut, doc).captures
    if not captures:
        raise FleetlensError(
            f"run {args.run} has no trace capture (start the job with FLEETLENS_TRACE_CAPTURE=1; "
            f"ask one with fleetlens traces capture {args.run} --rank R)"
        )
    for i, cap in enumerate(captures):
        if i:
            print()
        print("\n".join(side_by_side(cap)))
    return 0


def cmd_capture(args: argparse.Namespace) -> int:
    from ..api.capture_models import CaptureOut

    run = urllib.parse.quote(args.run, safe="")
    with client(args) as c:
        doc = c.post(f"/v1/runs/{run}/traces/captures", {"ranks": args.rank, "steps": args.steps})
        cap = decode(CaptureOut, doc)
        print(
            f"capture {cap.capture_id} asked of ranks {cap.ranks} from step {cap.from_step}",
            file=sys.stderr,
        )
        deadline = time.monotonic() + args.wait
        while cap.state in ("requested", "partial") and time.monotonic() < deadline:
            time.sleep(1.0)
            doc = c.get(f"/v1/runs/{run}/traces/captures/{cap.capture_id}")
            cap = decode(CaptureOut, doc)
    if args.json:
        print_json(doc)
    else:
        print("\n".join(side_by_side(cap)))
    if args.wait and cap.state != "done":
        raise FleetlensError(
            f"capture {cap.capture_id} is {cap.state} after {args.wait:.0f} s: "
            f"{cap.message or 'the ranks have not sent their traces yet'}"
        )
    return 0


def add_parsers(tsub: Any) -> None:
    """``traces capture`` and ``traces captures`` under ``fleetlens traces``."""
    cap = tsub.add_parser(
        "capture", help="ask a running job for a short profiler trace of some ranks"
    )
    cap.add_argument("run", help="run id")
    cap.add_argument(
        "--rank",
        type=int,
        action="append",
        required=True,
        help="a rank to profile; repeat it (the first is compared with the others)",
    )
    cap.add_argument("--steps", type=int, default=3, help="steps to profile (default 3)")
    cap.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for the traces and print them side by side (fails if not all in)",
    )
    client_opts(cap)
    cap.set_defaults(func=cmd_capture)
    caps = tsub.add_parser("captures", help="a run's trace captures, the ranks side by side")
    caps.add_argument("run", help="run id")
    client_opts(caps)
    caps.set_defaults(func=cmd_captures)
