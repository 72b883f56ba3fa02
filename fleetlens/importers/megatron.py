"""Megatron-LM / Megatron-DeepSpeed logs -> an :class:`ImportedRun`.

Reads the iteration lines (``iteration N/ M | consumed samples | elapsed time per iteration
(ms) | learning rate | lm loss | loss scale | grad norm | number of skipped/nan iterations``),
the ``arguments`` block (the run's config), the launch command, the ``datetime:`` stamps (the
clock) and Slurm's ``CANCELLED`` lines (how the job ended). A line reports the mean time of the
iterations since the previous line (``--log-interval``); each of those iterations gets that mean.
A restart shows as a fresh start (Megatron initialising again, or the iteration counter going
back) and becomes a new job attempt.

Also reads Megatron-LM's CI golden values (``{metric: {start_step, end_step, step_interval,
values}}``): ``iteration-time`` (recorded every ``--log-interval`` steps) gives the step times,
``lm loss`` the loss, the memory metrics their scalars. They carry no clock: times start at
``start`` and follow the step times (``clock == "synthetic"``).
"""

from __future__ import annotations

import calendar
import json
import math
import re
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .episodes import settle
from .runlog import Attempt, ImportedRun

__all__ = ["parse_golden_values", "parse_megatron_log", "read_megatron"]

# An iteration line, as Megatron-LM and Megatron-DeepSpeed print it: optionally behind a
# launcher's ``[default0]:`` prefix and Megatron-LM's ``[YYYY-mm-dd HH:MM:SS(.ffffff)]`` stamp (the
# time the line was printed: the end of the iterations it reports).
_ITER = re.compile(
    r"^(?:\[[\w.-]+\]:)?\s*(?:\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]\s*)?"
    r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$"
)
_PADDED_VOCAB = re.compile(r"padded vocab \(size: \d+\).*\(new size: (\d+)\)")
_STAMP = re.compile(r"datetime:\s*(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
_DS_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[,.]\d+\]")
_INIT = "[after megatron is initialized]"
_INIT_TIME = re.compile(r"time to initialize megatron \(seconds\):\s*([\d.]+)")
_CANCEL = re.compile(
    r"\*\*\* (JOB|STEP) (\S+) ON (\S+) CANCELLED AT (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(.*?)\*\*\*"
)
_ARG = re.compile(r"^\s+(\w+) \.{2,} (.*?)\s*$")
_SCALARS = {
    "learning rate": "lr",
    "lm loss": "loss",
    "loss": "loss",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
    "consumed samples": "consumed_samples",
    "global batch size": "global_batch_size",
}


def _utc(stamp: str, fmt: str = "%Y-%m-%d %H:%M:%S") -> float:
    return float(calendar.timegm(time.strptime(stamp, fmt)))


