"""What a log's numbers say about the run's history, read after parsing (:func:`settle`).

A log states its iterations; restarts, start-up costs, slow periods and NaN losses are in the
numbers rather than in lines that name them. :func:`settle` turns them into the records the
server's analyses read, as the SDK would have sent them:

- An iteration time that is NaN or Inf is not a step: its rows leave the step table (the
  collector refuses non-finite durations) and are counted in the run's ``nonfinite`` tally and in
  a ``custom`` event, never dropped silently.
- A non-finite loss stays a NaN scalar (as the SDK keeps it) and adds a ``nan`` event at its step:
  the analysis diagnoses ``instability`` from it, and the goodput breakdown reads the event as a
  fault signal.
- A logged interval far above its neighbours is not training: ``restart_factor`` (2.5) times the
  median of the ``NEIGHBOURS`` (5) intervals on each side or more (more where the log's own
  noise is large: ``exp(6 sigma)``, sigma the robust spread of its log times), while the
  intervals beside it are not (a slow stretch is a level, not a spike). At the start of an
  attempt it is start-up (a resume, a compile, a warm-up), from ``slow_factor`` up: the excess
  becomes the time before the first step. Later in an attempt it is a restart the log does not
  mark (a record of iteration times only, such as Megatron-LM's CI golden values: a resume took
  9.7x the median there, under the 10x that was once the rule): the attempt ends there and a
  new one, with a ``restart`` event, starts after the excess. The breakdown charges that time
  to ``startup`` / ``recovery``, not to ``productive``.
- A slow period is a change in level: consecutive logged intervals, however many, at
  ``slow_factor`` (1.5) times the run's median or more (``exp(4.5 sigma)`` where the noise is
  larger), once the spikes are set apart: a ``custom`` event each (``attrs.slow_period``) and a
  line in the summary. A 2.4x interval beside a 1.7x one is one period of two intervals.
"""

from __future__ import annotations

import math

import msgspec
import numpy as np

from ..analysis.compare import slow_episodes
from .runlog import Attempt, ImportedRun, SlowPeriod

__all__ = ["SlowPeriod", "intervals", "settle"]

RESTART_FACTOR = 2.5
SLOW_FACTOR = 1.5
NEIGHBOURS = 5


def intervals(a: Attempt) -> list[tuple[int, int]]:
    """Index ranges ``[i, j)`` of the attempt's logged intervals: consecutive steps that share
    one reported time (a line reports the mean of the iterations since the previous line). The
    importer's ``reported`` steps end them; without those, consecutive equal times do."""
    out: list[tuple[int, int]] = []
    i = 0
    n = len(a.steps)
    while i < n:
        j = i + 1
        while (
            j < n
            and a.steps[j - 1] not in a.reported
            and a.durations[j] == a.durations[i]
            and a.steps[j] == a.steps[j - 1] + 1
            and math.isclose(a.times[j], a.times[j - 1] + a.durations[j - 1], abs_tol=1e-6)
        ):
            j += 1
        out.append((i, j))
        i = j
    return out


def _drop_nonfinite(run: ImportedRun, a: Attempt) -> None:
    bad = [i for i, d in enumerate(a.durations) if not math.isfinite(d)]
    if not bad:
        return
    first = bad[0]
    at = a.times[first] if math.isfinite(a.times[first]) else a.start
    steps = [a.steps[i] for i in bad]
    keep = [i for i in range(len(a.steps)) if math.isfinite(a.durations[i])]
    a.steps, a.times = [a.steps[i] for i in keep], [a.times[i] for i in keep]
    a.durations, a.tokens = [a.durations[i] for i in keep], [a.tokens[i] for i in keep]
    run.nonfinite["iteration_time"] = run.nonfinite.get("iteration_time", 0) + len(bad)
    a.event(
        at,
        "custom",
        steps[0],
        f"{len(bad)} iterations with a non-finite time (steps {steps[0]}..{steps[-1]}) "
        "left out of the step rows",
        nonfinite_iteration_time=len(bad),
        first_step=steps[0],
        last_step=steps[-1],
    )


def _split(a: Attempt, i0: int) -> Attempt:
    """The part of ``a`` from index ``i0`` on, as a new attempt (``a`` keeps the rest)."""
    cut = a.steps[i0]
    b = Attempt(job_id=a.job_id, start=a.times[i0])
    b.steps, b.times = a.steps[i0:], a.times[i0:]
    b.durations, b.tokens = a.durations[i0:], a.tokens[i0:]
    a.steps, a.times = a.steps[:i0], a.times[:i0]
    a.durations, a.tokens = a.durations[:i0], a.tokens[:i0]
    b.reported = {x for x in a.reported if x >= cut}
    a.reported -= b.reported
    for name, (s, v) in list(a.scalars.items()):
        k = next((x for x, step in enumerate(s) if step >= cut), len(s))
        if k < len(s):
            b.scalars[name] = (s[k:], v[k:])
            a.scalars[name] = (s[:k], v[:k])
    later = [e for e in a.events if e["kind"] != "job_start" and e["step"] >= cut]
    b.events = later
    a.events = [e for e in a.events if e not in later]
    return b


def _noise(run: ImportedRun, median: float) -> float:
    """The robust spread (sigma) of the log's interval times around their median, in log
    units: 1.4826 x the median absolute deviation of log(time / median)."""
    logs = [
        math.log(a.durations[i] / median)
        for a in run.attempts
        for i, _ in intervals(a)
        if a.durations[i] > 0
    ]
    if len(logs) < 3:
        return 0.0
    return 1.4826 * float(np.median(np.abs(np.asarray(logs) - np.median(logs))))


