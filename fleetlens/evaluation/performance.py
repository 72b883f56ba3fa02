"""Latency and cost of an evaluation, from its per-example usage: pure functions.

The worker records, for every example, the wall time of the model call (``latency_ms``) and the
tokens in and out (the model's own counts, else whitespace-separated words, flagged
``tokens_counted``). An evaluation's ``performance`` aggregates are their percentiles and means,
and, with a price table for its model or endpoint, its cost. They are stored as the pseudo
benchmark ``performance`` beside the real ones, so gates address them as
``performance/latency_p95_ms`` (or ``latency_p95_ms``) and the registry copies them like any metric.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from .doc_types import AdapterSpec, Price

__all__ = ["PERF_METRICS", "USAGE", "performance", "price_for"]

USAGE = ("latency_ms", "tokens_in", "tokens_out", "tokens_counted")
PERF_METRICS = (
    "latency_p50_ms", "latency_p95_ms", "latency_mean_ms", "tokens_in_mean", "tokens_out_mean",
    "cost_per_example", "cost_per_1k_examples", "cost_total",
)  # fmt: skip


def price_for(prices: dict[str, Any] | None, adapter: dict[str, Any]) -> Price | None:
    """The adapter's row of the price table: by model name, endpoint, callable or path, else
    ``*``; None when the table has none of them."""
    if not prices:
        return None
    a = AdapterSpec.of(adapter)
    for value in (a.model, a.base_url, a.target, a.path):
        if value and value in prices:
            return Price.model_validate(prices[value])
    return Price.model_validate(prices["*"]) if "*" in prices else None


def _stat(value: float, n: int) -> dict[str, float]:
    return {"mean": float(value), "stderr": 0.0, "n": n}


def performance(
    examples: Iterable[dict[str, Any]], price: Price | None
) -> dict[str, dict[str, float]]:
    """p50/p95/mean latency, mean tokens in/out and (priced) cost, over examples with usage."""
    rows = [e for e in examples if isinstance(e.get("latency_ms"), (int, float))]
    if not rows:
        return {}
    n = len(rows)
    lat = np.asarray([float(e["latency_ms"]) for e in rows])
    tin = [float(e.get("tokens_in", 0.0)) for e in rows]
    tout = [float(e.get("tokens_out", 0.0)) for e in rows]
    out = {
        "latency_p50_ms": _stat(float(np.percentile(lat, 50)), n),
        "latency_p95_ms": _stat(float(np.percentile(lat, 95)), n),
        "latency_mean_ms": _stat(float(lat.mean()), n),
        "tokens_in_mean": _stat(math.fsum(tin) / n, n),
        "tokens_out_mean": _stat(math.fsum(tout) / n, n),
    }
    if price is not None:
        pin, pout = price.input_per_1k_tokens, price.output_per_1k_tokens
        costs = [i / 1000.0 * pin + o / 1000.0 * pout for i, o in zip(tin, tout, strict=True)]
        total = math.fsum(costs)
        out["cost_per_example"] = _stat(total / n, n)
        out["cost_per_1k_examples"] = _stat(total / n * 1000.0, n)
        out["cost_total"] = _stat(total, n)
    return out
