"""NeMo and torchtitan training logs -> an :class:`ImportedRun`.

Both print one line per logged step; neither marks a restart, which shows as the step counter
going back (a resume from a checkpoint) or, with a clock, as a wall-clock gap no step explains.

- **NeMo 2.0** (``nemo.lightning``'s progress printer): ``Training epoch 0, iteration 10/99 |
  lr: 1.499e-05 | global_batch_size: 8 | global_step: 10 | reduced_train_loss: 10.23 |
  train_step_timing in s: 0.5876 | consumed_samples: 88``; NeMo 1's progress bar keeps the same
  keys as ``key=value`` between brackets (``Epoch 0: ... [10:48<00:00, reduced_train_loss=0.0172,
  global_step=99.00, consumed_samples=25600.0, train_step_timing in s=3.130]``). The step time is
  ``train_step_timing in s``; there is no clock, so steps are laid end to end from ``--start``.
- **torchtitan** (``torchtitan.components.metrics``): ``[titan] 2025-03-25 10:45:08,217 - root -
  INFO - step: 10  loss:  8.1234  grad_norm:  1.2345  memory: 39.76GiB(41.84%)  tps: 1,014
  tflops: 58.69  mfu: 18.82%`` (older releases: ``wps``, no ``grad_norm``), colour codes and a
  ``[rank0]:`` prefix allowed. The stamps are the clock: the steps since the previous line share
  the time between the two lines. ``Training starts at step 1, with local batch size 8, global
  batch size 64, ..., sequence length 8192, total steps 1000`` gives the tokens per step.

Scalars: ``loss``, ``lr``, ``grad_norm``, ``mfu`` (a fraction), ``tps``, ``tflops``,
``memory_reserved_gib``, ``consumed_samples``; what the numbers say (restarts, start-up, slow
periods, NaN) is read by :func:`fleetlens.importers.episodes.settle`.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from pathlib import Path

from ..errors import ConfigError
from .episodes import settle
from .runlog import Attempt, ImportedRun

__all__ = ["read_nemo", "read_torchtitan"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NEMO2 = re.compile(r"Training epoch (\d+), iteration (\d+)/(\d+) \| (.*)$")
_NEMO1 = re.compile(r"Epoch (\d+): .*\[[^\]]*?(\breduced_train_loss=.*)\]")
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[,.](\d{3})")
_TITAN = re.compile(
    r"\bstep:\s*(\d+)\s+loss:\s*(\S+)(?:\s+grad_norm:\s*(\S+))?\s+memory:\s*([\d.]+)GiB"
    r"\(([\d.]+)%\)\s+(?:tps|wps):\s*([\d,]+)(?:\s+tflops:\s*([\d,.]+)\s+mfu:\s*([\d.]+)%)?"
)
_TITAN_START = re.compile(r"Training starts at step (\d+)(.*)$")
_TITAN_CKPT = re.compile(r"Finished saving the checkpoint.*?in ([\d.]+) seconds")
_TITAN_MESH = re.compile(r"device mesh with \[[^\]]*\], \[([\d, ]+)\]")
_NEMO_WORLD = re.compile(r"MEMBER: \d+/(\d+)")
_NUM_KEYS = {
    "local batch size": "local_batch_size",
    "global batch size": "global_batch_size",
    "sequence length": "seq_len",
    "total steps": "total_steps",
    "gradient accumulation steps": "grad_accum_steps",
}
_NEMO_SCALARS = {
    "reduced_train_loss": "loss",
    "lr": "lr",
    "val_loss": "val_loss",
    "grad_norm": "grad_norm",
    "consumed_samples": "consumed_samples",
}


def _float(raw: str) -> float:
    try:
        return float(raw.replace(",", ""))
    except ValueError:
        return math.nan  # "nan", "inf" parse; anything else is not a number


def _stamp(m: re.Match[str]) -> float:
    """A logging stamp (``2025-03-25 10:45:08,217``), read as UTC."""
    t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    return t.timestamp() + int(m.group(2)) / 1000.0


def _read(path: str | Path) -> tuple[Path, list[str]]:
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc}") from exc
    # Progress bars rewrite their line with carriage returns: each update is a line.
    return p, [_ANSI.sub("", ln) for ln in re.split(r"[\r\n]+", text)]


class _Attempts:
    """Attempts of a run whose step counter may go back (a resume from a checkpoint)."""

    def __init__(self, run: ImportedRun, job_id: str) -> None:
        self.run, self.job_id, self.last = run, job_id, -1
        self.current: Attempt | None = None

    def at(self, step: int, start: float) -> Attempt:
        """The attempt ``step`` belongs to: a new one when the counter went back."""
        if self.current is None or step <= self.last:
            self.new(step, start)
        self.last = step
        assert self.current is not None
        return self.current

    def new(self, step: int, start: float) -> Attempt:
        k = len(self.run.attempts)
        a = Attempt(job_id=self.job_id if k == 0 else f"{self.job_id}.r{k}", start=start)
        a.event(start, "job_start", step - 1, f"attempt {k}")
        if k:
            a.event(start, "restart", step - 1, f"resumed at step {step}")
        self.run.attempts.append(a)
        self.current = a
        self.last = step
        return a

    def finish(self, path: str, what: str, total: int) -> ImportedRun:
        if not self.run.attempts:
            raise ConfigError(f"{path}: no {what} step lines found")
        last = self.run.attempts[-1]
        if total and last.steps and last.steps[-1] >= total:
            end = last.times[-1] + (last.durations[-1] if math.isfinite(last.durations[-1]) else 0)
            end = max([end, *(e["time"] for e in last.events)])  # after a final save, too
            last.event(end, "finish", last.steps[-1], f"step {last.steps[-1]} of {total}")
        return settle(self.run)


def read_nemo(path: str | Path, *, start: float = 1.7e9, job_id: str = "a0") -> ImportedRun:
    """A NeMo training log (stdout of a NeMo 2.0 or NeMo 1 run)."""
    p, lines = _read(path)
    run = ImportedRun(source="nemo", path=str(p), clock="synthetic")
    runs = _Attempts(run, job_id)
    total = 0
    seen: dict[int, tuple[int, float]] = {}  # NeMo 1 bars repeat a step while it runs
    for line in lines:
        wm = _NEMO_WORLD.search(line)
        if wm:
            run.world_size = int(wm.group(1))
            continue
        f: dict[str, float] = {}
        m2 = _NEMO2.search(line)
        if m2:
            total = int(m2.group(3))
            for part in m2.group(4).split(" | "):
                key, _, raw = part.rpartition(": ")
                if key:
                    f[key.strip()] = _float(raw.strip())
            step = int(f.get("global_step", int(m2.group(2))))
        else:
            m1 = _NEMO1.search(line)
            if not m1:
                continue
            for part in m1.group(2).split(", "):
                key, _, raw = part.partition("=")
                f[key.strip()] = _float(raw.strip())
            if not math.isfinite(f.get("global_step", math.nan)):
                continue
            step = int(f["global_step"])
        dur = f.get("train_step_timing in s", math.nan)
        if "global_batch_size" in f and math.isfinite(f["global_batch_size"]):
            run.config["global_batch_size"] = int(f["global_batch_size"])
        if seen.get(step, (None, None))[0] == len(run.attempts) and not m2:
            continue  # the same bar step again
        a = runs.at(step, start)
        seen[step] = (len(run.attempts), dur)
        t = (
            a.times[-1] + (a.durations[-1] if math.isfinite(a.durations[-1]) else 0.0)
            if a.steps
            else a.start
        )
        a.steps.append(step)
        a.times.append(t)
        a.durations.append(dur)
        a.tokens.append(0)
        a.reported.add(step)
        for key, name in _NEMO_SCALARS.items():
            if key in f:
                a.scalar(name, step, f[key])
    if run.attempts and len(run.attempts) > 1:
        # Laid end to end, a resumed attempt starts where the previous one stopped.
        for prev, a in zip(run.attempts, run.attempts[1:], strict=False):
            end = prev.times[-1] + (prev.durations[-1] if math.isfinite(prev.durations[-1]) else 0)
            shift = end - a.start
            a.start += shift
            a.times = [t + shift for t in a.times]
            for e in a.events:
                e["time"] += shift
    run.notes.append("no clock in a NeMo log: steps laid end to end from --start")
    return runs.finish(str(p), "NeMo", total)


def read_torchtitan(path: str | Path, *, start: float = 0.0, job_id: str = "a0") -> ImportedRun:
    """A torchtitan training log (its stdout, one rank or all with ``[rankN]:`` prefixes)."""
    del start  # the log's stamps are the clock
    p, lines = _read(path)
    run = ImportedRun(source="torchtitan", path=str(p), clock="log")
    runs = _Attempts(run, job_id)
    prev: tuple[int, float] | None = None  # the last (step, stamp) of the attempt
    begin: float | None = None  # the stamp of the latest "Training starts"
    saving = 0.0  # checkpoint seconds since the last step line: not step time
    for line in lines:
        sm = _STAMP.search(line)
        stamp = _stamp(sm) if sm else None
        mm = _TITAN_MESH.search(line)
        if mm:
            run.world_size = math.prod(int(x) for x in mm.group(1).split(",") if x.strip())
            continue
        cm = _TITAN_CKPT.search(line)
        if cm and runs.current is not None and prev is not None and stamp is not None:
            saving += float(cm.group(1))
            runs.current.event(
                stamp, "checkpoint_end", prev[0], "checkpoint saved", duration_s=float(cm.group(1))
            )
            continue
        hs = _TITAN_START.search(line)
        if hs:
            for label, key in _NUM_KEYS.items():
                m = re.search(rf"{label} (\d+)", hs.group(2))
                if m:
                    run.config[key] = int(m.group(1))
            runs.current = None  # a (re)start: the next step line opens an attempt
            prev = (int(hs.group(1)) - 1, stamp) if stamp is not None else None
            begin = stamp
            continue
        m = _TITAN.search(line)
        if not m or "validate step" in line or stamp is None:
            continue
        step = int(m.group(1))
        if runs.current is not None and step <= runs.last:
            runs.current, prev, begin = None, None, None  # the counter went back: a resume
        if runs.current is None:
            a = runs.new(prev[0] + 1 if prev else step, begin if begin is not None else stamp)
        else:
            a = runs.current
            runs.last = step
        if prev is not None and step > prev[0]:
            n = step - prev[0]
            t0 = prev[1] + min(saving, stamp - prev[1])  # the save came before these steps
            dur = (stamp - t0) / n
            tokens = int(run.config.get("global_batch_size", 0) * run.config.get("seq_len", 0))
            for k, s in enumerate(range(prev[0] + 1, step + 1)):
                a.steps.append(s)
                a.times.append(t0 + k * dur)
                a.durations.append(dur)
                a.tokens.append(tokens)
        a.reported.add(step)
        prev, saving = (step, stamp), 0.0
        a.scalar("loss", step, _float(m.group(2)))
        if m.group(3):
            a.scalar("grad_norm", step, _float(m.group(3)))
        a.scalar("memory_reserved_gib", step, _float(m.group(4)))
        a.scalar("tps", step, _float(m.group(6)))
        if m.group(7):
            a.scalar("tflops", step, _float(m.group(7)))
            a.scalar("mfu", step, _float(m.group(8)) / 100.0)
    return runs.finish(str(p), "torchtitan", int(run.config.get("total_steps", 0)))
