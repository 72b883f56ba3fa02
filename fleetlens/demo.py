"""``fleetlens demo``: the embedded server, a simulated 256-rank run with faults, a summary.

It starts ``fleetlens serve`` on the embedded default (in this process), plays the ``demo``
scenario of the simulator into it over HTTP (a persistent straggler, a thermal event, a restart
after a fatal Xid 79, checkpoints, a data stall), then prints where the time went, what fleetlens
found, what was injected, and where to look. It keeps serving until interrupted (``--once``
exits at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from .config import ServerConfig
from .errors import FleetlensError

__all__ = ["add_parser", "cmd_demo"]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.load(r)


def _wait_up(url: str, thread: threading.Thread, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise FleetlensError("the server stopped during start; see the messages above")
        with contextlib.suppress(OSError):
            _get(url + "/healthz")
            return
        time.sleep(0.1)
    raise FleetlensError(f"the server did not answer at {url} within {timeout:.0f}s")


def _start_server(cfg: ServerConfig) -> tuple[Any, threading.Thread]:
    import uvicorn

    from .api.app import create_app

    server = uvicorn.Server(
        uvicorn.Config(create_app(cfg), host=cfg.host, port=cfg.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="fleetlens-server", daemon=True)
    thread.start()
    return server, thread


def _hours(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min"


def summary(url: str, run_id: str, truth: Any) -> str:
    """The terminal summary of the demo run, read back through the API."""
    run = _get(f"{url}/v1/runs/{run_id}")
    ranks = _get(
        f"{url}/v1/runs/{run_id}/ranks?sort=compute&order=desc&limit=3"
        f"&fromStep=0&toStep={run['step']}"
    )["ranks"]
    good = _get(f"{url}/v1/runs/{run_id}/goodput")
    timeline = _get(f"{url}/v1/runs/{run_id}/timeline?fromStep=0&toStep={run['step']}")["items"]
    m = run["metrics"]
    lines = [
        f"run {run_id}: {run['worldSize']} ranks, {run['steps']} steps in "
        f"{len(run['jobIds'])} job attempts, status {run['status']}",
        f"  step time {m['stepTimeMs']:.0f} ms (slowest rank)   tokens "
        f"{run['tokensProcessed']:,}   loss {m.get('loss', float('nan')):.3f}",
        "",
        "where the time went:",
    ]
    bd = good["breakdown"]
    for line in bd["lines"]:
        if line["seconds"] > 0:
            lines.append(
                f"  {line['category']:<12} {_hours(line['seconds']):>10} "
                f"{100 * line['share']:5.1f}%   ({line['factor']})"
            )
    f = good["factors"]
    lines.append(
        f"  goodput: runtime {f['runtime']:.3f} x program {f['program']:.3f} = job "
        f"{f['jobProduct']:.3f}"
    )
    lines += ["", f"slowest ranks by compute time over the whole run (steps 0-{run['step']}):"]
    for r in ranks:
        lines.append(
            f"  rank {r['rank']:>4} on {r['node']} GPU {r['gpu']} ({r['rack']}): compute "
            f"{r['computeMs']:.0f} ms, {r['computeSlowdown']:.3f} x median, waits "
            f"{r['commMs']:.0f} ms in collectives"
        )
    events = [
        i
        for i in timeline
        if i["source"] == "event"
        and i["kind"] in ("hardware_fault", "failure", "restart", "checkpoint_end")
    ]
    if events:
        lines += ["", "timeline (selected):"]
        shown = [e for e in events if e["kind"] != "checkpoint_end"]
        ckpts = [e for e in events if e["kind"] == "checkpoint_end"]
        for e in shown:
            lines.append(f"  step {e['step']}: {e['kind']} {e['message']}".rstrip())
        if ckpts:
            lines.append(f"  {len(ckpts)} checkpoints, last at step {ckpts[-1]['step']}")
    lines += ["", "injected (ground truth):"]
    for fault in truth.faults:
        lines.append(
            f"  {fault.kind:<22} ranks {fault.ranks[:4]}{'...' if len(fault.ranks) > 4 else ''} "
            f"steps {fault.start_step}-{fault.end_step}  expect {fault.diagnosis} ({fault.owner})"
        )
    return "\n".join(lines)


def _torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def real_ddp(url: str, run_id: str, steps: int = 40, slow_rank: int = 2) -> str:
    """The real thing beside the simulation: 4 gloo processes under torchrun, one slowed."""
    import subprocess

    env = {
        **os.environ,
        "FLEETLENS_SERVER": url,
        "FLEETLENS_RUN_ID": run_id,
        "OMP_NUM_THREADS": "1",
    }
    print(
        f"training a tiny transformer with DDP on 4 CPU processes (rank {slow_rank} slowed "
        "by 40 ms from step 10)...",
        file=sys.stderr,
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            "-m",
            "fleetlens.examples.ddp_train",
            "--steps",
            str(steps),
            "--slow-rank",
            str(slow_rank),
            "--slow-ms",
            "40",
            "--from-step",
            "10",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if out.returncode != 0:
        return f"the DDP example failed:\n{out.stderr[-2000:]}"
    deadline = time.monotonic() + 30
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not found:
        with contextlib.suppress(urllib.error.URLError):
            found = _get(f"{url}/v1/runs/{run_id}/stragglers")["stragglers"]
        time.sleep(0.5)
    ranks = _get(
        f"{url}/v1/runs/{run_id}/ranks?sort=compute&order=desc&limit=4"
        f"&fromStep=12&toStep={steps - 1}"
    )["ranks"]
    lines = [
        f"real DDP run {run_id}: {steps} steps on 4 ranks",
        "  ranks by compute time (steps 12+):",
    ]
    for r in ranks:
        lines.append(
            f"    rank {r['rank']}: compute {r['computeMs']:.1f} ms, waits "
            f"{r['commMs']:.1f} ms in all-reduce"
        )
    for f in found:
        last = [e for e in f["evidence"] if e.get("signal") == "last_arriver"]
        lines.append(
            f"  finding: {f['summary']}"
            + (f" (arrived last in {last[0]['value']:.0%} of all-reduces)" if last else "")
        )
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    from .sim.library import load_scenario, run_scenario

    cfg = ServerConfig.resolve({"data_dir": args.data, "port": args.port, "host": "127.0.0.1"})
    url = f"http://{cfg.host}:{cfg.port}"
    print(f"fleetlens demo: embedded server on {url}, data in {cfg.data_dir}", file=sys.stderr)
    server, thread = _start_server(cfg)
    try:
        _wait_up(url, thread)
        scenario = load_scenario(args.scenario)
        run_id = f"{scenario.job.run_id}-{time.strftime('%Y%m%d-%H%M%S')}"
        scenario = dataclasses.replace(
            scenario, job=dataclasses.replace(scenario.job, run_id=run_id)
        )
        print(
            f"playing scenario {args.scenario!r}: {scenario.job.steps} steps of "
            f"{scenario.cluster.nodes * scenario.cluster.gpus_per_node} GPUs "
            f"(speed {'max' if not args.speed else args.speed})...",
            file=sys.stderr,
        )
        result = run_scenario(
            scenario,
            server=url,
            speed=args.speed,
            out_dir=os.path.join(cfg.data_dir, "sim", run_id),
        )
        print(
            f"sent {sum(result.records.values()):,} records in {result.elapsed_s:.1f}s; "
            f"ground truth in {result.truth_path}",
            file=sys.stderr,
        )
        time.sleep(2.5)  # the run registry is written every 2 s
        print()
        print(summary(url, run_id, result.truth))
        print(
            f"\nwhere to look:\n"
            f"  portal      {url}/runs/{run_id}\n"
            f"              {url}/oncall   {url}/capacity\n"
            f"  API docs    {url}/docs\n"
            f"  the run     {url}/v1/runs/{run_id}\n"
            f"  ranks       {url}/v1/runs/{run_id}/ranks?sort=compute&order=desc\n"
            f"  timeline    {url}/v1/runs/{run_id}/timeline\n"
            f"  goodput     {url}/v1/runs/{run_id}/goodput\n"
            f"  CLI         fleetlens runs --server {url}\n"
            f"              fleetlens run show {run_id} --server {url}\n"
            f"              fleetlens goodput {run_id} --server {url}"
        )
        if args.ddp and _torch_available():
            print("\n" + real_ddp(url, f"ddp-demo-{time.strftime('%Y%m%d-%H%M%S')}"))
        if not args.once:
            print("\nserving; Ctrl-C to stop", file=sys.stderr)
            while thread.is_alive():
                thread.join(0.5)
    except KeyboardInterrupt:
        pass
    except urllib.error.URLError as exc:
        raise FleetlensError(f"the demo could not read back from {url}: {exc}") from exc
    finally:
        server.should_exit = True
        thread.join(30)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="embedded server + a simulated run with faults + a summary")
    p.add_argument("--data", help="data directory (default ~/.local/share/fleetlens)")
    p.add_argument("--port", type=int, help="port (default 8480)")
    p.add_argument("--scenario", default="demo", help="a shipped scenario name or a YAML path")
    p.add_argument(
        "--speed",
        type=float,
        default=0.0,
        help="simulated seconds per wall second (0 = as fast as possible)",
    )
    p.add_argument("--once", action="store_true", help="exit after the summary")
    p.add_argument(
        "--no-ddp",
        dest="ddp",
        action="store_false",
        help="skip the real 4-process DDP run (it needs torch)",
    )
    p.set_defaults(func=cmd_demo)
