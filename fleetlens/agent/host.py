"""Host counters from /proc and /sys: CPU busy fraction, load, memory, disk bytes, NIC bytes and
errors, InfiniBand (and RoCE) port bytes, errors and RDMA retries.

Counters are cumulative as the kernel keeps them; the CPU busy fraction needs two readings, so
the sampler keeps the previous one. ``root`` and ``sys_root`` let a test point it at copies of
/proc and /sys.

InfiniBand, per port of every device under ``/sys/class/infiniband/DEV/ports/N/``: the
``counters`` directory's ``port_xmit_data`` and ``port_rcv_data`` (in units of 4 bytes, as the IB
spec counts them) and its error counters; the ``hw_counters`` directory's RDMA retry counters
(mlx5 and most drivers name them as below). A host without InfiniBand reports NaN.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

__all__ = ["HostSampler"]

_SECTOR = 512
_IB_ERRORS = (
    "symbol_error",
    "port_rcv_errors",
    "link_error_recovery",
    "link_downed",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_rcv_remote_physical_errors",
)
_RDMA_RETRIES = ("local_ack_timeout_err", "rnr_nak_retry_err", "packet_seq_err", "out_of_sequence")


class HostSampler:
    def __init__(self, node_id: str, root: str = "/proc", sys_root: str = "/sys") -> None:
        self.node_id = node_id
        self.root = root
        self.ib_root = os.path.join(sys_root, "class", "infiniband")
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

    def _ib(self) -> tuple[float, float, float, float]:
        ports = [
            os.path.join(self.ib_root, dev, "ports", port)
            for dev in sorted(os.listdir(self.ib_root))
            for port in sorted(os.listdir(os.path.join(self.ib_root, dev, "ports")))
        ]
        if not ports:
            raise OSError("no InfiniBand ports")

        def total(sub: str, names: tuple[str, ...]) -> float:
            out = 0.0
            for port in ports:
                for name in names:
                    try:
                        with open(os.path.join(port, sub, name)) as fh:
                            out += int(fh.read().split()[0])
                    except (OSError, ValueError, IndexError):
                        continue  # a counter this driver does not keep
            return out

        tx = 4 * total("counters", ("port_xmit_data",))
        rx = 4 * total("counters", ("port_rcv_data",))
        return tx, rx, total("counters", _IB_ERRORS), total("hw_counters", _RDMA_RETRIES)

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
            (("ib_tx_bytes", "ib_rx_bytes", "ib_errors", "rdma_retries"), self._ib),
        ]
        for names, read in readers:
            try:
                out.update(zip(names, read(), strict=True))
            except (OSError, ValueError, IndexError):
                out.update(dict.fromkeys(names, math.nan))
        return out
