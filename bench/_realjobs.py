"""Real training code launched the way users launch it, with faults caused from outside.

Each job is one of the codes in ``tests/realcode`` (a nanoGPT-style ``train.py``, a Hugging Face
``Trainer``, a Lightning loop), instrumented as fleetlens's docs show, under
``torchrun --nproc-per-node N`` with gloo on CPU, reporting to a real ``fleetlens serve``. A
controller thread here finds one rank's process (the torchrun worker whose environment has
``RANK=r``) and, once the run reaches a step on the server, does to it what a fault does:

- ``slow``: throttles it until it exits to ``keep`` of the CPU it was using before the onset (a
  rank that computes slower from that step on, every step alike, as a throttled GPU does): a
  kernel-enforced cap (cgroup ``cpu.max``, or v1 ``cpu.cfs_quota_us``, per 10 ms) where a cpu
  cgroup is writable, else a duty cycle of ``SIGSTOP``/``SIGCONT`` per 20 ms;
- ``hang``: stops it for ``stop_s`` seconds, then continues it;
- ``crash``: ``SIGKILL``.

Nothing in the training code sleeps or knows about the fault. :func:`run_job` returns what the
server says afterwards (runs, the run, its ranks, goodput, diagnosis, ``fleetlens diagnose``)
with the fault's onset and the job's timings, for ``tests/test_real_jobs.py`` and
``bench/real_jobs.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetlens.testing import Server, free_port, wait_passes

REALCODE = Path(__file__).resolve().parent.parent / "tests" / "realcode"
CODES = ("nanogpt", "hf", "lightning")
FAULTS = ("none", "slow", "hang", "crash")
LAUNCHES = ("rdzv", "master-port", "accelerate")
TERMINAL = ("FINISHED", "FAILED", "STOPPED")

# The launcher's variables a harness started under torchrun (or Slurm) would otherwise pass on.
_INHERITED = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "FLEETLENS_RUN_ID",
    "FLEETLENS_JOB_ID",
    "FLEETLENS_DISABLED",
)


@dataclass(frozen=True)
class Fault:
    """What to do to ``rank`` once the run's last step on the server reaches ``at_step``."""

    kind: str = "none"  # one of FAULTS
    at_step: int = 0
    rank: int = 2
    stop_s: float = 150.0  # hang: how long the rank stays stopped
    keep: float = 0.7  # slow: the share of its CPU pace before the onset the rank keeps

    def __post_init__(self) -> None:
        if self.kind not in FAULTS:
            raise ValueError(f"fault kind {self.kind!r}; one of {', '.join(FAULTS)}")
        if self.kind == "slow" and not 0 < self.keep < 1:
            raise ValueError(f"slow fault keeps {self.keep} of the rank's CPU; 0 < keep < 1")


@dataclass
class JobResult:
    code: str
    launch: str
    fault: Fault
    steps: int
    returncode: int | None
    output: str  # the job's stdout and stderr, the end of it
    run_ids: list[str]
    run_id: str | None  # the job's run: the one named by the rendezvous id, else the first
    runs: list[dict[str, Any]]  # GET /v1/runs
    run: dict[str, Any] = field(default_factory=dict)  # GET /v1/runs/{run}
    ranks: dict[str, Any] = field(default_factory=dict)  # GET /v1/runs/{run}/ranks
    goodput: dict[str, Any] = field(default_factory=dict)  # GET /v1/runs/{run}/goodput
    diagnosis: dict[str, Any] = field(default_factory=dict)  # GET /v1/runs/{run}/diagnosis
    diagnose_cli: str = ""  # `fleetlens diagnose RUN`
    onset_step: int | None = None  # the run's last step on the server when the fault began
    onset_time: float | None = None
    fault_pid: int | None = None
    fault_how: str = ""  # slow: "cgroup N cores" or "sigstop" (see the module docstring)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def status(self) -> str | None:
        return self.run.get("status")

    @property
    def findings(self) -> list[dict[str, Any]]:
        return list(self.diagnosis.get("findings", []))

    @property
    def reporting_ranks(self) -> list[int]:
        return sorted({int(r["rank"]) for r in self.ranks.get("ranks", [])})


# ---- the codes and how they are launched ---------------------------------------------------
def prepare_nanogpt_data(data_dir: str) -> str:
    """nanoGPT's dataset layout made here (prepare.py), once per directory."""
    if not os.path.exists(os.path.join(data_dir, "meta.pkl")):
        subprocess.run(
            [sys.executable, str(REALCODE / "nanogpt" / "prepare.py"), data_dir],
            check=True,
            capture_output=True,
            timeout=120,
        )
    return data_dir


