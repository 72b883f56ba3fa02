"""Quickstart: start the embedded server, train three tiny fake runs against it, look at them.

Each rank is a real process with torchrun's environment (RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT), instrumented with the SDK exactly as a training script would be.
One run is healthy, one has a rank 15% slower than the rest, and one fails at step 30 and
restarts from its step-20 checkpoint. The server keeps serving afterwards (Ctrl-C to stop),
unless --once.

    python examples/quickstart.py [--once] [--data DIR] [--port N]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def rank_main() -> None:
    """One rank of a fake training job; configured by torchrun-style variables."""
    import fleetlens

    slow_rank = int(os.environ.get("QS_SLOW_RANK", "-1"))
    first, last = int(os.environ["QS_FIRST_STEP"]), int(os.environ["QS_LAST_STEP"])
    fail_at = int(os.environ.get("QS_FAIL_AT", "-1"))
    run = fleetlens.init(project="quickstart", config={"lr": 3e-4, "layers": 4, "seq": 2048})
    rank = run.config.rank
    rng = random.Random(rank)
    base = 0.02
    for step in range(first, last + 1):
        if step == fail_at:
            run.event(
                "hardware_fault", step=step, message="Xid 79: GPU has fallen off the bus", xid=79
            )
            run.finish(status="failed", message="rank lost its GPU")
            return
        with run.step(step, tokens=2048 * 8):
            with run.phase("data"):
                time.sleep(0.001)
            with run.phase("forward"):
                time.sleep(
                    base * 0.33 * (1.15 if rank == slow_rank else 1.0) * rng.uniform(0.98, 1.02)
                )
            with run.phase("backward"):
                time.sleep(
                    base * 0.66 * (1.15 if rank == slow_rank else 1.0) * rng.uniform(0.98, 1.02)
                )
        if rank == 0:
            run.log(step, loss=4.0 / (1 + 0.05 * step), lr=3e-4, grad_norm=1.0 + rng.random() * 0.1)
        if rank == 0 and step % 20 == 0 and step > first:
            with run.checkpoint(step, path=f"file:///tmp/quickstart/ckpt-{step}"):
                time.sleep(0.01)
    run.finish()


def launch(
    server: str, run_id: str, world: int, first: int, last: int, attempt: int = 0, **extra: str
) -> None:
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank % 4),
            WORLD_SIZE=str(world),
            TORCHELASTIC_RUN_ID=run_id,
            TORCHELASTIC_RESTART_COUNT=str(attempt),
            FLEETLENS_SERVER=server,
            QS_FIRST_STEP=str(first),
            QS_LAST_STEP=str(last),
            **extra,
        )
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-main"], env=env))
    for p in procs:
        p.wait()


def wait_for(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("fleetlens serve exited; see its output above")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"server at {url} did not come up in {timeout:.0f}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--once", action="store_true", help="exit when done instead of serving")
    ap.add_argument("--data", default="./fleetlens-data", help="data directory")
    ap.add_argument("--port", type=int, default=8480)
    args = ap.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "fleetlens", "serve", "--data", args.data, "--port", str(args.port)]
    )
    try:
        wait_for(url, server)
        stamp = time.strftime("%H%M%S")
        print("training: healthy run, a run with a straggler, a run that fails and restarts")
        launch(url, f"qs-healthy-{stamp}", 8, 0, 59)
        launch(url, f"qs-straggler-{stamp}", 8, 0, 59, QS_SLOW_RANK="5")
        launch(url, f"qs-restart-{stamp}", 8, 0, 45, QS_FAIL_AT="30")
        launch(url, f"qs-restart-{stamp}", 8, 21, 59, attempt=1)
        time.sleep(2.5)  # the run registry is written every 2 s
        cli = [sys.executable, "-m", "fleetlens"]
        subprocess.run([*cli, "runs", "--server", url], check=True)
        print()
        subprocess.run([*cli, "run", "show", f"qs-straggler-{stamp}", "--server", url], check=True)
        print(
            f"\nAPI: {url}/docs   runs: {url}/v1/runs   "
            f"ranks: {url}/v1/runs/qs-straggler-{stamp}/ranks?sort=step_time&order=desc\n"
            f"timeline: {url}/v1/runs/qs-restart-{stamp}/timeline"
        )
        if not args.once:
            print("serving; Ctrl-C to stop")
            server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()
        server.wait(20)


if __name__ == "__main__":
    if "--rank-main" in sys.argv:
        rank_main()
    else:
        main()
