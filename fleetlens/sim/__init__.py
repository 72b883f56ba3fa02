"""Fleet simulator: synthetic training fleets with injected faults and exact ground truth.

It emits what the real system emits (steps, collectives, DCGM samples, host samples, events,
placement, scheduler records) through the SDK's wire format, to a server or to batch files,
and writes what it injected beside them, so analyses can be scored against the truth.
Server-side extra: needs numpy and pyyaml, never imported by the SDK.
"""

from __future__ import annotations

from ..errors import SimError
from .calibration import CALIBRATION, Calibration, derive_calibration
from .emit import DirSink, HttpSink, MemorySink
from .library import SimResult, list_scenarios, load_scenario, run_scenario, simulate
from .model import Scenario
from .truth import LOSS_CATEGORIES, GroundTruth, Score, score_detections

__all__ = [
    "CALIBRATION",
    "LOSS_CATEGORIES",
    "Calibration",
    "DirSink",
    "GroundTruth",
    "HttpSink",
    "MemorySink",
    "Scenario",
    "Score",
    "SimError",
    "SimResult",
    "derive_calibration",
    "list_scenarios",
    "load_scenario",
    "run_scenario",
    "score_detections",
    "simulate",
]
