"""The analysis cursor's state: what the loop carries between the passes over a run, versioned.

The state is JSON in the metadata store (``AnalysisCursor.state``), read here into a
:class:`CursorState` and written back from one: per job attempt (:class:`AttemptState`) how far
it was analysed, how far its blocks were judged, the steps its straggler state is committed
through, that state, its hot racks and, in a pipeline-parallel job, its stages' compute over
the judged blocks; per run, the last slow-collective episode (:class:`SlowCollectives`) and the
workload baselines.

Its shape changes with the analyses. Each change bumps :data:`VERSION` and adds one step to
:data:`_STEPS`, the only place an older state is read into the current shape, so a running
analysis resumes where it was instead of starting over or misreading a key. A state written by
a newer server (a downgrade) is refused by name: the run waits for a server that reads it. A
state that does not read as its version says (corrupt) is refused too, and the loop starts that
run over.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import msgspec
import numpy as np

from ..analysis.ranks import RankStateDoc
from ..errors import FleetlensError
from ..store.detect_queries import JobSpan

__all__ = [
    "VERSION",
    "AttemptState",
    "CursorCorruptError",
    "CursorState",
    "CursorVersionError",
    "HotSpan",
    "ScalarWatch",
    "SlowCollectives",
    "as_json",
    "migrate",
    "stored",
]

VERSION = 3
"""1: no version key; blocks went with ``done``, the straggler state with ``done`` (no
``sealed``). 2: ``blocked`` and ``sealed`` per attempt, ``jobs`` and ``coll`` always present.
3: no ``tail`` per attempt (the passes an unchanged incomplete tail was revisited: the loop now
comes back to a run when its data arrives)."""


class CursorVersionError(FleetlensError):
    """The cursor was written by a newer fleetlens than this server."""


class CursorCorruptError(FleetlensError):
    """The cursor does not read as the version it says it is."""


class HotSpan(NamedTuple):
    """A rack-cooling finding's span: consecutive hot blocks of one rack (stored as an array)."""

    rack: str
    start_step: int
    end_step: int
    ranks: list[int]


class ScalarWatch(NamedTuple):
    """An attempt whose last window was judged, watched for late scalars: the scalar rows read
    the last time (-1 before the first look) and how many looks in a row read as many."""

    rows: int
    unchanged: int


class SlowCollectives(msgspec.Struct, frozen=True, omit_defaults=True):
    """The last slow-collective episode: consecutive slow blocks of an attempt, and the first
    block of an attempt that replays steps of a slow last block of the one before, are one
    episode (``key``), whose verdict (network or NVLink) is restated by its later blocks."""

    job: str = ""
    to: int = -2
    key: str = ""

    def after(self, job: JobSpan, s0: int, s1: int) -> SlowCollectives:
        """The episode once the slow block ``s0``..``s1`` of ``job`` is added to it."""
        same = self.job == job.job_id and self.to == s0 - 1
        carried = self.job != job.job_id and s0 == job.first_step and self.to >= s0 - 1
        key = self.key if same or carried else f"collectives:{job.job_id}:{s0}"
        return SlowCollectives(job.job_id, s1, key)


