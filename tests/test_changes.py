"""Metric changes on a run's timeline: every series of a run judged in one pass.

A run that logs 10,000 metric names made its timeline take minutes (a mask and a call per name);
the series are now judged together. The answer must be the same as judging each alone.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from fleetlens.analysis.changes import metric_changes, series_changes
from fleetlens.testing import InProcessServer, scalar_grid, step_batch


def _key(changes: list[Any]) -> list[tuple[Any, ...]]:
    return [(c.step, c.name, c.what, c.end_step, repr(c.value)) for c in changes]


@pytest.mark.unit
def test_many_series_at_once_are_judged_as_each_alone() -> None:
    rng = np.random.default_rng(7)
    names, cuts, steps, values = [], [0], [], []
    for k in range(400):
        n = int(rng.integers(0, 80))
        v = rng.lognormal(0, rng.uniform(0.1, 1.2), n)
        if n and k % 7 == 0:
            v[rng.integers(0, n, 2)] = rng.choice([np.nan, np.inf, 40.0], 2)
        name = ("lr", "loss_scale")[k % 2] if k % 50 == 0 else f"metric/{k}"
        if name == "lr":  # a warmup then a drop: a schedule and a discrete change
            v = np.concatenate((np.linspace(0.0, 1e-3, n // 2), np.full(n - n // 2, 1e-4)))
        names.append(name)
        steps.append(np.sort(rng.choice(5000, n, replace=False)).astype(np.int64))
        values.append(v)
        cuts.append(cuts[-1] + n)
    s, v = np.concatenate(steps), np.concatenate(values)
    for since in (None, 0, 2500):
        alone = [
            c
            for k, name in enumerate(names)
            for c in metric_changes(name, steps[k], values[k], since=since)
        ]
        alone.sort(key=lambda c: (c.step, c.name))
        together = series_changes(names, cuts, s, v, since=since)
        assert _key(together) == _key(alone)
        assert {c.what for c in together} >= {"spike", "nonfinite", "schedule", "changed"}


@pytest.mark.api
def test_the_timeline_of_a_run_with_thousands_of_metric_names_names_its_spikes(
    app: InProcessServer,
) -> None:
    names, steps = 3000, 30
    t0 = time.time() - 3600
    assert app.post(step_batch("wide", range(steps), 1, t0=t0)[1])[0] == 200
    values = np.random.default_rng(0).uniform(1.0, 1.5, (steps, names))
    planted = {(12, 7): 50.0, (20, 1999): 80.0, (25, 2999): float("nan")}
    for (step, metric), value in planted.items():
        values[step, metric] = value
    body = scalar_grid("wide", [f"layer{i}/grad_norm" for i in range(names)], values, t0)
    assert app.post(body, encoding="gzip")[0] == 200
    timeline = app.get(f"/v1/runs/wide/timeline?fromStep=0&toStep={steps}")["items"]
    metric = [i for i in timeline if i["source"] == "metric"]
    assert [(i["step"], i["metric"], i["kind"]) for i in metric] == [
        (12, "layer7/grad_norm", "spike"),
        (20, "layer1999/grad_norm", "spike"),
        (25, "layer2999/grad_norm", "nonfinite"),
    ]
    assert [i["time"] for i in metric] == [t0 + 12, t0 + 20, t0 + 25]