def _spike_at(durs: list[float], k: int, factor: float, slow: float) -> float | None:
    """Interval ``k``'s time over the median of its neighbours when it is a spike: ``factor``
    times them or more while the intervals beside it are under ``slow`` times them (None
    otherwise)."""
    around = durs[max(0, k - NEIGHBOURS) : k] + durs[k + 1 : k + 1 + NEIGHBOURS]
    if not around:
        return None
    local = float(np.median(around))
    if local <= 0 or durs[k] < factor * local:
        return None
    beside = [durs[x] for x in (k - 1, k + 1) if 0 <= x < len(durs)]
    if any(d >= slow * local for d in beside):
        return None  # a level, not a spike: a slow period if anything
    return local


def _spikes(run: ImportedRun, median: float, factor: float, slow: float) -> None:
    out: list[Attempt] = []
    todo = list(run.attempts)
    while todo:
        a = todo.pop(0)
        spans = intervals(a)
        durs = [a.durations[i] for i, _ in spans]
        for k, (i, j) in enumerate(spans):
            # The first interval of an attempt holds its warm-up: above the slow level, its
            # excess is start-up, not a slow period.
            local = _spike_at(durs, k, slow if k == 0 else factor, slow)
            if local is None:
                continue
            d = a.durations[i]
            n, began = j - i, a.times[i]
            excess = n * (d - local)
            for x in range(i, j):
                a.durations[x] = local
                a.times[x] = began + excess + (x - i) * local
            info = (
                f"iteration{'s' if n > 1 else ''} {a.steps[i]}"
                + (f"..{a.steps[j - 1]}" if n > 1 else "")
                + f" took {d:.4g} s each, {d / local:.1f} x the {local:.4g} s of the iterations"
                " around"
            )
            if k == 0:
                run.notes.append(f"start-up: {info}; {excess:.4g} s before the first step")
                run.startup_seconds += excess
                durs[0] = local
                continue
            run.notes.append(f"restart inferred: {info}")
            b = _split(a, i)
            b.event(
                began,
                "restart",
                b.steps[0],
                f"restart inferred: {info}",
                inferred="iteration time",
                excess_s=excess,
            )
            todo.insert(0, b)
            break
        out.append(a)
    if len(out) != len(run.attempts):
        base = run.attempts[0].job_id
        for k, a in enumerate(out):
            a.job_id = base if k == 0 else f"{base}.r{k}"
    run.attempts = out


def _slow_periods(run: ImportedRun, median: float, factor: float) -> None:
    pts: list[tuple[int, int, float, Attempt]] = []  # last step, first step, time, attempt
    for a in run.attempts:
        for i, j in intervals(a):
            pts.append((a.steps[j - 1], a.steps[i], a.durations[i], a))
    if not pts:
        return
    pts.sort(key=lambda p: p[0])
    steps = np.asarray([p[0] for p in pts])
    durs = np.asarray([p[2] for p in pts], dtype=np.float64)
    first = {p[0]: (p[1], p[3]) for p in pts}
    for ep in slow_episodes(steps, durs, factor, min_points=1):
        lo, owner = first[ep.from_step]
        hi = ep.to_step
        period = SlowPeriod(
            from_step=lo,
            to_step=hi,
            points=ep.points,
            median_seconds=ep.median_seconds,
            run_median_seconds=median,
            slowdown=ep.median_seconds / median,
        )
        run.slow_periods.append(period)
        owner.event(
            owner.time_at(lo),
            "custom",
            lo,
            f"slow period: steps {lo}..{hi} at {ep.median_seconds:.4g} s per iteration, "
            f"{period.slowdown:.1f} x the median {median:.4g} s",
            slow_period=msgspec.to_builtins(period),
        )


def _nan_losses(run: ImportedRun) -> None:
    for a in run.attempts:
        for name in ("loss", "grad_norm"):
            s, v = a.scalars.get(name, ([], []))
            bad = [k for k, x in enumerate(v) if not math.isfinite(x)]
            if not bad:
                continue
            run.nonfinite[name] = run.nonfinite.get(name, 0) + len(bad)
            step = s[bad[0]]
            if any(e["kind"] == "nan" and e["step"] == step for e in a.events):
                continue
            a.event(
                a.time_at(step),
                "nan",
                step,
                f"{name} is {v[bad[0]]} at step {step} ({len(bad)} non-finite values logged)",
                metric=name,
                value=str(v[bad[0]]),
                count=len(bad),
            )


def settle(
    run: ImportedRun, restart_factor: float = RESTART_FACTOR, slow_factor: float = SLOW_FACTOR
) -> ImportedRun:
    """Read restarts, start-up, slow periods and non-finite values out of a parsed run (see the
    module docstring). Changes ``run`` in place and returns it."""
    for a in run.attempts:
        _drop_nonfinite(run, a)
    durs = [d for a in run.attempts for d in a.durations]
    if durs:
        median = float(np.median(durs))
        if median > 0:
            sigma = _noise(run, median)
            slow = max(slow_factor, math.exp(4.5 * sigma))
            _spikes(run, median, max(restart_factor, math.exp(6.0 * sigma)), slow)
            _slow_periods(
                run, float(np.median([d for a in run.attempts for d in a.durations])), slow
            )
    _nan_losses(run)
    return run
