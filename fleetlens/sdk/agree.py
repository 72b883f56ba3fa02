"""One run per job whatever the launcher: the ranks agree on a run id when the launcher names none.

``torchrun --master-port P`` without ``--rdzv-id`` sets ``TORCHELASTIC_RUN_ID=none``; the
DeepSpeed and plain ``python -m torch.distributed.launch``-style launchers set no job id at all.
Left alone, each rank would make up its own id, and one job would show as one run per rank.
The ranks then agree through what the job already shares, first that answers:

1. the job's own rendezvous store: the default process group's store when
   ``torch.distributed`` is already initialized, else the torchrun agent's store at
   ``MASTER_ADDR:MASTER_PORT`` (``TORCHELASTIC_USE_AGENT_STORE``): the first rank to ask writes
   its candidate (``compare_set``), every rank reads the same one back. The agent's store lives
   as long as the torchrun agent, so a restarted attempt keeps the run id (and is a new job).
2. the launching process: ranks forked by one launcher on one node share its pid and start
   time (``/proc``), which name the launch uniquely on that host.

Bounded (a few seconds at most, at ``init``), silent on failure: the caller then keeps the id
it made up. Needs torch only for the store, imported only when the launcher says it is there.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["KEY", "agree_run_id"]

KEY = "fleetlens/run_id"
_TIMEOUT_S = 5.0
# The parents that launch one job's ranks: launcher commands, and Python launcher modules or
# scripts (``python -m deepspeed.launcher.launch``, ``python launch.py``).
_LAUNCHERS = {"torchrun", "deepspeed", "accelerate", "mpirun", "mpiexec", "prterun", "orterun"}
_LAUNCH_SUFFIXES = ("launcher.launch", "distributed.launch", "distributed.run", "launch.py")


def agree_run_id(candidate: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """(run id, where the agreement came from); ``(candidate, "")`` when none was possible."""
    try:
        got = _through_store(candidate, environ)
        if got:
            return got, "rendezvous store"
    except Exception:
        pass
    try:
        got = _through_launcher(environ)
        if got:
            return got, "launcher process"
    except Exception:
        pass
    return candidate, ""


def _store(environ: Mapping[str, str]) -> Any:
    dist_mod = sys.modules.get("torch.distributed")
    if dist_mod is not None and dist_mod.is_available() and dist_mod.is_initialized():
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if not addr or not port or environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None
    import torch.distributed as dist

    wait = datetime.timedelta(seconds=_TIMEOUT_S)
    return dist.TCPStore(addr, int(port), is_master=False, timeout=wait)  # type: ignore[attr-defined]


def _through_store(candidate: str, environ: Mapping[str, str]) -> str:
    store = _store(environ)
    if store is None:
        return ""
    got = store.compare_set(KEY, "", candidate)
    return (got.decode() if isinstance(got, bytes) else str(got)).strip()


def _through_launcher(environ: Mapping[str, str]) -> str:
    """The parent's pid and start time, when the parent is a launcher of this job (it set the
    job's rank variables for its children: it is not a shell or an init system)."""
    if "LOCAL_RANK" not in environ or "WORLD_SIZE" not in environ:
        return ""
    if int(environ.get("LOCAL_WORLD_SIZE", environ["WORLD_SIZE"])) != int(environ["WORLD_SIZE"]):
        return ""  # ranks on other nodes have other launchers: no id of one process names them
    ppid = os.getppid()
    with open(f"/proc/{ppid}/cmdline", "rb") as fh:
        argv = fh.read().split(b"\0")
    words = [a.decode(errors="replace") for a in argv[:4]]
    if not any(os.path.basename(w) in _LAUNCHERS or w.endswith(_LAUNCH_SUFFIXES) for w in words):
        return ""  # a shell, a notebook, a sweep: two jobs it starts in turn would share its id
    with open(f"/proc/{ppid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    started = fields[19]  # field 22 of stat: the start time in clock ticks since boot
    with open("/proc/sys/kernel/random/boot_id") as fh:
        boot = fh.read().strip()[:8]
    host = socket.gethostname().split(".")[0]
    return f"run-{host}-{boot}-{ppid}-{started}"
