"""``fleetlens stragglers RUN`` and ``fleetlens diagnose RUN``: the findings of a run."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import client, client_opts, decode
from ._output import Table, fmt, print_json
from .captures import evidence_lines

__all__ = ["add_parsers", "cmd_diagnose", "cmd_stragglers"]


def cmd_stragglers(args: argparse.Namespace) -> int:
    from ..api.models import StragglersOut

    with client(args) as c:
        doc = c.stragglers(args.run, as_="json")
    if args.json:
        print_json(doc)
        return 0
    data = decode(StragglersOut, doc)
    rows = data.stragglers
    if not rows:
        print(f"run {data.run_id}: no stragglers found")
        return 0
    t = Table(
        ("DIAGNOSIS", "<24"),
        ("RANKS", "<16"),
        ("NODES", "<24"),
        ("FROM", ">7"),
        ("TO", ">7"),
        ("CONF", ">5"),
    )
    print(t.header())
    for r in rows:
        ranks = ",".join(map(str, r.ranks[:4])) + ("..." if len(r.ranks) > 4 else "")
        nodes = ",".join(r.nodes[:2]) + ("..." if len(r.nodes) > 2 else "")
        conf = fmt(r.confidence, ".2f")
        print(t.row(r.diagnosis, ranks, nodes, r.start_step, r.end_step, conf))
        print(f"  {r.summary}")
    return 0


_PRICED = ("stage_imbalance", "batch_imbalance")
"""Findings besides stragglers that the what-if prices."""


def cmd_diagnose(args: argparse.Namespace) -> int:
    from ..api.models import DiagnosisOut, StragglerWhatIfOut

    with client(args) as c:
        doc = c.diagnosis(args.run, as_="json")
        data = None if args.json else decode(DiagnosisOut, doc)
        # the what-if prices the slow workers and uneven stages (asked only when there is one)
        priced = data is not None and any(
            r.kind == "straggler" or r.diagnosis in _PRICED for r in data.findings
        )
        w = decode(StragglerWhatIfOut, c.straggler_whatif(args.run)) if priced else None
    if data is None:
        print_json(doc)
        return 0
    if not data.findings:
        print(f"run {data.run_id}: nothing to diagnose")
        return 0
    saved = {f.key: f for f in w.findings} if w is not None else {}
    for r in data.findings:
        print(
            f"step {fmt(r.step):>8}  {r.diagnosis:<22} owner {r.owner:<15} "
            f"confidence {fmt(r.confidence, '.2f')}"
        )
        print(f"  {r.summary}")
        captured = [e for e in r.evidence if e.get("signal") == "trace_capture"]
        for e in [e for e in r.evidence if e.get("signal") != "trace_capture"][:4]:
            v = e.get("value")
            base = f" (baseline {fmt(e['baseline'], '.4g')})" if e.get("baseline") else ""
            shown = fmt(v, ".4g") if isinstance(v, (int, float)) else str(v)
            print(f"    {e.get('metric') or e.get('signal')}: {shown}{base}")
        for e in captured:  # the lagging rank and its peer, profiled (fleetlens.torch.capture)
            print("\n".join(evidence_lines(e, "    ")))
        if (f := saved.get(r.key)) is not None and w is not None:
            print(
                f"    what-if, fixed: {fmt(f.saved_seconds, ',.1f')} s of steps "
                f"{w.from_step}-{w.to_step} ({fmt(f.share, '.1%')}), "
                f"{fmt(f.speedup, '.1%')} faster"
            )
    return 0


def cmd_whatif(args: argparse.Namespace) -> int:
    from ..api.models import StragglerWhatIfOut

    with client(args) as c:
        doc = c.straggler_whatif(args.run, args.from_step, args.to_step)
    if args.json:
        print_json(doc)
        return 0
    w = decode(StragglerWhatIfOut, doc)
    print(
        f"run {w.run_id} attempt {w.job_id}, steps {w.from_step}-{w.to_step} "
        f"({w.steps} steps, {fmt(w.wall_seconds, ',.0f')} s)"
    )
    print(
        f"  with everything at its peers' median: {fmt(w.saved_seconds, ',.1f')} s shorter, "
        f"S = {fmt(w.slowdown, '.1%')} (the job ran that much longer)"
    )
    for kind, saved in sorted(w.by_type.items(), key=lambda kv: -kv[1]):
        share = saved / w.wall_seconds if w.wall_seconds else 0.0
        print(f"    {kind:<9} alone: {fmt(saved, ',.1f')} s ({fmt(share, '.1%')})")
    for f in w.findings:
        print(
            f"  {f.diagnosis:<24} ranks {_ranks(f.ranks)}: "
            f"{fmt(f.saved_seconds, ',.1f')} s ({fmt(f.share, '.1%')}), "
            f"{fmt(f.speedup, '.1%')} faster fixed"
        )
    return 0


def cmd_regression(args: argparse.Namespace) -> int:
    """The run against the earlier runs of its workload: each tier, its baseline, the change."""
    from ..api.regression_models import RegressionOut

    with client(args) as c:
        doc = c.get(f"/v1/runs/{args.run}/regression")
    if args.json:
        print_json(doc)
        return 0
    got = decode(RegressionOut, doc)
    if got.workload is None:
        print(
            f"run {args.run}: its config names no model (model, model_id, n_params, n_layers, "
            "d_model): it has no workload, so no baseline to be judged against"
        )
        return 0
    f = got.figures
    if f is None:
        print(f"run {args.run}: fewer than 30 steps in its newest attempt; nothing to judge yet")
        return 0
    sw = ", ".join(f"{k} {v}" for k, v in f.software.items()) or "-"
    print(f"run {args.run}: workload {got.workload}, software {sw}")
    if not got.verdicts:
        print(
            "  no baseline: fewer than 2 earlier runs of this workload (or architecture, or "
            "pool), with 30 steps or more, on the software it followed"
        )
    for v in got.verdicts:
        said = "WORSE" if v.worse else "ok"
        unit = {"mfu": ("%", 100.0), "scaling": ("", 1.0)}.get(v.tier, (" s", 1.0))
        shown = [f"{fmt(x * unit[1], '.3g')}{unit[0]}" for x in (v.value, v.baseline, v.bound)]
        what = "allocation(s)" if v.tier == "allocation" else "run(s)"
        print(
            f"  {v.tier:<10} {shown[0]} against {shown[1]} ({fmt(v.ratio, '.2f')}x; "
            f"bound {shown[2]}) over {len(v.runs)} {what}: {said}"
        )
        if v.changes:
            print(f"           changed: {', '.join(v.changes)}")
    return 0


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks[:8])) + ("..." if len(ranks) > 8 else "")


def add_parsers(sub: Any) -> None:
    """Add ``stragglers``, ``diagnose``, ``whatif`` and ``regression`` to the CLI's subparsers."""
    s = sub.add_parser("stragglers", help="a run's slow ranks, classified, with their GPUs")
    s.add_argument("run")
    client_opts(s)
    s.set_defaults(func=cmd_stragglers)
    d = sub.add_parser("diagnose", help="a run's root causes with evidence, confidence, owner")
    d.add_argument("run")
    client_opts(d)
    d.set_defaults(func=cmd_diagnose)
    w = sub.add_parser(
        "whatif", help="how much faster a run would be with each worker, stage or type fixed"
    )
    w.add_argument("run")
    w.add_argument("--from-step", type=int, default=None, help="first step of the window")
    w.add_argument("--to-step", type=int, default=None, help="last step of the window")
    client_opts(w)
    w.set_defaults(func=cmd_whatif)
    r = sub.add_parser(
        "regression",
        help="a run against the fleet's baselines (step time, MFU, scaling, startup, recovery, "
        "checkpoints, allocation)",
    )
    r.add_argument("run")
    client_opts(r)
    r.set_defaults(func=cmd_regression)
