"""Hardware correlation: what a flagged rank's GPU and host said over the window.

Input is one summary per GPU and per node over a window (the store aggregates the DCGM and host
samples); output is the signals that explain a slowdown or a failure, each with its value and
the threshold it crossed. Thresholds are deliberately coarse: they separate a sick device from
a healthy one, they do not grade it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .evidence import Evidence
from .xid import classify_xid

__all__ = [
    "THROTTLE_BITS",
    "GpuHealth",
    "NodeHealth",
    "Signal",
    "gpu_signals",
    "node_signals",
    "throttle_names",
]

# NVML clocks-event (throttle) reasons, as DCGM_FI_DEV_CLOCK_THROTTLE_REASONS reports them.
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
_THERMAL = 0x20 | 0x40 | 0x8
_POWER = 0x4 | 0x80


def throttle_names(bits: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if bits & bit]


@dataclass
class GpuHealth:
    node: str
    gpu: int
    samples: int = 0
    temp_max: float = float("nan")
    clock_ratio_min: float = float("nan")  # SM clock / its max, lowest sample
    clock_ratio_median: float = float("nan")
    throttle: int = 0  # OR of the throttle reasons seen
    power_max: float = float("nan")
    sbe_delta: float = 0.0  # correctable ECC errors over the window
    dbe_delta: float = 0.0  # uncorrectable ECC errors over the window
    xids: tuple[int, ...] = ()
    nvlink_crc_delta: float = 0.0
    nvlink_bw_min: float = float("nan")
    nvlink_bw_median: float = float("nan")
    pcie_replay_delta: float = 0.0


@dataclass
class NodeHealth:
    node: str
    samples: int = 0
    cpu_max: float = float("nan")
    mem_used_frac_max: float = float("nan")
    nic_errors_per_s: float = 0.0
    retransmits_per_s: float = 0.0
    ib_errors_per_s: float = 0.0
    rdma_retries_per_s: float = 0.0


def gpu_health(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], GpuHealth]:
    """Per (node, GPU), from rows keyed by :class:`GpuHealth`'s fields (as the store reads them)."""
    out = {}
    for r in rows:
        g = GpuHealth(**r)
        out[(g.node, g.gpu)] = g
    return out


def node_health(rows: Iterable[Mapping[str, Any]]) -> dict[str, NodeHealth]:
    """Per node, from rows keyed by :class:`NodeHealth`'s fields."""
    out = {}
    for r in rows:
        n = NodeHealth(**r)
        out[n.node] = n
    return out


@dataclass(frozen=True)
class Signal:
    """One piece of evidence: ``name`` (thermal, ecc_rising, xid, ...), its metric and value."""

    name: str
    metric: str
    value: float
    threshold: float
    detail: Evidence = field(default_factory=dict)

    def to_dict(self) -> Evidence:
        return {
            "signal": self.name,
            "metric": self.metric,
            "value": self.value,
            "threshold": self.threshold,
            **self.detail,
        }


def gpu_signals(g: GpuHealth) -> list[Signal]:
    """Signals of one GPU over the window."""
    out: list[Signal] = []
    if g.throttle & _THERMAL or (g.clock_ratio_median < 0.93 and g.temp_max > 83):
        out.append(
            Signal(
                "thermal",
                "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                float(g.throttle),
                0.0,
                {
                    "reasons": throttle_names(g.throttle),
                    "gpu_temp_max": g.temp_max,
                    "sm_clock_ratio_min": g.clock_ratio_min,
                },
            )
        )
    elif g.throttle & _POWER:
        out.append(
            Signal(
                "power",
                "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                float(g.throttle),
                0.0,
                {"reasons": throttle_names(g.throttle), "power_max": g.power_max},
            )
        )
    elif g.clock_ratio_median < 0.9:
        out.append(Signal("clock_low", "DCGM_FI_DEV_SM_CLOCK", g.clock_ratio_median, 0.9))
    if g.sbe_delta >= 10:
        out.append(Signal("ecc_rising", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", g.sbe_delta, 10.0))
    if g.dbe_delta > 0:
        out.append(Signal("ecc_uncorrectable", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", g.dbe_delta, 0.0))
    for x in g.xids:
        info = classify_xid(x)
        out.append(
            Signal(
                "xid",
                "DCGM_FI_DEV_XID_ERRORS",
                float(x),
                0.0,
                {
                    "xid": x,
                    "severity": info.severity,
                    "mnemonic": info.mnemonic,
                    "action": info.action,
                    "ecc": info.ecc,
                },
            )
        )
    if g.nvlink_crc_delta >= 10:
        out.append(
            Signal(
                "nvlink_errors",
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                g.nvlink_crc_delta,
                10.0,
                {"bandwidth_min": g.nvlink_bw_min},
            )
        )
    if g.pcie_replay_delta >= 100:
        out.append(
            Signal("pcie_replay", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", g.pcie_replay_delta, 100.0)
        )
    return out


def node_signals(n: NodeHealth) -> list[Signal]:
    """Signals of one host over the window."""
    out: list[Signal] = []
    if n.cpu_max >= 0.9:
        out.append(Signal("host_cpu", "cpu_util", n.cpu_max, 0.9))
    if n.mem_used_frac_max >= 0.95:
        out.append(
            Signal("host_memory", "mem_used_bytes/mem_total_bytes", n.mem_used_frac_max, 0.95)
        )
    if n.retransmits_per_s >= 50:
        out.append(Signal("retransmits", "tcp_retransmits", n.retransmits_per_s, 50.0))
    if n.nic_errors_per_s >= 0.5:
        out.append(Signal("nic_errors", "nic_errors", n.nic_errors_per_s, 0.5))
    if n.ib_errors_per_s >= 0.1:  # a healthy IB link counts no symbol or receive errors
        out.append(Signal("ib_errors", "ib_errors", n.ib_errors_per_s, 0.1))
    if n.rdma_retries_per_s >= 1.0:
        out.append(Signal("rdma_retries", "rdma_retries", n.rdma_retries_per_s, 1.0))
    return out
