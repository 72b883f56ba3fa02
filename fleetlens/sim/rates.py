"""Failure arrivals from a published interruption mix (Llama 3 405B, Table 5).

419 unexpected interruptions in 54 days on 16,384 H100 GPUs, by component. Each component maps
to the simulator fault that has the same effect on a job (a faulty GPU is a fatal XID, a
network switch or cable is a link going down, ...). Arrivals are Poisson in time; the test
checks this table against ``tests/data/real/failure_statistics``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError
from .model import FaultSpec, Rates, Scenario

__all__ = ["LLAMA3_INTERRUPTIONS", "draw_faults"]

LLAMA3_DAYS = 54.0
LLAMA3_GPUS = 16384

LLAMA3_INTERRUPTIONS: dict[str, tuple[int, str, dict[str, Any]]] = {
    # component: (count, fault kind, params)
    "Faulty GPU": (148, "fatal_xid", {"xid": 79}),
    "GPU HBM3 Memory": (72, "ecc_xid", {}),
    "Software Bug": (54, "crash", {}),
    "Network Switch/Cable": (35, "network_down", {}),
    "Host Maintenance": (32, "maintenance", {}),
    "GPU SRAM Memory": (19, "fatal_xid", {"xid": 95}),
    "GPU System Processor": (17, "fatal_xid", {"xid": 119}),
    "NIC": (7, "network_down", {}),
    "NCCL Watchdog Timeouts": (7, "hang", {}),
    "Silent Data Corruption": (6, "instability", {}),
    "GPU Thermal Interface + Sensor": (6, "fatal_xid", {"xid": 79}),
    "SSD": (3, "host_failure", {}),
    "Power Supply": (3, "host_failure", {}),
    "Server Chassis": (2, "host_failure", {}),
    "IO Expansion Board": (2, "host_failure", {}),
    "Dependency": (2, "crash", {}),
    "CPU": (2, "host_failure", {}),
    "System Memory": (2, "host_failure", {}),
}


def draw_faults(scn: Scenario, rates: Rates, rng: np.random.Generator) -> list[FaultSpec]:
    """Poisson arrivals over the run's nominal span, per component."""
    if rates.model != "llama3_405b":
        raise ConfigError(f"unknown failure-rate model {rates.model!r}; known: llama3_405b")
    span = scn.job.steps * scn.job.step_time
    scale = span / (LLAMA3_DAYS * 86400.0)
    if rates.scale == "per_gpu":
        scale *= scn.world_size / LLAMA3_GPUS
    elif rates.scale != "fleet":
        raise ConfigError(f"rates.scale {rates.scale!r} is not known; use per_gpu or fleet")
    out = []
    for count, kind, params in LLAMA3_INTERRUPTIONS.values():
        n = int(rng.poisson(count * scale * rates.multiplier))
        for t in np.sort(rng.uniform(0, span, n)):
            rank = int(rng.integers(scn.world_size))
            out.append(FaultSpec(kind=kind, at=float(t), ranks=(rank,), params=dict(params)))
    return out
