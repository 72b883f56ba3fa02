"""``fleetlens runs``, ``fleetlens run show RUN``, ``fleetlens frontier PROJECT``,
``fleetlens memory RUN`` and ``fleetlens logs RUN``."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from ..client import WindowFigures
from ..schema import LOG_LEVELS
from ._common import client, client_opts, decode, query
from ._output import Table, fmt, print_json

if TYPE_CHECKING:
    from ..api.models import RunDetailOut

__all__ = ["add_parsers", "cmd_frontier", "cmd_logs", "cmd_memory", "cmd_run_show", "cmd_runs"]


def cmd_runs(args: argparse.Namespace) -> int:
    from ..api.models import RunListOut

    with client(args) as c:
        data = c.runs(project=args.project, limit=args.limit, as_="json")
    if args.json:
        print_json(data)
        return 0
    rows = decode(RunListOut, data).runs
    t = Table(
        ("RUN", "<32"),
        ("PROJECT", "<16"),
        ("STATUS", "<9"),
        ("STEP", ">9"),
        ("RANKS", ">6"),
        ("JOBS", ">5"),
    )
    print(t.header())
    for r in rows:
        print(t.row(r.run_id, r.project or "-", r.status, r.last_step, r.world_size, r.jobs))
    if not rows:
        print("(no runs yet)")
    return 0


def cmd_run_show(args: argparse.Namespace) -> int:
    from ..api.models import RanksOut, RunDetailOut

    with client(args) as c:
        run_doc = c.run(args.run)
        ranks_doc = c.ranks(args.run, limit=args.top, sort="compute", as_="json")
    if args.json:
        print_json({"run": run_doc, "ranks": ranks_doc})
        return 0
    run, ranks = decode(RunDetailOut, run_doc), decode(RanksOut, ranks_doc)
    print(f"run {run.run_id}  project {run.project or '-'}  status {run.status}")
    if run.ended:
        print(f"  ended: {run.ended.reason}")
    if run.status == "RECORDED":
        print(
            f"  known only from recordings (traces, dumps), steps up to {run.last_step}: "
            f"fleetlens traces show {run.run_id}"
        )
    print(
        f"  step {fmt(run.step)}  tokens {fmt(run.tokens_processed, ',')}  "
        f"ranks {run.world_size}  jobs {run.jobs}"
    )
    lay = run.layout
    if lay:
        axes = {"tp": lay.tp, "cp": lay.cp, "pp": lay.pp, "dp": lay.dp}
        sizes = " x ".join(f"{a} {n}" for a, n in axes.items() if n > 1)
        extra = "".join(f", {a} {n}" for a, n in (("ep", lay.ep), ("vpp", lay.vpp)) if n > 1)
        print(f"  layout: {sizes}{extra} (from the {lay.source}; ranks judged per stage)")
    reporting, world = run.ranks_reporting, run.world_size
    if reporting is not None and world and reporting < world:
        print(f"  only {reporting} of {world} ranks report steps")
    _speed(run)
    if ranks.ranks:
        print(f"  slowest ranks by compute time, steps {ranks.from_step}-{ranks.to_step}:")
        t = Table(
            ("RANK", ">6"),
            ("NODE", "<20"),
            ("GPU", ">4"),
            ("COMPUTE ms", ">11"),
            ("x MEDIAN", ">9"),
            ("WAIT ms", ">8"),
            ("STEP ms", ">8"),
            indent="    ",
        )
        print(t.header())
        for r in ranks.ranks:
            print(
                t.row(
                    r.rank,
                    r.node or "-",
                    r.gpu,
                    fmt(r.compute_ms, ".1f"),
                    fmt(r.compute_slowdown, ".3f"),
                    fmt(r.comm_ms, ".1f"),
                    fmt(r.step_time_ms, ".1f"),
                )
            )
    return 0


def _speed(run: RunDetailOut) -> None:
    """The run's speed lines: step time, tokens/s and loss, completion, contract and MFU."""
    m = WindowFigures.of(run.metrics)
    print(
        f"  step time {fmt(m.step_time_ms, '.1f')} ms (slowest rank, median of last "
        f"{run.window.steps if run.window else 0} steps)  tokens/s "
        f"{fmt(m.tokens_per_second, ',.0f')}  loss {fmt(m.loss, '.4g')}"
    )
    done = run.completion
    if done:
        at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(done.finish_at))
        budget = (
            f"{done.target_key}: {done.tokens_left:,} tokens left"
            if done.tokens_left is not None
            else done.target_key
        )
        print(
            f"  completion: step {fmt(run.step, ',')} of {done.total_steps:,} "
            f"({budget}), {fmt(done.seconds_per_step, '.3g')} s/step lately: "
            f"{_hours(done.seconds)} left, about {at}"
        )
    if run.contract:
        print(f"  measured on: {run.contract.text}")
    mfu = run.mfu
    if mfu and mfu.value is not None:
        hfu = f"  HFU {fmt(mfu.hfu, '.1%')}" if mfu.hfu is not None else ""
        peak = mfu.peak_flops_per_device
        print(
            f"  MFU {fmt(mfu.value, '.1%')}{hfu} ({mfu.devices} x {mfu.accelerator or '-'}"
            f" at {fmt(None if peak is None else peak / 1e12, '.1f')} TFLOP/s {mfu.dtype}, same "
            "window)"
        )
    elif mfu:
        print(f"  MFU unknown: {mfu.missing}")


