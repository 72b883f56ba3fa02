"""Importers of scheduler records into the ``sched_alloc`` / ``sched_pool`` record kinds.

Each importer returns :class:`Allocations` (column arrays named as ``schema.SCHED_ALLOC``'s
columns, plus ``gpu_share``, the fractional GPUs of a GPU-sharing pod that the schema's integer
``gpus`` cannot hold) and, where the source describes capacity, :class:`PoolRows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Allocations", "PoolRows"]


@dataclass(frozen=True)
class Allocations:
    pool: npt.NDArray[Any]
    job_id: npt.NDArray[Any]
    run_id: npt.NDArray[Any]
    gpus: npt.NDArray[np.int32]
    gpu_share: npt.NDArray[np.float64]
    submit: npt.NDArray[np.float64]
    start: npt.NDArray[np.float64]
    gang_complete: npt.NDArray[np.float64]
    end: npt.NDArray[np.float64]
    state: npt.NDArray[Any]

    def __len__(self) -> int:
        return len(self.job_id)

    def columns(self) -> dict[str, npt.NDArray[Any]]:
        """The ``sched_alloc`` columns, ready for ``pa.table(...)`` and the store's insert."""
        return {
            "pool": self.pool,
            "job_id": self.job_id,
            "run_id": self.run_id,
            "gpus": self.gpus,
            "submit": self.submit,
            "start": self.start,
            "gang_complete": self.gang_complete,
            "end": self.end,
            "state": self.state,
        }


@dataclass(frozen=True)
class PoolRows:
    pool: npt.NDArray[Any]
    time: npt.NDArray[np.float64]
    capacity_gpus: npt.NDArray[np.int32]
    in_service_gpus: npt.NDArray[np.int32]

    def columns(self) -> dict[str, npt.NDArray[Any]]:
        return {
            "pool": self.pool,
            "time": self.time,
            "capacity_gpus": self.capacity_gpus,
            "in_service_gpus": self.in_service_gpus,
        }