class AttemptState(msgspec.Struct, omit_defaults=True):
    """One job attempt's analysis, carried between passes (steps are the attempt's numbers).

    ``sealed`` is None for an attempt of a version 1 cursor whose straggler scan never ran;
    ``stragglers`` is the straggler detector's committed state, ``stages`` the pipeline
    stages' tally (:meth:`fleetlens.analysis.stages.StageTally.to_json`)."""

    done: int
    blocked: int
    sealed: int | None = None
    stragglers: RankStateDoc | None = msgspec.field(default=None, name="cusum")
    hot: list[HotSpan] = msgspec.field(default_factory=list)
    stages: dict[str, Any] | None = None
    times: tuple[float, float] | None = msgspec.field(default=None, name="t")
    steps: tuple[int, int] | None = None
    scalars: ScalarWatch | None = msgspec.field(default=None, name="sc")

    @classmethod
    def fresh(cls, job: JobSpan) -> AttemptState:
        """An attempt's state before its first step is analysed."""
        before = job.first_step - 1
        return cls(done=before, blocked=before, sealed=before)

    def note_hot(self, rack: str, start_step: int, end_step: int, ranks: list[int]) -> None:
        """Keep a rack-cooling finding's span, consecutive blocks of one rack merged (for
        :func:`fleetlens.services.shifts.fold_into_racks`)."""
        for i, h in enumerate(self.hot):
            if h.rack == rack and h.start_step <= start_step <= h.end_step + 1:
                merged = sorted(set(h.ranks) | set(ranks))
                self.hot[i] = h._replace(end_step=max(h.end_step, end_step), ranks=merged)
                return
        self.hot.append(HotSpan(rack, start_step, end_step, sorted(ranks)))


class CursorState(msgspec.Struct):
    """A run's analysis state: its attempts by job id, the last slow-collective episode, and
    the workload baselines as learned so far
    (:meth:`fleetlens.analysis.baseline.Baseline.to_json`)."""

    version: int
    attempts: dict[str, AttemptState] = msgspec.field(default_factory=dict, name="jobs")
    collectives: SlowCollectives = msgspec.field(default_factory=SlowCollectives, name="coll")
    bl_compute: dict[str, Any] | None = None
    bl_transfer: dict[str, Any] | None = None

    @classmethod
    def fresh(cls) -> CursorState:
        """A run's state before its first pass."""
        return cls(version=VERSION)

    def attempt(self, job: JobSpan) -> AttemptState:
        """The attempt's state, a fresh one the first time it is seen."""
        js = self.attempts.get(job.job_id)
        if js is None:
            js = self.attempts[job.job_id] = AttemptState.fresh(job)
        return js


def _to_v2(s: dict[str, Any]) -> None:
    """Blocks and the straggler state were committed with ``done``."""
    for js in s.setdefault("jobs", {}).values():
        js.setdefault("blocked", js["done"])
        if "cusum" in js:
            js.setdefault("sealed", js["done"])
    s.setdefault("coll", {})


def _to_v3(s: dict[str, Any]) -> None:
    """No count of the passes over an unchanged tail."""
    for js in s["jobs"].values():
        js.pop("tail", None)


_STEPS: dict[int, Callable[[dict[str, Any]], None]] = {1: _to_v2, 2: _to_v3}
"""Version -> the step that reads a state of that version into the next one."""


def migrate(state: Mapping[str, Any]) -> CursorState:
    """The stored state in the current shape (the stored one is left as it was)."""
    s = copy.deepcopy(dict(state))
    version = s.get("version", 1)
    if not isinstance(version, int) or version > VERSION:
        raise CursorVersionError(
            f"the analysis cursor is version {version!r}, written by a newer fleetlens; "
            f"this server reads versions up to {VERSION}: upgrade it to analyse this run"
        )
    try:
        for v in range(version, VERSION):
            _STEPS[v](s)
        s["version"] = VERSION
        return msgspec.json.decode(msgspec.json.encode(s), type=CursorState)
    except (KeyError, TypeError, AttributeError, msgspec.ValidationError) as exc:
        raise CursorCorruptError(
            f"the analysis cursor does not read as version {version}: {exc!r}"
        ) from exc


def stored(state: CursorState) -> Mapping[str, object]:
    """The state as the metadata store keeps it (JSON), read back by :func:`migrate`."""
    out: Mapping[str, object] = as_json(state)
    return out


def as_json(value: object) -> Any:
    """Part of the state (or all of it) as it is stored: JSON values (an analysis's own state
    may hold numpy numbers)."""
    return msgspec.to_builtins(value, enc_hook=_number)


def _number(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    raise NotImplementedError(f"{type(value).__name__} is not part of an analysis cursor")