def script_args(code: str, steps: int, workdir: str) -> list[str]:
    """The code's script and its arguments for ``steps`` optimizer steps."""
    if code == "nanogpt":
        data = prepare_nanogpt_data(os.path.join(workdir, "data"))
        root = REALCODE / "nanogpt"
        # nanoGPT counts iterations 0..max_iters inclusive
        return [
            str(root / "train.py"),
            str(root / "config" / "tiny.py"),
            f"--data_dir={data}",
            f"--out_dir={os.path.join(workdir, 'out')}",
            f"--max_iters={steps - 1}",
            f"--lr_decay_iters={steps}",
        ]
    if code == "hf":
        return [str(REALCODE / "hf_trainer.py"), "--max-steps", str(steps), "--out", workdir]
    if code == "lightning":
        return [str(REALCODE / "lightning_loop.py"), "--max-steps", str(steps), "--out", workdir]
    raise ValueError(f"code {code!r}; one of {', '.join(CODES)}")


def launch_command(args: list[str], launch: str, nproc: int, rdzv_id: str) -> list[str]:
    """torchrun as users type it: with a c10d rendezvous and an id, or (nanoGPT's docstring)
    with only ``--master-port``, which leaves the run id ``none``; or ``accelerate launch``
    (Hugging Face Accelerate's launcher, torchrun underneath, no run id either)."""
    if launch == "accelerate":
        return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                "--num_processes", str(nproc), "--num_machines", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no", "--main_process_port", str(free_port()),
                *args]  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if launch == "rdzv":
        endpoint = f"127.0.0.1:{free_port()}"
        opts = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
    elif launch == "master-port":
        opts = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    else:
        raise ValueError(f"launch {launch!r}; one of {', '.join(LAUNCHES)}")
    return [*torchrun, *opts, *args]


# ---- processes -----------------------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            out.setdefault(ppid, []).append(int(entry))
    return out


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def worker_pid(agent_pid: int, rank: int) -> int | None:
    """The torchrun worker of ``rank`` under the agent: the highest process in the agent's tree
    whose environment has ``RANK=rank`` (its own children, data loaders, inherit it)."""
    children = _children()
    frontier = list(children.get(agent_pid, []))
    while frontier:
        nxt: list[int] = []
        for pid in frontier:
            if _environ(pid).get("RANK") == str(rank):
                return pid
            nxt.extend(children.get(pid, []))
        frontier = nxt
    return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of the process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_CG_PERIOD_US = 10_000


def _throttle(pid: int, cores: float) -> Path | None:
    """Cap ``pid`` (its threads, and children it starts) at ``cores`` CPUs in a cgroup of its
    own, enforced by the kernel per 10 ms; the cgroup, or None where none can be made."""
    quota = max(1000, int(cores * _CG_PERIOD_US))
    for root, v2 in ((Path("/sys/fs/cgroup"), True), (Path("/sys/fs/cgroup/cpu"), False)):
        if v2 and "cpu" not in _read(root / "cgroup.controllers").split():
            continue
        if v2 and "cpu" not in _read(root / "cgroup.subtree_control").split():
            with contextlib.suppress(OSError):
                (root / "cgroup.subtree_control").write_text("+cpu")
        if not v2 and not (root / "cpu.cfs_quota_us").exists():
            continue
        cg = root / f"fleetlens-slow-{pid}"
        try:
            cg.mkdir(exist_ok=True)
            if v2:
                (cg / "cpu.max").write_text(f"{quota} {_CG_PERIOD_US}")
            else:
                (cg / "cpu.cfs_period_us").write_text(str(_CG_PERIOD_US))
                (cg / "cpu.cfs_quota_us").write_text(str(quota))
            (cg / "cgroup.procs").write_text(str(pid))
            return cg
        except OSError:
            with contextlib.suppress(OSError):
                cg.rmdir()
    return None


def _recap(cg: Path, cores: float) -> None:
    """Set the cap of a cgroup :func:`_throttle` made to ``cores`` CPUs."""
    quota = max(1000, int(cores * _CG_PERIOD_US))
    if (cg / "cpu.max").exists():
        (cg / "cpu.max").write_text(f"{quota} {_CG_PERIOD_US}")
    else:
        (cg / "cpu.cfs_quota_us").write_text(str(quota))