def _hours(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def cmd_frontier(args: argparse.Namespace) -> int:
    from ..api.models import FrontierOut

    params = query(target_steps=args.target_steps, target_loss=args.target_loss)
    with client(args) as c:
        doc = c.get(f"/v1/projects/{args.project}/frontier", **params)
    if args.json:
        print_json(doc)
        return 0
    data = decode(FrontierOut, doc)
    target = (
        f"loss <= {data.target_loss:g}"
        if data.target_loss is not None
        else f"step {data.target_steps:,}"
        if data.target_steps
        else None
    )
    if target is None:
        print(f"project {data.project}: no target (no run names one: --target-steps N)")
        return 0
    print(f"project {data.project}: time to {target}, fastest first (* on the frontier)")
    cols = [("", "<1"), ("RUN", "<32"), ("STATUS", "<9"), ("DEVICES", ">7"), ("TIME", ">10")]
    t = Table(*cols, ("GPU-HOURS", ">10"), ("", "<10"))
    print(t.header())
    for r in data.runs:
        time_s = _hours(r.seconds) if r.seconds is not None else "not reached"
        print(
            t.row(
                "*" if r.on_frontier else " ",
                r.run_id,
                r.status,
                r.devices,
                time_s,
                fmt(r.gpu_hours, ",.1f"),
                "estimated" if r.estimated else "",
            )
        )
    return 0


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:,.2f}"


def cmd_memory(args: argparse.Namespace) -> int:
    from ..api.memory_models import MemoryOut

    with client(args) as c:
        doc = c.get(f"/v1/runs/{args.run}/memory", **query(rank=args.rank, top=args.top))
    if args.json:
        print_json(doc)
        return 0
    data = decode(MemoryOut, doc)
    pools = data.pools
    if not pools:
        print(f"run {data.run_id}: no memory samples (FLEETLENS_MEMORY_S=0, or no step yet)")
        return 0
    print(f"run {data.run_id}: memory per rank in GiB, least headroom first")
    cols = [("RANK", ">5"), ("POOL", "<6"), ("USED", ">9"), ("PEAK", ">9"), ("LIMIT", ">9")]
    t = Table(*cols, ("HEADROOM", ">9"), ("CLIMB/STEP", ">10"), ("STEPS LEFT", ">10"))
    print(t.header())
    for p in pools[: args.top if args.rank is None else None]:
        per = p.climb.per_step_bytes if p.climb else None
        left = p.steps_to_limit
        print(
            t.row(
                p.rank,
                p.pool,
                _gib(p.used_bytes),
                _gib(p.peak_bytes),
                _gib(p.limit_bytes),
                _gib(p.headroom_bytes),
                "-" if per is None else f"{per / 2**20:+,.1f} MiB",
                "-" if left is None else f"{left:,.0f}",
            )
        )
    if args.rank is None and len(pools) > args.top:
        print(f"... {len(pools) - args.top} more (--top N, or --rank R)")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from ..api.log_models import LogsOut

    params = query(
        q=args.grep,
        rank=args.rank,
        from_step=args.from_step,
        to_step=args.to_step,
        around=args.around,
        level=args.level,
        limit=args.limit,
    )
    with client(args) as c:
        doc = c.get(f"/v1/runs/{args.run}/logs", **params)
    if args.json:
        print_json(doc)
        return 0
    data = decode(LogsOut, doc)
    for x in data.lines:
        where = f"step {x.step:>6} rank {x.rank:>4} {x.level:<8} {x.source}"
        print(f"{where}: {x.message}")
    if not data.lines:
        print(f"run {data.run_id}: no lines matched (the SDK sends them with FLEETLENS_LOGS=1)")
    elif data.truncated:
        print("... more lines matched: --limit N, or narrow with --grep, --rank, --around")
    return 0


def add_parsers(sub: Any) -> None:
    """Add ``runs``, ``run show``, ``frontier``, ``memory`` and ``logs`` to the CLI's
    subparsers."""
    sp = sub.add_parser("runs", help="list runs")
    client_opts(sp)
    sp.add_argument("--project")
    sp.add_argument("--limit", type=int, default=50)
    sp.set_defaults(func=cmd_runs)
    sp = sub.add_parser("run", help="one run")
    rsub = sp.add_subparsers(dest="run_command", required=True)
    show = rsub.add_parser("show", help="status, speed and slowest ranks of a run")
    show.add_argument("run")
    show.add_argument("--top", type=int, default=5, help="slowest ranks to show")
    client_opts(show)
    show.set_defaults(func=cmd_run_show)
    fr = sub.add_parser(
        "frontier", help="time to result and GPU-hours across a project's runs, and the frontier"
    )
    fr.add_argument("project")
    target = fr.add_mutually_exclusive_group()
    default = "default: the runs' most common config target"
    target.add_argument("--target-steps", type=int, help=f"the step to reach ({default})")
    target.add_argument("--target-loss", type=float, help="a quality: the first loss at or under")
    client_opts(fr)
    fr.set_defaults(func=cmd_frontier)
    mem = sub.add_parser(
        "memory",
        help="a run's memory per rank: use, peak, headroom and climb, least headroom first",
    )
    mem.add_argument("run")
    mem.add_argument("--rank", type=int, help="one rank only")
    mem.add_argument("--top", type=int, default=8, help="ranks to show (default 8)")
    client_opts(mem)
    mem.set_defaults(func=cmd_memory)
    lg = sub.add_parser("logs", help="a run's log lines with their rank and step, searched")
    lg.add_argument("run")
    lg.add_argument("--grep", help="lines holding this text (any case)")
    lg.add_argument("--rank", type=int, help="one rank only")
    lg.add_argument("--from-step", type=int)
    lg.add_argument("--to-step", type=int)
    lg.add_argument("--around", type=int, metavar="STEP", help="the steps either side of STEP")
    lg.add_argument("--level", choices=LOG_LEVELS, help="this level and above")
    lg.add_argument("--limit", type=int, default=500)
    client_opts(lg)
    lg.set_defaults(func=cmd_logs)
