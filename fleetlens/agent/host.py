"""Host counters from /proc: CPU busy fraction, load, memory, disk bytes, NIC bytes and errors.

Counters are cumulative as the kernel keeps them; the CPU busy fraction needs two readings, so
the sampler keeps the previous one. ``root`` lets a test point it at a copy of /proc.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

__all__ = ["HostSampler"]

_SECTOR = 512


class HostSampler:
    def __init__(self, node_id: str, root: str = "/proc") -> None:
        self.node_id = node_id
        self.root = root
        self._cpu: tuple[int, int] | None = None

    def _read(self, name: str) -> str:
        with open(os.path.join(self.root, name)) as fh:
            return fh.read()

    def _cpu_util(self) -> float:
        fields = self._read("stat").splitlines()[0].split()[1:]
        values = [int(x) for x in fields]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        total = sum(values[:8])
        prev, self._cpu = self._cpu, (idle, total)
        if prev is None or total == prev[1]:
            return math.nan
        return 1.0 - (idle - prev[0]) / (total - prev[1])

    def _mem(self) -> tuple[float, float]:
        info = {}
        for line in self._read("meminfo").splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                info[key] = float(parts[0]) * 1024
        total = info.get("MemTotal", math.nan)
        return total - info.get("MemAvailable", info.get("MemFree", math.nan)), total

    def _disk(self) -> tuple[float, float]:
        read = write = 0.0
        for line in self._read("diskstats").splitlines():
            p = line.split()
            # Whole devices only (partitions would count twice); skip loop and ram disks.
            if (
                len(p) < 10
                or p[2].startswith(("loop", "ram"))
                or (p[2][-1].isdigit() and (not p[2].startswith("nvme") or "p" in p[2][4:]))
            ):
                continue
            read += int(p[5]) * _SECTOR
            write += int(p[9]) * _SECTOR
        return read, write

    def _net(self) -> tuple[float, float, float]:
        rx = tx = errors = 0.0
        for line in self._read("net/dev").splitlines()[2:]:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                continue
            p = rest.split()
            if len(p) < 16:
                continue
            rx += int(p[0])
            tx += int(p[8])
            errors += int(p[2]) + int(p[3]) + int(p[10]) + int(p[11])
        return rx, tx, errors

    def _retransmits(self) -> float:
        lines = [ln.split() for ln in self._read("net/snmp").splitlines() if ln.startswith("Tcp:")]
        if len(lines) >= 2 and "RetransSegs" in lines[0]:
            return float(lines[1][lines[0].index("RetransSegs")])
        return math.nan

    def sample(self, time: float) -> dict[str, Any]:
        """One ``node`` record; a counter the host does not have is NaN."""
        out: dict[str, Any] = {"time": time, "node_id": self.node_id}
        readers: list[tuple[tuple[str, ...], Callable[[], tuple[float, ...]]]] = [
            (("cpu_util",), lambda: (self._cpu_util(),)),
            (("load1",), lambda: (float(self._read("loadavg").split()[0]),)),
            (("mem_used_bytes", "mem_total_bytes"), self._mem),
            (("disk_read_bytes", "disk_write_bytes"), self._disk),
            (("net_rx_bytes", "net_tx_bytes", "nic_errors"), self._net),
            (("tcp_retransmits",), lambda: (self._retransmits(),)),
        ]
        for names, read in readers:
            try:
                out.update(zip(names, read(), strict=True))
            except (OSError, ValueError, IndexError):
                out.update(dict.fromkeys(names, math.nan))
        return out
