"""Why ranks waited for data: the shard they read, the storage, the prefetch, the cache.

Seed 001 s13 and s27: a data stall is traced from the ranks' data wait to the dataset shard and
the storage latency. Given which rank-steps of a window stalled (their data wait over the
threshold), :func:`data_causes` compares the stalled rank-steps with the others of the same
window:

- **shard**: the shard each rank was reading at each step (the last ``data_shard`` event of the
  rank at or before the step). A shard is blamed when at least half of the rank-steps that read
  it stalled while under a tenth of the rank-steps on other shards did.
- **storage**: the p99 of the storage read latency of the stalled rank-steps is at least 3x that
  of the others.
- **prefetch**: the prefetch queue was empty (median depth under 0.5) in the stalled rank-steps
  and not in the others (median at least 1).
- **cache**: the cache hit rate of the stalled rank-steps is at least 20 points below the others'.

Each cause found is a phrase for the finding's summary and an evidence entry; signals the job
does not send (``Run.data``) are simply absent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..scalars import DATA_SCALARS
from .evidence import Evidence

__all__ = ["data_causes"]

Arr = npt.NDArray[Any]
_SHARD_BLAME, _SHARD_REST = 0.5, 0.1
_LATENCY_RATIO = 3.0
_CACHE_DROP = 0.2


def _shards(
    steps: Arr, stalled: npt.NDArray[np.bool_], shard_events: list[tuple[int, int, str]]
) -> tuple[list[str], list[Evidence]]:
    names: dict[str, int] = {}
    code = np.full(stalled.shape, -1, dtype=np.int64)  # shard read by (step row, rank), -1 unknown
    by_rank: dict[int, list[tuple[int, int]]] = {}
    for rank, step, shard in sorted(shard_events, key=lambda e: (e[0], e[1])):
        by_rank.setdefault(rank, []).append((step, names.setdefault(shard, len(names))))
    for rank, evs in by_rank.items():
        if not 0 <= rank < stalled.shape[1]:
            continue
        at = np.asarray([s for s, _ in evs])
        idx = np.searchsorted(at, steps, side="right") - 1
        codes = np.asarray([c for _, c in evs])
        code[:, rank] = np.where(idx >= 0, codes[np.maximum(idx, 0)], -1)
    known = code >= 0
    if not (known & stalled).any():
        return [], []
    label = {c: n for n, c in names.items()}
    blamed: list[tuple[float, str, int, int]] = []
    for c in np.unique(code[known & stalled]):
        on = code == c
        rest = known & ~on
        frac = float(stalled[on].mean())
        rest_frac = float(stalled[rest].mean()) if rest.any() else 0.0
        if frac >= _SHARD_BLAME and rest_frac < _SHARD_REST and int(stalled[on].sum()) >= 3:
            blamed.append((frac, label[int(c)], int(stalled[on].sum()), int(on.sum())))
    blamed.sort(reverse=True)
    phrases = [f"dataset shard {', '.join(b[1] for b in blamed[:3])}"] if blamed else []
    evidence: list[Evidence] = [
        {
            "metric": "dataset shard",
            "value": name,
            "stalled_rank_steps": hit,
            "rank_steps": total,
            "stalled_share": frac,
        }
        for frac, name, hit, total in blamed[:3]
    ]
    return phrases, evidence


def _grid(
    steps: Arr, world: int, series: tuple[Arr, Arr, Arr] | None
) -> npt.NDArray[np.float64] | None:
    """Scalar values laid out as the stall matrix (step rows x ranks), NaN where absent."""
    if series is None:
        return None
    st, rk, v = series
    row = np.searchsorted(steps, st)
    ok = (row < len(steps)) & (rk >= 0) & (rk < world)
    ok[ok] &= steps[row[ok]] == st[ok]
    out = np.full((len(steps), world), np.nan)
    out[row[ok], rk[ok]] = v[ok]
    return out


def _split(grid: npt.NDArray[np.float64] | None, stalled: npt.NDArray[np.bool_]) -> tuple[Arr, Arr]:
    if grid is None:
        return np.empty(0), np.empty(0)
    s, o = grid[stalled], grid[~stalled]
    return s[np.isfinite(s)], o[np.isfinite(o)]


def data_causes(
    steps: Arr,
    stalled: npt.NDArray[np.bool_],
    shard_events: list[tuple[int, int, str]],
    scalars: dict[str, tuple[Arr, Arr, Arr]],
) -> tuple[list[str], list[Evidence]]:
    """The causes of a data stall: phrases for the summary and evidence entries.

    ``steps`` are the window's step numbers (ascending), ``stalled`` is steps x ranks (True
    where the rank's data wait was over the threshold), ``shard_events`` are (rank, step, shard)
    of the attempt, ``scalars`` name -> (steps, ranks, values) of :data:`DATA_SCALARS`."""
    world = stalled.shape[1]
    phrases, evidence = _shards(steps, stalled, shard_events)
    lat_s, lat_o = _split(_grid(steps, world, scalars.get(DATA_SCALARS["read_latency_s"])), stalled)
    if len(lat_s) and len(lat_o):
        p_s, p_o = float(np.percentile(lat_s, 99)), float(np.percentile(lat_o, 99))
        if p_o > 0 and p_s >= _LATENCY_RATIO * p_o:
            phrases.append(
                f"storage read latency p99 {p_s * 1000:.0f} ms (typical {p_o * 1000:.0f} ms)"
            )
            evidence.append(
                {"metric": DATA_SCALARS["read_latency_s"] + " p99", "value": p_s, "baseline": p_o}
            )
    q_s, q_o = _split(_grid(steps, world, scalars.get(DATA_SCALARS["queue_depth"])), stalled)
    if len(q_s) and len(q_o):
        m_s, m_o = float(np.median(q_s)), float(np.median(q_o))
        if m_s < 0.5 <= 1.0 <= m_o:
            phrases.append(f"prefetch queue empty (typical depth {m_o:.0f})")
            evidence.append(
                {"metric": DATA_SCALARS["queue_depth"] + " median", "value": m_s, "baseline": m_o}
            )
    c_s, c_o = _split(_grid(steps, world, scalars.get(DATA_SCALARS["cache_hit_rate"])), stalled)
    if len(c_s) and len(c_o):
        h_s, h_o = float(np.median(c_s)), float(np.median(c_o))
        if h_s <= h_o - _CACHE_DROP:
            phrases.append(f"cache hit rate {h_s:.0%} (typical {h_o:.0%})")
            evidence.append(
                {
                    "metric": DATA_SCALARS["cache_hit_rate"] + " median",
                    "value": h_s,
                    "baseline": h_o,
                }
            )
    return phrases, evidence
