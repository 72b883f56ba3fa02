"""Healthy-noise parameters, derived from real training data rather than guessed.

The simulator's healthy step is ``compute * (1 + rank_cov * e_rank) * (1 + step_cov * e_step)``
with independent standard normals per rank-step (``e_rank``) and per step (``e_step``). The two
coefficients come from public recordings in ``tests/data/real``:

- ``rank_cov``: the within-worker CoV of mini-batch time of Alibaba PAI ``job_2`` (the job the
  trace's authors call stable; jobs 3 and 4 contain stragglers), median over its workers.
- ``step_cov``: the white-noise part of a real job's step time: the robust (MAD) CoV of the
  step-to-step log difference of Megatron-LM's H100 ``iteration-time`` golden values, / sqrt(2).
  With 256 ranks this gives a job step-time CoV of ~0.7 %, the golden run's own robust CoV.

The other figures are recorded for the docs and the tests: PAI's across-worker CoV (which mixes
heterogeneous hardware and asynchronous training, so it is an upper bound for a dedicated
synchronous job; ``rank_offset_cov`` opts into persistent per-rank offsets of that size) and the
job-level CoV of the BigScience Megatron-DeepSpeed runs (V100, 2021).

``CALIBRATION`` holds the derived values; ``derive_calibration`` recomputes them from the files
(the test checks that both agree), so the constants are never edited by hand.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CALIBRATION", "Calibration", "derive_calibration"]


@dataclass(frozen=True)
class Calibration:
    rank_cov: float
    step_cov: float
    rank_offset_cov: float
    pai_across_worker_cov_median: float
    pai_across_worker_cov_p10: float
    megatron_h100_job_cov: float
    bigscience_job_cov: tuple[float, ...]
    megatron_h100_median_step_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


CALIBRATION = Calibration(
    rank_cov=0.01515,
    step_cov=0.00420,
    rank_offset_cov=0.0835,
    pai_across_worker_cov_median=0.0935,
    pai_across_worker_cov_p10=0.0352,
    megatron_h100_job_cov=0.00695,
    bigscience_job_cov=(0.0138, 0.0182),
    megatron_h100_median_step_s=1.435,
)
"""Recorded output of ``derive_calibration`` on ``tests/data/real`` (rounded)."""


def _robust_cov(x: np.ndarray[Any, Any]) -> float:
    med = float(np.median(x))
    return float(np.median(np.abs(x - med)) * 1.4826 / med)


def _pai(root: Path) -> tuple[float, float, float, float]:
    job = np.genfromtxt(root / "job_2_norm.csv", delimiter=",", skip_header=1)
    worker, t = job[:, 1].astype(int), job[:, 4]
    workers = np.unique(worker)
    within = [float(np.std(t[worker == w]) / np.mean(t[worker == w])) for w in workers]
    medians = np.array([np.median(t[worker == w]) for w in workers])
    offset = float(np.std(medians) / np.mean(medians))
    with open(root / "coefficient_variation.csv", newline="") as fh:
        rows = list(csv.reader(fh))[1:]
    per_job = [np.array([float(v) for v in r[1:] if v]) for r in rows]
    job_medians = np.array([np.median(v) for v in per_job if len(v)])
    every = np.concatenate(per_job)
    return (
        float(np.median(within)),
        offset,
        float(np.median(every)),
        float(np.percentile(job_medians, 10)),
    )


def _megatron(root: Path) -> tuple[float, float, float]:
    path = root / "gpt3_15b_8t_release__golden_values_dev_dgx_h100.json"
    values = json.loads(path.read_text())["iteration-time"]["values"]
    x = np.array([float(v) for v in values.values() if v != "nan"])
    d = np.diff(np.log(x))
    white = float(np.median(np.abs(d - np.median(d))) * 1.4826 / np.sqrt(2))
    return white, _robust_cov(x), float(np.median(x))


def _bigscience(root: Path) -> tuple[float, ...]:
    covs = []
    pattern = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
    for name in ("meg_ds_3d_gpt2_perf_n16-ds-off.out", "meg_ds_3d_gpt2_perf_n16-ds-on.out"):
        ms = [float(m) for m in pattern.findall((root / name).read_text(errors="replace"))]
        covs.append(_robust_cov(np.array(ms[2:])))  # the first two iterations are warm-up
    return tuple(covs)


def derive_calibration(data_dir: str | Path) -> Calibration:
    """Recompute every calibration figure from the real files under ``data_dir``."""
    real = Path(data_dir)
    rank_cov, offset, pai_median, pai_p10 = _pai(
        real / "cluster_traces" / "alibaba_pai_v2020_minibatch_time"
    )
    step_cov, h100_cov, h100_median = _megatron(
        real / "training_logs" / "megatron_lm_ci_golden_values"
    )
    return Calibration(
        rank_cov=rank_cov,
        step_cov=step_cov,
        rank_offset_cov=offset,
        pai_across_worker_cov_median=pai_median,
        pai_across_worker_cov_p10=pai_p10,
        megatron_h100_job_cov=h100_cov,
        bigscience_job_cov=_bigscience(real / "training_logs" / "bigscience_megatron_deepspeed"),
        megatron_h100_median_step_s=h100_median,
    )