def _unthrottle(cg: Path) -> None:
    """Move what is left in the cgroup back to its parent and remove it."""
    for task in _read(cg / "cgroup.procs").split():
        with contextlib.suppress(OSError):
            (cg.parent / "cgroup.procs").write_text(task)
    with contextlib.suppress(OSError):
        cg.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# ---- the server ----------------------------------------------------------------------------
def _get(server: Server, path: str) -> Any:
    try:
        return server.get(path)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def last_step(server: Server) -> int | None:
    """The furthest step any run on the server has reached (a fresh server holds one job)."""
    body = _get(server, "/v1/runs")
    steps = [int(r.get("lastStep", -1)) for r in (body or {}).get("runs", [])]
    return max(steps) if steps else None


class _Injector(threading.Thread):
    def __init__(self, server: Server, agent: subprocess.Popen[bytes], fault: Fault) -> None:
        super().__init__(daemon=True, name=f"fault-{fault.kind}")
        self.server, self.agent, self.fault = server, agent, fault
        self.done = threading.Event()  # set by the harness when the job has exited
        self.pid: int | None = None
        self.onset_step: int | None = None
        self.onset_time: float | None = None
        self.how: str = ""
        self.error: str = ""
        self._cgroup: Path | None = None

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # a failed fault is reported, not raised in a thread
            self.error = f"{type(exc).__name__}: {exc}"

    def _run(self) -> None:
        f = self.fault
        paced: list[tuple[float, float]] = []  # (time, the rank's CPU seconds) while it trains
        while not self.done.is_set():
            self.pid = self.pid or worker_pid(self.agent.pid, f.rank)
            step = last_step(self.server)
            if self.pid and step is not None:
                paced = [*paced[-30:], (time.monotonic(), _cpu_seconds(self.pid))]
                if step >= f.at_step:
                    self.onset_step, self.onset_time = step, time.time()
                    break
            time.sleep(0.1)
        else:
            self.error = f"the job ended before step {f.at_step} was seen"
            return
        pid = self.pid
        if f.kind == "crash":
            _signal(pid, signal.SIGKILL)
        elif f.kind == "hang":
            _signal(pid, signal.SIGSTOP)
            # the rank resumes after stop_s even when the job is being torn down around it
            time.sleep(f.stop_s)
            _signal(pid, signal.SIGCONT)
        elif f.kind == "slow":
            (t0, c0), (t1, c1) = paced[0], paced[-1]
            cores = (c1 - c0) / (t1 - t0) if t1 > t0 else 0.5
            self._cgroup = _throttle(pid, f.keep * max(cores, 0.05))
            if self._cgroup is not None:
                self.how = f"cgroup {f.keep * max(cores, 0.05):.2f} cores ({cores:.2f} before)"
                return
            self.how = "sigstop"
            period = 0.02
            while not self.done.is_set() and _alive(pid):
                if not _signal(pid, signal.SIGSTOP):
                    break
                time.sleep(period * (1 - f.keep))
                _signal(pid, signal.SIGCONT)
                time.sleep(period * f.keep)

    def release(self) -> None:
        """Never leave the rank stopped or throttled, whatever happened."""
        self.done.set()
        if self.pid:
            _signal(self.pid, signal.SIGCONT)
        if self._cgroup is not None:
            _unthrottle(self._cgroup)
            self._cgroup = None


def _tail(path: str, limit: int = 64_000) -> str:
    with contextlib.suppress(OSError), open(path, errors="replace") as fh:
        return fh.read()[-limit:]
    return ""


def settle(server: Server, run_id: str, timeout: float, passes: int) -> dict[str, Any]:
    """The run once the server has judged the job's end: its status is terminal (or
    ``timeout`` passed without that), then ``passes`` more monitoring passes over the last data
    (waited on, not slept: a loaded machine's passes come late). Returns the run's last
    ``GET /v1/runs/{run}``."""
    deadline = time.monotonic() + timeout
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = _get(server, f"/v1/runs/{urllib.parse.quote(run_id)}") or run
        if run.get("status") in TERMINAL:
            break
        time.sleep(0.5)
    wait_passes(server, passes, timeout=max(120.0, 30.0 * passes))
    return _get(server, f"/v1/runs/{urllib.parse.quote(run_id)}") or run