def _value(text: str) -> Any:
    t = text.strip()
    if t in ("None", "none"):
        return None
    if t in ("True", "False"):
        return t == "True"
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def _fields(rest: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in rest.split("|"):
        if ":" not in part:
            continue
        key, _, val = part.partition(":")
        key = key.strip().lower().replace("-", " ")
        try:
            out[key] = float(val.strip())
        except ValueError:
            continue
    return out


def _utc_stamp(stamp: str) -> float:
    whole, _, frac = stamp.partition(".")
    return _utc(whole) + (float("0." + frac) if frac else 0.0)


def _model(run: ImportedRun, padded_vocab: int) -> None:
    """World size, parallelism and what MFU needs (``fleetlens.services.goodput.program_spec``'s
    keys), from the arguments block."""
    c = run.config

    def num(key: str) -> int:
        v = c.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    tp, pp = num("tensor_model_parallel_size") or 1, num("pipeline_model_parallel_size") or 1
    world = num("world_size") or (tp * pp * num("data_parallel_size"))
    if world > 0:
        run.world_size = world
        c.setdefault("devices", world)
        if not num("data_parallel_size") and world % (tp * pp) == 0:
            c["data_parallel_size"] = world // (tp * pp)
    layers, hidden = num("num_layers"), num("hidden_size")
    seq = num("seq_length") or num("encoder_seq_length")
    if layers and hidden:
        ffn = num("ffn_hidden_size") or 4 * hidden
        mlp = (3 if c.get("swiglu") is True else 2) * hidden * ffn
        n_params = layers * (4 * hidden * hidden + mlp) + padded_vocab * hidden
        c.update(n_layers=layers, d_model=hidden, seq_len=seq, n_params=float(n_params))
        run.notes.append(
            f"n_params {n_params:.4g} estimated from num_layers, hidden_size, ffn_hidden_size"
            + (
                f" and the padded vocabulary ({padded_vocab})"
                if padded_vocab
                else " (vocabulary size not in the log: embeddings not counted)"
            )
        )
    if "dtype" not in c:
        c["dtype"] = "bf16" if c.get("bf16") is True else "fp16" if c.get("fp16") is True else ""
        if not c["dtype"]:
            del c["dtype"]


def parse_megatron_log(text: str, path: str = "", job_id: str = "") -> ImportedRun:
    """Parse the text of a Megatron(-DeepSpeed) log (see the module docstring)."""
    run = ImportedRun(source="megatron", path=path)
    m = re.search(r"-(\d{5,})\.out$", path)
    base_job = job_id or (m.group(1) if m else "") or "a0"
    lines = text.splitlines()
    in_args = False
    clock: float | None = None
    attempt: Attempt | None = None
    last_iter = 0
    seen_iter = False
    log_interval = 1
    padded_vocab = 0
    between = ""  # what the log said since the previous iteration line (saves, evaluations)
    end: tuple[str, float, str] | None = None
    # The attempt's launch as the log tells it: its first stamp, or Megatron's own "time to
    # initialize megatron" before its init stamp (start-up runs from there to iteration 1).
    launched: float | None = None
    init_s: float | None = None
    begin = 0.0
    for line in lines:
        if "----- arguments -----" in line:
            in_args = True
            continue
        if in_args:
            if "end of arguments" in line:
                in_args = False
                log_interval = int(run.config.get("log_interval") or 1)
                continue
            am = _ARG.match(line)
            if am:
                run.config[am.group(1)] = _value(am.group(2))
            continue
        if not run.launch_command and "pretrain_" in line and ".py" in line and "CMD=" in line:
            run.launch_command = " ".join(line.split("CMD=", 1)[1].strip(" '").split())
        pv = _PADDED_VOCAB.search(line)
        if pv:
            padded_vocab = int(pv.group(1))
        sm = _STAMP.search(line) or _DS_STAMP.match(line)
        if sm:
            clock = _utc(sm.group(1))
            if _INIT in line and seen_iter:
                attempt = None  # Megatron initialised again: a restart
                launched = None
            if attempt is None:
                # Megatron prints its init time just before its init stamp: the launch was
                # that long before the stamp.
                at = clock - init_s if init_s is not None else clock
                launched = at if launched is None else min(launched, at)
                init_s = None
        im_init = _INIT_TIME.search(line)
        if im_init and attempt is None:
            init_s = float(im_init.group(1))
        cm = _CANCEL.search(line)
        if cm and cm.group(1) == "JOB":
            reason = "time_limit" if "TIME LIMIT" in cm.group(5) else "cancelled"
            end = (reason, _utc(cm.group(4), "%Y-%m-%dT%H:%M:%S"), line.strip())
            base_job = job_id or cm.group(2)
            continue
        im = _ITER.match(line)
        if not im:
            if "saving checkpoint" in line:
                between += " checkpoint"
            elif "validation loss at" in line:
                between += " evaluation"
            continue
        stamp = _utc_stamp(im.group(1)) if im.group(1) else None
        it, total = int(im.group(2)), int(im.group(3))
        f = _fields(im.group(4))
        ms = f.get("elapsed time per iteration (ms)")
        dur = ms / 1000.0 if ms is not None else math.nan
        if attempt is not None and it <= last_iter:
            attempt = None  # the counter went back: a fresh start from a checkpoint
        if attempt is not None and stamp is not None and attempt.steps and math.isfinite(dur):
            prev_end = attempt.times[-1] + attempt.durations[-1]
            gap = stamp - (it - last_iter) * dur - prev_end
            med = sorted(attempt.durations)[len(attempt.durations) // 2]
            if gap > 0 and "checkpoint" in between:
                attempt.event(
                    prev_end + gap,
                    "checkpoint_end",
                    last_iter,
                    "checkpoint saved between iteration lines",
                    duration_s=gap,
                )
            elif gap > 0 and "evaluation" in between:
                attempt.event(
                    prev_end,
                    "custom",
                    last_iter,
                    "evaluation between iteration lines",
                    category="evaluation",
                    duration=gap,
                )
            elif gap >= max(60.0, 10.0 * med):
                attempt = None  # a wall-clock gap no save or evaluation explains: a restart
        between = ""
        if attempt is None:
            k = len(run.attempts)
            prev = max(0, it - log_interval)
            # Its iterations begin at the last stamp before them (Megatron's "before the start
            # of training step"), else where its first line's stamp puts them; the attempt
            # began at its launch (its first stamp, or Megatron's init time before its init
            # stamp): the time between is its start-up.
            begin = clock if clock is not None else 0.0
            if stamp is not None and math.isfinite(dur):
                first = stamp - max(1, it - prev) * dur
                begin = clock if clock is not None and clock <= first else first
            start = min(launched, begin) if launched is not None else begin
            launched = None
            if begin > start:
                run.startup_seconds += begin - start
                run.notes.append(
                    f"start-up: {begin - start:.4g} s from the attempt's launch (its first "
                    "stamp, or Megatron's init time before it) to its first iteration"
                )
            attempt = Attempt(job_id=base_job if k == 0 else f"{base_job}.r{k}", start=start)
            attempt.event(start, "job_start", prev, f"attempt {k}")
            if k:
                attempt.event(start, "restart", prev, f"fresh start {k}")
            run.attempts.append(attempt)
            last_iter = prev
        seen_iter = True
        n = max(1, it - last_iter)
        gbs = f.get("global batch size") or float(run.config.get("global_batch_size") or 0)
        seq = float(run.config.get("seq_length") or 0)
        if attempt.steps:
            t = attempt.times[-1] + (
                attempt.durations[-1] if math.isfinite(attempt.durations[-1]) else 0.0
            )
        else:
            t = begin
        if stamp is not None:
            # The stamp is when the line was printed: the reported iterations end there.
            t = max(t, stamp - n * dur) if math.isfinite(dur) else max(t, stamp)
        for s in range(it - n + 1, it + 1):
            attempt.steps.append(s)
            attempt.times.append(t)
            attempt.durations.append(dur)
            attempt.tokens.append(int(gbs * seq))
            t += dur if math.isfinite(dur) else 0.0
        attempt.reported.add(it)
        if stamp is not None:
            clock = stamp
        for key, name in _SCALARS.items():
            if key in f and name != "global_batch_size":
                attempt.scalar(name, it, f[key])
        if f.get("number of nan iterations", 0) > 0:
            attempt.event(
                t, "nan", it, "Megatron counted NaN iterations", count=f["number of nan iterations"]
            )
        last_iter = it
        if it >= total and attempt is run.attempts[-1]:
            end = ("finished", t, f"iteration {it}/{total}")
    if not run.attempts:
        raise ConfigError(f"{path or 'log'}: no Megatron iteration lines found")
    _model(run, padded_vocab)
    last = run.attempts[-1]
    if end is not None:
        reason, at, message = end
        fin = [x + d for x, d in zip(last.times, last.durations, strict=True) if math.isfinite(d)]
        at = max([at, *fin[-1:]])
        if reason == "finished":
            last.event(at, "finish", last.steps[-1], message)
        else:
            # The scheduler ended it (its time limit, or scancel): the job was stopped, not
            # failed, and nothing recovers from it. Its last unlogged iterations are work lost
            # to the scheduler, as to a preemption (the breakdown's rework by preemption).
            last.event(at, "preemption", last.steps[-1], message, end=reason, scheduler="slurm")
    if log_interval > 1:
        run.notes.append(
            f"log interval {log_interval}: each iteration of an interval has the interval's mean"
        )
    return settle(run)


def parse_golden_values(
    data: dict[str, Any], path: str = "", start: float = 1.7e9, job_id: str = "ci"
) -> ImportedRun:
    """Megatron-LM CI golden values -> a run (synthetic clock from ``start``)."""
    run = ImportedRun(source="megatron-golden", path=path, clock="synthetic")
    it = data.get("iteration-time")
    if not isinstance(it, dict) or "values" not in it:
        raise ConfigError(f"{path}: no iteration-time metric in the golden values")

    def raw(metric: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for k, v in ((data.get(metric) or {}).get("values") or {}).items():
            try:
                out[int(k)] = float(v)
            except (TypeError, ValueError):
                continue
        return out

    metrics = {m: raw(m) for m in data if m != "iteration-time"}

    def recorded(step: int) -> bool:
        """Some metric has a value at ``step``: a "nan" there is a value, not a gap."""
        return any(math.isfinite(v.get(step, math.nan)) for v in metrics.values())

    def series(metric: str) -> list[tuple[int, float]]:
        vals = raw(metric) if metric == "iteration-time" else metrics.get(metric, {})
        # CI writes "nan" where nothing was recorded (between log intervals, after the run
        # stopped). A non-finite loss where other metrics were recorded is a NaN loss.
        keep = metric == "lm loss"
        return sorted((k, x) for k, x in vals.items() if math.isfinite(x) or (keep and recorded(k)))

    times = series("iteration-time")
    if not times:
        raise ConfigError(f"{path}: iteration-time has no numeric values")
    a = Attempt(job_id=job_id, start=start)
    a.event(start, "job_start", 0, "CI run")
    t, prev = start, int(it.get("start_step", 1)) - 1
    for step, dur in times:
        for s in range(prev + 1, step + 1):
            a.steps.append(s)
            a.times.append(t)
            a.durations.append(dur)
            a.tokens.append(0)
            t += dur
        a.reported.add(step)
        prev = step
    for metric, name in (
        ("lm loss", "loss"),
        ("num-zeros", "num_zeros"),
        ("mem-allocated-bytes", "mem_allocated_bytes"),
        ("mem-max-allocated-bytes", "mem_max_allocated_bytes"),
    ):
        for step, v in series(metric):
            a.scalar(name, step, v)
    if prev >= int(it.get("end_step", prev)):
        a.event(t, "finish", prev, "recorded to end_step")
    run.attempts.append(a)
    run.notes.append(
        f"iteration-time recorded every {times[1][0] - times[0][0] if len(times) > 1 else 1} "
        "steps; each step of an interval has the interval's value"
    )
    last = max((k for v in metrics.values() for k, x in v.items() if math.isfinite(x)), default=0)
    end_step = int(it.get("end_step", last))
    if last < end_step:
        run.notes.append(f"nothing recorded after step {last} (end_step {end_step})")
    return settle(run)


def read_megatron(path: str | Path, *, start: float = 1.7e9, job_id: str = "") -> ImportedRun:
    """A Megatron log file, or a golden values JSON file (by its content)."""
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc}") from exc
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{p}: not valid JSON: {exc}") from exc
        return parse_golden_values(data, str(p), start, job_id or "ci")
    return parse_megatron_log(text, str(p), job_id)
