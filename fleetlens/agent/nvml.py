"""GPU samples through NVML (nvidia-ml-py), under the same DCGM-named columns as dcgm-exporter.

The NVML module is passed in, so a test can hand a stand-in with the same functions (these
machines have no GPU) while a GPU host uses ``pynvml`` itself: ``python -m fleetlens.agent
--selftest``. Every query a device does not support leaves its column NaN; nothing here raises
for one field. XID errors arrive as NVML events and are reported in the ``xid`` column of the
next sample (the last one seen, as DCGM_FI_DEV_XID_ERRORS does).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["NvmlSampler", "load_nvml"]

_MIB = 1024 * 1024


def load_nvml() -> Any:
    """The real NVML bindings, initialised; raises ImportError or the NVML error if unusable."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


class NvmlSampler:
    def __init__(self, nvml: Any, node_id: str) -> None:
        self.nvml = nvml
        self.node_id = node_id
        self.handles = [
            nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
        ]
        self.uuids = [self._call(nvml.nvmlDeviceGetUUID, h, default="") for h in self.handles]
        self.last_xid = [math.nan] * len(self.handles)
        self.errors = 0
        self._events: Any = None
        try:
            self._events = nvml.nvmlEventSetCreate()
            for h in self.handles:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, self._events)
        except Exception:  # XID events need root on some drivers; samples still work
            self._events = None

    def _call(self, fn: Callable[..., Any], *args: Any, default: Any = math.nan) -> Any:
        try:
            value = fn(*args)
        except Exception:  # NVMLError_NotSupported, NoPermission, GpuIsLost, ...
            self.errors += 1
            return default
        return value.decode() if isinstance(value, bytes) else value

    def poll_xids(self) -> list[tuple[int, int]]:
        """XID events since the last poll, as (gpu index, xid); never blocks."""
        out: list[tuple[int, int]] = []
        if self._events is None:
            return out
        nv = self.nvml
        while True:
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # NVMLError_Timeout: nothing pending
                return out
            try:
                index = self.handles.index(data.device)
            except ValueError:
                continue
            xid = int(data.eventData)
            self.last_xid[index] = float(xid)
            out.append((index, xid))

    def _nvlink_crc(self, h: Any) -> float:
        nv, total, seen = self.nvml, 0.0, False
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                total += nv.nvmlDeviceGetNvLinkErrorCounter(
                    h, link, nv.NVML_NVLINK_ERROR_DL_CRC_FLIT
                )
                seen = True
            except Exception:
                continue
        return total if seen else math.nan

    def sample(self, time: float) -> list[dict[str, Any]]:
        """One ``gpu`` record per device."""
        nv, out = self.nvml, []
        self.poll_xids()
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        reasons = reasons or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        for i, h in enumerate(self.handles):
            c = self._call
            util = c(nv.nvmlDeviceGetUtilizationRates, h, default=None)
            mem = c(nv.nvmlDeviceGetMemoryInfo, h, default=None)
            power = c(nv.nvmlDeviceGetPowerUsage, h)
            limit = c(nv.nvmlDeviceGetEnforcedPowerLimit, h)
            out.append(
                {
                    "time": time,
                    "node_id": self.node_id,
                    "gpu": i,
                    "gpu_uuid": self.uuids[i],
                    "gpu_temp": c(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                    "power_usage": power / 1000.0,  # NVML reports milliwatts
                    "power_limit": limit / 1000.0,
                    "sm_clock": c(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                    "sm_clock_max": c(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
                    "mem_clock": c(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                    "gpu_util": float(util.gpu) if util is not None else math.nan,
                    "mem_copy_util": float(util.memory) if util is not None else math.nan,
                    "fb_used": mem.used / _MIB if mem is not None else math.nan,
                    "fb_free": mem.free / _MIB if mem is not None else math.nan,
                    "throttle_reasons": float(c(reasons, h)),
                    "ecc_sbe_total": float(
                        c(
                            nv.nvmlDeviceGetTotalEccErrors,
                            h,
                            nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                            nv.NVML_VOLATILE_ECC,
                        )
                    ),
                    "ecc_dbe_total": float(
                        c(
                            nv.nvmlDeviceGetTotalEccErrors,
                            h,
                            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                            nv.NVML_VOLATILE_ECC,
                        )
                    ),
                    "pcie_replay": float(c(nv.nvmlDeviceGetPcieReplayCounter, h)),
                    "nvlink_crc_errors": self._nvlink_crc(h),
                    "xid": self.last_xid[i],
                }
            )
        return out
