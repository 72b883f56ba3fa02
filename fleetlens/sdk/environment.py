"""What a rank runs on, as its ``job_start`` event says it: the framework and driver versions.

Read once at start from what the process has already loaded (never importing torch, never
initialising CUDA) and from the kernel's NVIDIA driver file; nothing here raises.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["environment"]


def environment() -> dict[str, Any]:
    """Python's, torch's, CUDA's (torch's build) and NCCL's versions and the NVIDIA driver's,
    those that are known, and the image the job runs in when ``FLEETLENS_IMAGE`` names it (a
    job template sets it to its container image's tag)."""
    env: dict[str, Any] = {"python": sys.version.split()[0]}
    image = os.environ.get("FLEETLENS_IMAGE", "").strip()
    if image:
        env["image"] = image[:256]
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch"] = str(getattr(torch, "__version__", ""))
        env["cuda"] = str(getattr(getattr(torch, "version", None), "cuda", "") or "")
        try:  # the NCCL torch was built with; a CPU build has none
            nccl = torch.cuda.nccl.version()
            env["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:
            pass
    try:
        with open("/proc/driver/nvidia/version") as fh:
            first = fh.readline()
        parts = first.split("Kernel Module")
        if len(parts) > 1:
            env["nvidia_driver"] = parts[1].split()[0]
    except OSError:
        pass
    return env
