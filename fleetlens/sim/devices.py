"""GPU samples under DCGM column names and host samples, on a fixed grid while a job runs.

Values follow the step model: a GPU is busy for its compute share of the step, the whole step
when it only waits at the collective (NCCL kernels spin), and idle while its input is late.
Faults leave their physical fingerprints: thermal throttling (temperature up, SM clock down,
throttle reasons set), a warm rack, climbing correctable ECC counts before an XID, NVLink CRC
errors, TCP retransmits on congested NICs, a busy host CPU when a loader shard is stuck.
Counters are cumulative per physical device, so they survive restarts the way hardware does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .faults import Injected
from .steps import StepChunk

__all__ = ["DeviceSampler"]

Arr = np.ndarray[Any, Any]

SM_CLOCK_MAX = 1980.0
POWER_LIMIT = 700.0
FB_TOTAL_MIB = 81559.0
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40


class DeviceSampler:
    def __init__(self, t0: float, interval: float, n_gpus: int, n_nodes: int, seed: int) -> None:
        self.t0 = t0
        self.interval = interval
        self.sbe = np.zeros(n_gpus)
        self.crc = np.zeros(n_gpus)
        self.node_counters = np.zeros((n_nodes, 6))  # disk r/w, net rx/tx, nic errs, retrans
        self.rng = np.random.default_rng(seed + 7)

    def grid(self, a: float, b: float) -> Arr:
        """Sample times in [a, b) on the run's fixed grid."""
        if self.interval <= 0 or b <= a:
            return np.empty(0)
        j0 = math.ceil((a - self.t0) / self.interval)
        j1 = math.ceil((b - self.t0) / self.interval)
        return self.t0 + np.arange(j0, j1) * self.interval

    def gpu(self, chunk: StepChunk, ts: Arr, phys: Arr, faults: list[Injected]) -> dict[str, Any]:
        s, w = len(ts), len(phys)
        k = np.clip(np.searchsorted(chunk.starts, ts, side="right") - 1, 0, len(chunk.steps) - 1)
        step = chunk.steps[k]
        st = chunk.step_time[k][:, None]
        busy = np.clip(1.0 - chunk.data_wait[k] / st, 0.0, 1.0)
        sm_active = 0.88 * chunk.compute[k] / st
        temp = 58.0 + 12.0 * busy + 0.8 * self.rng.standard_normal((s, w))
        clock = np.full((s, w), SM_CLOCK_MAX)
        throttle = np.zeros((s, w))
        nvbw = np.full((s, w), 2.4e11) * busy
        # Cumulative counters as each sample saw them: a sample carries the errors counted up
        # to its own time, never those of later samples of the chunk.
        sbe = np.tile(self.sbe[phys], (s, 1))
        crc = np.tile(self.crc[phys], (s, 1))
        for f in faults:
            act = (step >= f.start) & (step < f.end)
            if not act.any():
                continue
            mask = np.isin(phys, f.gpus)
            sel = np.ix_(act, mask)
            if f.kind == "thermal":
                ramp = np.clip((step[act] - f.start + 1) / 30.0, 0, 1)[:, None]
                temp[sel] += 30.0 * ramp
                clock[sel] /= 1.0 + f.magnitude * ramp
                throttle[sel] = THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL
            elif f.kind == "rack_cooling":
                temp[sel] += 9.0
                clock[sel] /= 1.0 + f.magnitude
                throttle[sel] = THROTTLE_SW_THERMAL
            elif f.kind == "ecc_xid":
                frac = np.where(act, (step - f.start) / max(1, f.end - f.start), 0.0)
                grow = np.maximum.accumulate(2000.0 * frac**2)[:, None]
                sbe[:, mask] = np.maximum(sbe[:, mask], grow)
            elif f.kind == "nvlink":
                pair = np.isin(phys, f.gpus[:2])
                crc[:, pair] += 40.0 * np.cumsum(act)[:, None]
                nvbw[np.ix_(act, pair)] *= 0.35
        self.sbe[phys] = sbe[-1]
        self.crc[phys] = crc[-1]
        power = 120.0 + 560.0 * sm_active / 0.88 * (clock / SM_CLOCK_MAX)
        fb_used = np.full((s, w), 61234.0)
        return {
            "time": np.repeat(ts, w),
            "gpu_temp": temp.ravel(),
            "memory_temp": (temp + 6.0).ravel(),
            "power_usage": power.ravel(),
            "power_limit": np.full(s * w, POWER_LIMIT),
            "sm_clock": clock.ravel(),
            "sm_clock_max": np.full(s * w, SM_CLOCK_MAX),
            "mem_clock": np.full(s * w, 2619.0),
            "gpu_util": (100.0 * busy).ravel(),
            "fb_used": fb_used.ravel(),
            "fb_free": (FB_TOTAL_MIB - fb_used).ravel(),
            "throttle_reasons": throttle.ravel(),
            "ecc_sbe_total": sbe.ravel(),
            "ecc_dbe_total": np.zeros(s * w),
            "xid": np.zeros(s * w),
            "nvlink_bandwidth": nvbw.ravel(),
            "nvlink_crc_errors": crc.ravel(),
            "sm_active": sm_active.ravel(),
            "tensor_active": (0.7 * sm_active).ravel(),
        }

    def node(self, chunk: StepChunk, ts: Arr, nodes: Arr, faults: list[Injected]) -> dict[str, Any]:
        s, n = len(ts), len(nodes)
        k = np.clip(np.searchsorted(chunk.starts, ts, side="right") - 1, 0, len(chunk.steps) - 1)
        step = chunk.steps[k]
        cpu = 0.25 + 0.03 * self.rng.standard_normal((s, n))
        rates = np.array([2e8, 2e7, 1.2e10, 1.2e10, 0.0, 2.0])[None, None, :] * np.ones((s, n, 1))
        for f in faults:
            act = (step >= f.start) & (step < f.end)
            if not act.any():
                continue
            mask = np.isin(nodes, f.nodes) if f.nodes else np.ones(n, bool)
            if f.kind == "network":
                rates[np.ix_(act, mask, np.array([4]))] = 3.0
                rates[np.ix_(act, mask, np.array([5]))] = 900.0
                rates[np.ix_(act, mask, np.array([2, 3]))] /= 1.0 + f.magnitude
            elif f.kind == "data_stall":
                cpu[np.ix_(act, mask)] = 0.97
                rates[np.ix_(act, mask, np.array([0]))] = 5e6
        dt = np.diff(np.concatenate(([ts[0] - self.interval], ts)))[:, None, None]
        cum = self.node_counters[nodes][None, :, :] + np.cumsum(rates * dt, axis=0)
        self.node_counters[nodes] = cum[-1]
        return {
            "time": np.repeat(ts, n),
            "cpu_util": np.clip(cpu, 0, 1).ravel(),
            "load1": (cpu * 96).ravel(),
            "mem_used_bytes": np.full(s * n, 1.1e12),
            "mem_total_bytes": np.full(s * n, 2.0e12),
            "disk_read_bytes": cum[:, :, 0].ravel(),
            "disk_write_bytes": cum[:, :, 1].ravel(),
            "net_rx_bytes": cum[:, :, 2].ravel(),
            "net_tx_bytes": cum[:, :, 3].ravel(),
            "nic_errors": cum[:, :, 4].ravel(),
            "tcp_retransmits": cum[:, :, 5].ravel(),
        }
