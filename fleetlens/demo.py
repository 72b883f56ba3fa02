"""``fleetlens demo``: the embedded server, a simulated 256-rank run with faults, a summary.

It starts ``fleetlens serve`` on the embedded default (in this process), plays the ``demo``
scenario of the simulator into it over HTTP (a persistent straggler, a thermal event, a restart
after a fatal Xid 79, checkpoints, a data stall), then prints where the time went, what fleetlens
found beside what was injected (matched one to one, with the time each finding took), and where
to look. It keeps serving until interrupted (``--once``
exits at the end).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
from typing import Any

from .client import Client, WindowFigures
from .config import ServerConfig
from .errors import FleetlensError
from .sigint import restore_sigint

__all__ = ["found_vs_injected", "real_ddp", "run_demo", "summary"]

# The real DDP run's slowed rank sleeps this long per step (about twice a step of the tiny model
# on a CPU core): plain to see, and still the last to arrive when four processes share two cores.
_SLOW_MS = 80


def _wait_up(client: Client, thread: threading.Thread, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise FleetlensError("the server stopped during start; see the messages above")
        with contextlib.suppress(FleetlensError):
            client.get("/healthz")
            return
        time.sleep(0.1)
    raise FleetlensError(f"the server did not answer at {client.server} within {timeout:.0f}s")


def _start_server(cfg: ServerConfig) -> tuple[Any, threading.Thread]:
    import uvicorn

    from .server import create_app

    server = uvicorn.Server(
        uvicorn.Config(create_app(cfg), host=cfg.host, port=cfg.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="fleetlens-server", daemon=True)
    thread.start()
    return server, thread


def _hours(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min"


def summary(client: Client, run_id: str, truth: Any) -> str:
    """The terminal summary of the demo run, read back through the API."""
    from .api.goodput_models import RunGoodputOut
    from .api.models import RankOut, RunDetailOut

    run = RunDetailOut.model_validate(client.run(run_id), extra="ignore")
    ranks = client.ranks(run_id, limit=3, from_step=0, to_step=run.step)
    good = RunGoodputOut.model_validate(client.goodput(run_id), extra="ignore")
    timeline = client.timeline(run_id, from_step=0, to_step=run.step)
    m = WindowFigures.of(run.metrics)
    loss = float("nan") if m.loss is None else m.loss
    lines = [
        f"run {run_id}: {run.world_size} ranks, {run.steps} steps in "
        f"{len(run.job_ids)} job attempts, status {run.status}",
        f"  step time {m.step_time_ms:.0f} ms (slowest rank)   tokens "
        f"{run.tokens_processed:,}   loss {loss:.3f}",
        "",
        "where the time went:",
    ]
    for line in good.breakdown.lines:
        if line.seconds > 0:
            lines.append(
                f"  {line.category:<12} {_hours(line.seconds):>10} "
                f"{100 * line.share:5.1f}%   ({line.factor})"
            )
    f = good.factors
    lines.append(
        f"  goodput: runtime {f.runtime:.3f} x program {f.program:.3f} = job {f.job_product:.3f}"
    )
    lines += ["", f"slowest ranks by compute time over the whole run (steps 0-{run.step}):"]
    for r in (RankOut.model_validate(r, extra="ignore") for r in ranks):
        lines.append(
            f"  rank {r.rank:>4} on {r.node} GPU {r.gpu} ({r.rack}): compute "
            f"{r.compute_ms:.0f} ms, {r.compute_slowdown:.3f} x median, waits "
            f"{r.comm_ms:.0f} ms in collectives"
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
    return "\n".join(lines)


def _where(ranks: list[int]) -> str:
    return f"ranks {ranks[:4]}{'...' if len(ranks) > 4 else ''}"


def found_vs_injected(
    client: Client, run_id: str, truth: Any, played_at: float, wait_s: float = 90.0
) -> str:
    """What fleetlens found beside what was injected, matched one to one (the simulator's
    scoring: same diagnosis, overlapping ranks or nodes, inside the fault's window), with how
    long each finding took: steps after the fault's onset, and wall seconds from the moment the
    run began to be sent to the finding's first appearance. Waits up to ``wait_s`` for the
    analysis to find every fault."""
    from .api.models import FindingOut
    from .sim.truth import score_detections

    deadline = time.monotonic() + wait_s
    while True:
        found = client.diagnosis(run_id)
        score = score_detections(truth, found)
        if len(score.matched) == len(truth.faults) or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    by_fault = dict(score.matched)
    lines = ["", "what fleetlens found, against what was injected:"]
    for fault in truth.faults:
        lines.append(
            f"  injected {fault.diagnosis:<21} {_where(fault.ranks)} steps "
            f"{fault.start_step}-{fault.end_step} ({fault.owner})"
        )
        i = by_fault.get(fault.id)
        if i is None:
            lines.append("    NOT FOUND")
            continue
        f = FindingOut.model_validate(found[i], extra="ignore")
        after = max(0, f.step - fault.start_step)
        lines.append(f"    found    {f.summary}")
        lines.append(
            f"             at step {f.step} ({after} step{'s' if after != 1 else ''} after "
            f"onset), shown {max(0.0, f.first_seen - played_at):.1f} s after the run began to "
            f"be sent; owner {f.owner}"
        )
    matched = {i for _, i in score.matched}
    extra = [f for i, f in enumerate(found) if i not in matched]
    lines.append(
        f"  {len(score.matched)} of {len(truth.faults)} injected faults found; "
        f"{len(extra)} other finding{'s' if len(extra) != 1 else ''}" + (":" if extra else "")
    )
    for f in extra:
        lines.append(f"    {f['diagnosis']}: {f['summary']} (step {f['step']})")
    return "\n".join(lines)


def _torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def real_ddp(client: Client, run_id: str, steps: int = 40, slow_rank: int = 2) -> str:
    """The real thing beside the simulation: 4 gloo processes under torchrun, one slowed."""
    import subprocess

    from .api.models import RankOut

    env = {
        **os.environ,
        "FLEETLENS_SERVER": client.server,
        "FLEETLENS_TOKEN": client.token,
        "FLEETLENS_RUN_ID": run_id,
        "OMP_NUM_THREADS": "1",
    }
    print(
        f"training a tiny transformer with DDP on 4 CPU processes (rank {slow_rank} slowed "
        f"by {_SLOW_MS} ms from step 10)...",
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
            str(_SLOW_MS),
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
    deadline = time.monotonic() + 120  # a pass over the simulated run may take a while
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not found:
        with contextlib.suppress(FleetlensError):  # not registered yet: 404 until the next flush
            found = client.stragglers(run_id)
        time.sleep(0.5)
    ranks = client.ranks(run_id, limit=4, from_step=12, to_step=steps - 1)
    lines = [
        f"real DDP run {run_id}: {steps} steps on 4 ranks",
        "  ranks by compute time (steps 12+):",
    ]
    for r in (RankOut.model_validate(r, extra="ignore") for r in ranks):
        lines.append(
            f"    rank {r.rank}: compute {r.compute_ms:.1f} ms, waits "
            f"{r.comm_ms:.1f} ms in all-reduce"
        )
    for f in found:
        last = [e for e in f["evidence"] if e.get("signal") == "last_arriver"]
        lines.append(
            f"  finding: {f['summary']}"
            + (f" (arrived last in {last[0]['value']:.0%} of all-reduces)" if last else "")
        )
    return "\n".join(lines)


def run_demo(
    data: str | None = None,
    port: int | None = None,
    scenario: str = "demo",
    speed: float = 0.0,
    once: bool = False,
    ddp: bool = True,
) -> int:
    """Start the embedded server, play ``scenario`` into it, print the summary; 0 when done."""
    from .sim.emit import HttpSink
    from .sim.library import load_scenario, run_scenario

    cfg = ServerConfig.resolve({"data_dir": data, "port": port, "host": "127.0.0.1"})
    url = f"http://{cfg.host}:{cfg.port}"
    print(f"fleetlens demo: embedded server on {url}, data in {cfg.data_dir}", file=sys.stderr)
    server, thread = _start_server(cfg)
    # no token: this loopback server serves without one, and would refuse another server's
    client = Client(url, token="")
    try:
        _wait_up(client, thread)
        scn = load_scenario(scenario)
        run_id = f"{scn.job.run_id}-{time.strftime('%Y%m%d-%H%M%S')}"
        scn = dataclasses.replace(scn, job=dataclasses.replace(scn.job, run_id=run_id))
        print(
            f"playing scenario {scenario!r}: {scn.job.steps} steps of "
            f"{scn.cluster.nodes * scn.cluster.gpus_per_node} GPUs "
            f"(speed {speed or 'max'})...",
            file=sys.stderr,
        )
        played_at = time.time()
        result = run_scenario(
            scn,
            sink=HttpSink(url, token=client.token),
            speed=speed,
            out_dir=os.path.join(cfg.data_dir, "sim", run_id),
        )
        print(
            f"sent {sum(result.records.values()):,} records in {result.elapsed_s:.1f}s; "
            f"ground truth in {result.truth_path}",
            file=sys.stderr,
        )
        time.sleep(2.5)  # the run registry is written every 2 s
        print()
        print(summary(client, run_id, result.truth))
        print(found_vs_injected(client, run_id, result.truth, played_at))
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
        if ddp and _torch_available():
            print("\n" + real_ddp(client, f"ddp-demo-{time.strftime('%Y%m%d-%H%M%S')}"))
        if not once:
            print("\nserving; Ctrl-C to stop", file=sys.stderr)
            while thread.is_alive():
                restore_sigint()  # chDB ignores Ctrl-C behind Python's back (fleetlens/sigint.py)
                thread.join(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
        server.should_exit = True  # the lifespan's end closes the stores
        thread.join(30)
        if thread.is_alive():
            print("the embedded server did not stop within 30 s; exiting anyway", file=sys.stderr)
    return 0
