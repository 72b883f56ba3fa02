"""A rank's memory, sampled: the device's (CUDA allocator) and the process's (the kernel's).

The exporter thread samples it every ``memory_s`` seconds (``FLEETLENS_MEMORY_S``, 5 by default,
0 = off) and sends it as scalars of the step the training thread is at, so memory over steps costs
the training loop nothing; ``TorchRun.log(step, memory=True)`` samples the same figures at an exact
step. Two families of scalars, in bytes:

- the device, when torch has initialised CUDA in this process: ``mem_allocated_bytes``
  (``torch.cuda.memory_allocated``), ``mem_reserved_bytes`` (held by the caching allocator),
  ``mem_max_allocated_bytes`` (the allocator's peak, since the start or the user's last
  ``reset_peak_memory_stats``) and ``mem_total_bytes`` (the device's capacity);
- the process, always: ``host_used_bytes``, ``host_peak_bytes`` and ``host_limit_bytes``. Used
  and peak are the resident set (``VmRSS``, ``VmHWM``) against the rank's share of the
  tightest of its own cgroup's ``memory.max`` (a Slurm job's, a container's) and the machine's
  memory: that limit over the node's ranks (``LOCAL_WORLD_SIZE``), since they share it; under
  an address-space limit (``RLIMIT_AS``, which fails allocations before the resident set
  reaches anything) they are the address space (``VmSize``, ``VmPeak``) against that limit,
  since that is what runs out.

Nothing here imports torch (a process that has not imported it has no device memory to read),
and nothing raises: a sample that cannot be read is None.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

try:
    import resource
except ImportError:  # not on Linux or macOS: no rlimit to read
    resource = None  # type: ignore[assignment]

__all__ = ["MemorySampler"]

# cgroup v1 writes "no limit" as a page-rounded 2**63 - 1.
_NO_LIMIT = 1 << 62


def _cgroup_files() -> list[str]:
    """The memory limit files of this process's own cgroup (a Slurm job's or a container's,
    v2 then v1), then the root's."""
    out: list[str] = []
    with contextlib.suppress(OSError, ValueError), open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "":
                out.append(f"/sys/fs/cgroup{path.rstrip('/')}/memory.max")
            elif "memory" in controllers.split(","):
                out.append(f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.limit_in_bytes")
    return [*out, "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]


def _machine_limit() -> int | None:
    """The tightest of the cgroup's memory limit and the machine's memory, in bytes."""
    limits: list[int] = []
    for path in _cgroup_files():
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _NO_LIMIT:
            limits.append(int(text))
    with contextlib.suppress(OSError, ValueError, AttributeError):
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return min(limits) if limits else None


def _status() -> dict[str, int]:
    """``/proc/self/status``'s Vm* lines in bytes."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Vm"):
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024  # the kernel writes kB
    return out


class MemorySampler:
    """Samples this process's memory. ``device`` is the CUDA device the training thread uses
    (the exporter thread's own current device is not it): set from the training thread at the
    first step (:meth:`note_device`), else the local rank's, as torchrun's one-GPU-a-rank
    convention has it."""

    def __init__(self, local_rank: int = 0, local_ranks: int = 1) -> None:
        self.device: int | None = None
        self._local = max(local_rank, 0)
        self.errors = 0
        # The ranks of a node share its memory: each is held to its share of it.
        limit = _machine_limit()
        self._limit = None if limit is None else limit // max(local_ranks, 1)
        self._total: dict[int, int] = {}

    def host(self) -> dict[str, float] | None:
        try:
            vm = _status()
            soft = resource.getrlimit(resource.RLIMIT_AS)[0] if resource is not None else -1
            limit: int | None = self._limit
            if resource is not None and soft != resource.RLIM_INFINITY and soft > 0:
                used, peak, limit = vm.get("VmSize"), vm.get("VmPeak"), soft
            else:
                used, peak = vm.get("VmRSS"), vm.get("VmHWM")
            if used is None:
                return None
            out = {"host_used_bytes": float(used)}
            if peak is not None:
                out["host_peak_bytes"] = float(max(peak, used))
            if limit is not None:
                out["host_limit_bytes"] = float(limit)
            return out
        except Exception:  # no /proc (not Linux), or a read that failed: no sample
            self.errors += 1
            return None

    def cuda(self) -> dict[str, float] | None:
        torch: Any = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        try:
            if cuda is None or not cuda.is_initialized():
                return None  # never initialise CUDA from here
            dev = self.device
            if dev is None:
                dev = self._local if self._local < cuda.device_count() else 0
            total = self._total.get(dev)
            if total is None:
                total = self._total[dev] = int(cuda.get_device_properties(dev).total_memory)
            return {
                "mem_allocated_bytes": float(cuda.memory_allocated(dev)),
                "mem_reserved_bytes": float(cuda.memory_reserved(dev)),
                "mem_max_allocated_bytes": float(cuda.max_memory_allocated(dev)),
                "mem_total_bytes": float(total),
            }
        except Exception:  # a broken driver: no device sample, training goes on
            self.errors += 1
            return None

    def note_device(self) -> None:
        """From the training thread: remember the CUDA device it uses, when torch has one."""
        torch: Any = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        try:
            if cuda is not None and cuda.is_initialized():
                self.device = int(cuda.current_device())
        except Exception:
            self.errors += 1

    def sample(self) -> dict[str, float]:
        """Both families, what of them could be read (empty when nothing could)."""
        return {**(self.host() or {}), **(self.cuda() or {})}