def run_job(
    server: Server,
    code: str,
    *,
    steps: int = 40,
    fault: Fault | None = None,
    launch: str = "rdzv",
    nproc: int = 4,
    workdir: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600.0,
    settle_s: float = 60.0,
    passes: int = 3,
    rdzv_id: str | None = None,
    judge: bool = True,
) -> JobResult:
    """Run ``code`` for ``steps`` steps under torchrun against ``server`` with ``fault`` done to
    its rank from outside; wait for the server's verdict (``settle``); return what it says.

    The server should hold no other job (a fresh one per call): the fault's onset is read from
    the furthest step of any run on it, and every run on it is counted as this job's.
    ``judge=False`` returns once the job has exited, without waiting for the server's verdict.
    """
    fault = fault or Fault()
    rdzv_id = rdzv_id or f"{code}-{fault.kind}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    own_tmp = None
    if workdir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix=f"realjob-{code}-")
        workdir = own_tmp.name
    try:
        return _run_job(
            server, code, steps, fault, launch, nproc, workdir, env, timeout, settle_s,
            passes, rdzv_id, judge,
        )  # fmt: skip
    finally:
        if own_tmp is not None:
            own_tmp.cleanup()


def _run_job(
    server: Server,
    code: str,
    steps: int,
    fault: Fault,
    launch: str,
    nproc: int,
    workdir: str,
    env: dict[str, str] | None,
    timeout: float,
    settle_s: float,
    passes: int,
    rdzv_id: str,
    judge: bool,
) -> JobResult:
    cmd = launch_command(script_args(code, steps, workdir), launch, nproc, rdzv_id)
    job_env = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    job_env.update(
        FLEETLENS_SERVER=server.url,
        FLEETLENS_RELAY="off",  # no node agent here; an agent on the machine is not ours
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    job_env.update(env or {})
    log_path = os.path.join(workdir, "job.log")
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        # its own process group, so that a timeout ends the whole job and nothing else
        agent = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=job_env, cwd=workdir,
            start_new_session=True,
        )  # fmt: skip
    injector = _Injector(server, agent, fault) if fault.kind != "none" else None
    if injector:
        injector.start()
    try:
        returncode: int | None = agent.wait(timeout)
    except subprocess.TimeoutExpired:
        returncode = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(30)
    finally:
        if injector:
            injector.done.set()
            if fault.kind != "hang":
                injector.release()
    timings["job_s"] = time.monotonic() - t0
    if injector and fault.kind == "hang":
        # the hang's rank resumes on its own schedule; wait for that (bounded by stop_s)
        injector.join(fault.stop_s + 30)
        injector.release()
    runs = (_get(server, "/v1/runs") or {}).get("runs", [])
    run_ids = [r["runId"] for r in runs]
    run_id = rdzv_id if rdzv_id in run_ids and launch == "rdzv" else (run_ids or [None])[0]
    result = JobResult(
        code=code,
        launch=launch,
        fault=fault,
        steps=steps,
        returncode=returncode,
        output=_tail(log_path),
        run_ids=run_ids,
        run_id=run_id,
        runs=runs,
        timings=timings,
    )
    if injector:
        result.onset_step, result.onset_time = injector.onset_step, injector.onset_time
        result.fault_pid = injector.pid
        result.fault_how = injector.how
        if injector.error:
            result.output += f"\n[harness] fault not injected: {injector.error}"
    if run_id is None or not judge:
        return result
    t1 = time.monotonic()
    result.run = settle(server, run_id, settle_s, passes)
    timings["settle_s"] = time.monotonic() - t1
    if not result.run:  # the server answered nothing: what it was doing
        tail = _tail(server.log_path, 8_000)
        result.output += f"\n[harness] the server did not answer; its log:\n{tail}"
    q = urllib.parse.quote(run_id)
    result.runs = (_get(server, "/v1/runs") or {}).get("runs", result.runs)
    result.run_ids = [r["runId"] for r in result.runs]
    result.ranks = _get(server, f"/v1/runs/{q}/ranks") or {}
    result.goodput = _get(server, f"/v1/runs/{q}/goodput") or {}
    result.diagnosis = _get(server, f"/v1/runs/{q}/diagnosis") or {}
    cli = subprocess.run(
        [sys.executable, "-m", "fleetlens", "diagnose", run_id, "--server", server.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    result.diagnose_cli = cli.stdout + cli.stderr
    timings["total_s"] = time.monotonic() - t0
    return result


@contextlib.contextmanager
def fresh_server(env: dict[str, str] | None = None) -> Iterator[Server]:
    """A ``fleetlens serve`` of its own (data directory, port) for one job."""
    with tempfile.TemporaryDirectory(prefix="realjob-server-") as tmp:
        log = os.path.join(tmp, "server.log")
        server = Server(os.path.join(tmp, "data"), env=dict(env or {}), log_path=log).start()
        try:
            yield server
        finally:
            server.stop()
