"""The analysis cursor's state: what the loop carries between the passes over a run, versioned.

The state is JSON in the metadata store (``AnalysisCursor.state``): per job attempt, how far it
was analysed (``done``), how far its blocks were judged (``blocked``), the steps its straggler
state is committed through (``sealed``), its ranks' CUSUM and episodes (``cusum``), its
hot racks (``hot``) and, in a pipeline-parallel job, its stages'
compute over the judged blocks (``stages``, absent until the first: an optional key, read
with a default, so no version bump); per run, the last slow-collective episode (``coll``) and
the workload baselines (``bl_compute``, ``bl_transfer``).

Its shape changes with the analyses. Each change bumps :data:`VERSION` and adds one step to
:func:`migrate`, the only place an older state is read into the current shape, so a running
analysis resumes where it was instead of starting over or misreading a key. A state written by
a newer server (a downgrade) is refused by name: the run waits for a server that reads it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ..errors import FleetlensError

__all__ = ["VERSION", "CursorVersionError", "migrate"]

VERSION = 3
"""1: no version key; blocks went with ``done``, the straggler state with ``done`` (no
``sealed``). 2: ``blocked`` and ``sealed`` per attempt, ``jobs`` and ``coll`` always present.
3: no ``tail`` per attempt (the passes an unchanged incomplete tail was revisited: the loop now
comes back to a run when its data arrives)."""


class CursorVersionError(FleetlensError):
    """The cursor was written by a newer fleetlens than this server."""


def migrate(state: Mapping[str, Any]) -> dict[str, Any]:
    """The stored state in the current shape (a copy: the stored one is left as it was)."""
    s = copy.deepcopy(dict(state))
    version = s.get("version", 1)
    if not isinstance(version, int) or version > VERSION:
        raise CursorVersionError(
            f"the analysis cursor is version {version!r}, written by a newer fleetlens; "
            f"this server reads versions up to {VERSION}: upgrade it to analyse this run"
        )
    jobs = s.setdefault("jobs", {})
    if version < 2:
        for js in jobs.values():
            js.setdefault("blocked", js["done"])
            if "cusum" in js:
                js.setdefault("sealed", js["done"])
    if version < 3:
        for js in jobs.values():
            js.pop("tail", None)
    s.setdefault("coll", {})
    s["version"] = VERSION
    return s
