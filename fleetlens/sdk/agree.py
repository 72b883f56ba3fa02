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

The job id of an attempt (``RUN-aN``) is agreed the same way, N the attempt's number
(:func:`agree_attempt`): torchrun's restart count is each agent's own.

Bounded (a few seconds at most, at ``init``), silent on failure: the caller then keeps the id
it made up. Needs torch only for the store, imported only when the launcher says it is there.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["KEY", "agree_attempt", "agree_run_id"]

KEY = "fleetlens/run_id"
_TIMEOUT_S = 5.0
_OPEN = "fleetlens/attempt/open"  # the newest attempt: base:world:ranks in:last arrival
_LAST = "fleetlens/attempt/last"  # the number the newest attempt agreed on
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


def agree_attempt(restarts: int, world: int, environ: Mapping[str, str]) -> int:
    """The job attempt's number, the same on all its ranks (``restarts`` where no store
    answers): the highest launcher restart count among them, and past the number of the
    attempt before it in the same store.

    torchrun's ``TORCHELASTIC_RESTART_COUNT`` is each agent's own: an agent whose workers
    failed counts a restart, one that restarts its workers for a membership change (a node
    left or joined) does not, so one attempt's ranks can read 1 and 0 and, left alone, report
    as two attempts (one of them the attempt before); and the next attempt's can read 1 and 1,
    the number the one before took. Each rank raises the attempt's maximum (``compare_set``)
    and counts itself in; the last one in opens the gate for all. The keys are the attempt's:
    an agent's store outlives attempts, so the n-th rank to arrive at a world size already
    full starts the next attempt's keys (where the store is the same: a rank cannot tell a
    first launch from a restart its agent did not count, so every rank waits for the others).
    Bounded: a rank that never comes (a job that instruments rank 0 alone) costs the others
    ``_TIMEOUT_S`` at ``init``, then each keeps the highest it saw.
    """
    try:
        store = _store(environ)
        if store is None or world < 2:
            return restarts
        n = int(store.add("fleetlens/attempt/arrived", 1))  # this store's arrivals, all attempts
        base = _attempt_base(store, n, world)
        prefix = f"fleetlens/attempt/{base}"
        high = restarts
        if base == n and store.check([_LAST]):  # the attempt's first: past the one before
            high = max(high, int(store.get(_LAST).decode()) + 1)
        while True:
            cur = store.compare_set(f"{prefix}/max", "", str(high)).decode()
            if int(cur) >= high:
                break
            if store.compare_set(f"{prefix}/max", cur, str(high)).decode() == str(high):
                break
        if int(store.add(f"{prefix}/in", 1)) >= world:
            store.set(f"{prefix}/open", "1")
        with contextlib.suppress(Exception):
            store.wait([f"{prefix}/open"], datetime.timedelta(seconds=_TIMEOUT_S))
        attempt = max(restarts, int(store.get(f"{prefix}/max").decode()))
        store.set(_LAST, str(attempt))
        return attempt
    except Exception:
        return restarts


def _attempt_base(store: Any, n: int, world: int) -> int:
    """The arrival number that opened this rank's attempt. Attempts follow each other in a
    store (the next starts once the last one's workers have stopped), so an arrival joins the
    newest attempt unless that one is full or of another size. The record names its last
    arrival, so no two ranks can write the same one and both take it for theirs."""
    mine = f"{n}:{world}:1:{n}"
    cur = store.compare_set(_OPEN, "", mine).decode()
    while cur != mine:
        base, size, count, _ = (int(x) for x in cur.split(":"))
        new = f"{base}:{size}:{count + 1}:{n}" if size == world and count < world else mine
        got = store.compare_set(_OPEN, cur, new).decode()
        if got == new:
            return int(new.split(":")[0])
        cur = got
    return n


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
