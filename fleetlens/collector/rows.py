"""The row rules of a decoded batch: what one request may cost (:class:`DecodeLimits`), and
the checks that drop a row alone (a rank, step or time out of range, an unknown event kind,
event attrs the ingest path cannot read, a scalar name outside its alphabet, an overlong
string), counted by field. :mod:`.decode` applies them before anything is written."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..schema import EVENT_KINDS, HEARTBEAT_PHASES, LOG_LEVELS, RecordKind
from ..store.batch import Col, StringColumn

__all__ = ["NAME_RULE", "OBJECT_MAX_DEPTH", "DecodeLimits", "Rules", "nesting_problem"]

NAME_RULE = "1-256 printable characters (no tabs, newlines or other control characters)"
"""Scalar names: ``train/loss``, ``eval/acc@1`` are fine."""
_NAME_MAX = 256
_STRING_MAX = 65536
_FLOAT_MAX = float(np.finfo(np.float64).max)
PHASE_COLUMNS = ("data_wait", "forward", "backward", "optimizer", "comm")
TIME_COLUMNS = ("time", "submit", "enter", "exit", "start", "gang_complete", "end", "since")
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class DecodeLimits:
    """What one request may cost. ``max_decoded_bytes`` bounds the decompressed body (a JSON
    body a quarter of it); ``max_world_size`` bounds ranks (a rank is < it) and the world size a
    placement declares; ``max_step`` bounds steps; times more than ``max_future_s`` ahead of the
    server's clock (after skew correction) are refused; a sender whose clock is off by more
    than ``skew_tolerance_s`` has its times corrected when the skew is certain (see
    :func:`measure_skew`)."""

    max_body_bytes: int = 64 << 20
    max_decoded_bytes: int = 256 << 20
    max_rows: int = 4_000_000
    max_world_size: int = 131_072
    max_step: int = 1 << 40
    max_future_s: float = 86_400.0
    skew_tolerance_s: float = 5.0
    max_duration_s: float = 30 * 86_400.0  # a step, phase or span longer than this is absurd

    @property
    def max_json_bytes(self) -> int:
        return self.max_decoded_bytes // 4


def _attrs_problem(kind: str, a: dict[str, Any], max_step: int) -> str | None:
    """What the ingest path could not read in the attrs of an event it interprets."""

    def number(key: str, hi: float) -> str | None:
        v = a.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return f"attrs.{key} is {v!r}; expected a number"
        if not 0 <= v <= hi:
            return f"attrs.{key} is {v!r}; expected 0..{hi:g}"
        return None

    def typed(key: str, types: tuple[type, ...], what: str) -> str | None:
        v = a.get(key)
        if v is not None and not isinstance(v, types):
            return f"attrs.{key} is {json.dumps(v)[:40]}; expected {what}"
        return None

    checks: list[str | None] = []
    if kind == "checkpoint_end":
        step = a.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            return f"attrs.step is {json.dumps(step)[:40]}; expected an integer"
        checks = [
            number("step", max_step),
            number("size_bytes", _INT64_MAX),
            number("duration_s", 1e9),
            typed("path", (str,), "a string"),
            typed("checksum", (str,), "a string"),
            typed("sha256", (str,), "a string"),
            typed("checkpoint_id", (str,), "a string"),
            typed("sync", (bool,), "true or false"),
            typed("ok", (bool,), "true or false"),
        ]
    elif kind == "job_start":
        checks = [
            *(
                f"attrs.{k} {p}"
                for k in ("config", "environment", "code", "dataset")
                if (p := nesting_problem(a.get(k))) is not None
            ),
            typed("config", (dict,), "a JSON object"),
            typed("code", (dict, str), "a JSON object or a string"),
            typed("dataset", (dict, str), "a JSON object or a string"),
            typed("environment", (dict,), "a JSON object"),
            typed("launch_command", (str,), "a string"),
        ]
    elif kind == "config_change":
        checks = [typed("key", (str,), "a string")]
    return next((c for c in checks if c), None)


def _outside(
    cols: list[tuple[str, np.ndarray[Any, Any]]], lo: float, hi: float, *, nan_ok: bool
) -> bool:
    """Whether any value of the columns is outside ``lo..hi`` (infinities are; NaN is when not
    ``nan_ok``): one test over them all, so that a batch every value of which passes, the
    common case, costs a few array operations, not a few per column and rule."""
    values = cols[0][1] if len(cols) == 1 else np.concatenate([v for _, v in cols])
    hi = min(hi, _FLOAT_MAX)  # an infinite bound (max_future_s = inf) still refuses infinity
    if nan_ok:
        return bool(((values < lo) | (values > hi)).any())
    return not bool(((values >= lo) & (values <= hi)).all())


class Rules:
    """Row rules a user relies on; collects what each refused row broke."""

    def __init__(self, limits: DecodeLimits, now: float, world: int) -> None:
        self.limits = limits
        self.latest = now + limits.max_future_s
        self.world = world
        self.rejected: dict[str, int] = {}
        self.errors: list[str] = []
        self.first: tuple[str, str] = ("", "")

    def check(self, kind: RecordKind, cols: dict[str, Col], n: int) -> np.ndarray[Any, Any] | None:
        """The rows to keep, or None when every row passes."""
        if n == 0:
            return None
        self.bad = np.zeros(n, dtype=bool)
        self.kind, self.cols = kind, cols
        lim = self.limits
        event = kind.name == "event"
        if (rank := self._num("rank")) is not None:
            lo = -1 if event else 0
            self._rule("rank", rank < lo, f"ranks are >= {lo}")
            self._rule(
                "rank",
                rank >= lim.max_world_size,
                f"ranks are < {lim.max_world_size} (the server's collector.max_world_size)",
            )
            if self.world and kind.name != "placement":
                self._rule(
                    "rank", rank >= self.world, f"the job declared a world size of {self.world}"
                )
        if (ws := self._num("world_size")) is not None:
            self._rule(
                "world_size",
                (ws < 0) | (ws > lim.max_world_size),
                f"world sizes are 0..{lim.max_world_size} (collector.max_world_size)",
            )
            if rank is not None:
                self._rule("rank", (ws > 0) & (rank >= ws), "a rank is < its world_size")
        if (step := self._num("step")) is not None:
            lo = -1 if event or kind.name in ("heartbeat", "log") else 0
            self._rule(
                "step", (step < lo) | (step > lim.max_step), f"steps are {lo}..{lim.max_step}"
            )
        times = [(name, t) for name in TIME_COLUMNS if (t := self._num(name)) is not None]
        if times and _outside(times, 0.0, self.latest, nan_ok=False):
            for name, t in times:  # which column broke which rule, row by row
                may_be_nan = not kind.by_name[name].required and name not in ("time", "submit")
                # (comparisons with NaN are False and warn of nothing: no np.errstate, whose
                # entry cost more than the checks on an SDK's batch of one step)
                broken = ~np.isfinite(t) | (t < 0)
                if may_be_nan:
                    broken &= ~np.isnan(t)
                self._rule(name, broken, "times are finite UNIX seconds")
                self._rule(
                    name,
                    t > self.latest,
                    f"it is more than {lim.max_future_s:g}s ahead of the server's clock "
                    "(collector.max_future_s)",
                )
        longest = f"{lim.max_duration_s:g} s"
        if (d := self._num("duration")) is not None:
            self._rule(
                "duration",
                ~np.isfinite(d) | (d < 0) | (d > lim.max_duration_s),
                f"durations are finite, 0..{longest}",
            )
        phases = [(name, p) for name in PHASE_COLUMNS if (p := self._num(name)) is not None]
        if phases and _outside(phases, 0.0, lim.max_duration_s, nan_ok=True):
            for name, p in phases:
                bad = (p < 0) | np.isinf(p) | (p > lim.max_duration_s)
                self._rule(name, bad, f"phase times are 0..{longest} (or NaN if unknown)")
        if (g := self._num("gpus")) is not None:
            self._rule("gpus", g <= 0, "an allocation holds at least one GPU")
        if event:
            self._events(cols)
        if kind.name == "heartbeat":
            self._strings("phase", HEARTBEAT_PHASES.__contains__, f"phases are {HEARTBEAT_PHASES}")
        if kind.name == "log":
            self._strings("level", LOG_LEVELS.__contains__, f"levels are {LOG_LEVELS}")
        if kind.name == "scalar":
            self._strings(
                "name",
                lambda s: 0 < len(s) <= _NAME_MAX and s.isprintable(),
                f"scalar names are {NAME_RULE}",
            )
        for name in kind.column_names:
            if isinstance(cols.get(name), StringColumn):
                self._strings(
                    name,
                    lambda s: len(s) <= _STRING_MAX,
                    f"strings are at most {_STRING_MAX} chars",
                )
        return ~self.bad if self.bad.any() else None

    def _num(self, name: str) -> np.ndarray[Any, Any] | None:
        v = self.cols.get(name)
        return v if isinstance(v, np.ndarray) else None

    def _rule(self, name: str, broken: Any, rule: str) -> None:
        if not broken.any():  # the common case, and the cheapest test
            return
        new = broken & ~self.bad
        idx = np.flatnonzero(new)
        if not len(idx):
            return
        self._count(name, idx, rule)
        self.bad |= broken

    def _count(self, name: str, idx: np.ndarray[Any, Any], rule: str) -> None:
        field = f"tables.{self.kind.name}.cols.{name}"
        self.rejected[field] = self.rejected.get(field, 0) + len(idx)
        i = int(idx[0])
        value = self.cols[name]
        shown: Any = value.values()[i] if isinstance(value, StringColumn) else value[i].item()
        if isinstance(shown, str) and len(shown) > 80:
            shown = shown[:80] + f"... ({len(shown)} characters)"
        message = f"field `{name}` of {self.kind.name} record {i} is {shown!r}; {rule}"
        if len(self.errors) < 10:
            self.errors.append(message)
        if not self.first[0]:
            self.first = (field, message)

    def _strings(self, name: str, ok: Callable[[str], bool], rule: str) -> None:
        col = self.cols.get(name)
        if not isinstance(col, StringColumn):
            return
        bad_codes = [j for j, s in enumerate(col.dictionary) if not ok(s)]
        if bad_codes:
            self._rule(name, np.isin(col.codes, bad_codes), rule)

    def _events(self, cols: dict[str, Col]) -> None:
        kinds = cols["kind"]
        if not isinstance(kinds, StringColumn):
            return
        self._strings("kind", lambda s: s in EVENT_KINDS, f"known kinds: {sorted(EVENT_KINDS)}")
        attrs = cols.get("attrs")
        if not isinstance(attrs, StringColumn):
            return
        kind_of = (
            np.asarray(kinds.dictionary, dtype=object)[kinds.codes] if len(kinds.codes) else []
        )
        problems: dict[tuple[int, str], str | None] = {}
        broken = np.zeros(len(attrs.codes), dtype=bool)
        first_rule = ""
        for i, (code, kind) in enumerate(zip(attrs.codes.tolist(), kind_of, strict=True)):
            key = (code, str(kind))
            if key not in problems:
                problems[key] = _attr_problem(attrs.dictionary[code], str(kind), self.limits)
            if problems[key]:
                broken[i] = True
                first_rule = first_rule or str(problems[key])
        if broken.any():
            self._rule("attrs", broken, first_rule)


def _attr_problem(raw: str, kind: str, limits: DecodeLimits) -> str | None:
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        return "attrs must be a JSON object"
    return _attrs_problem(kind, parsed, limits.max_step)


OBJECT_MAX_DEPTH = 32
"""How deeply a config, environment, code or dataset object may nest (a real config is 3-6
levels; the run page and the API serialize what was stored, so a 700-deep one would fail every
read after it). Refused at the door, by name."""


def nesting_problem(value: object, max_depth: int = OBJECT_MAX_DEPTH) -> str | None:
    """What is wrong with the nesting of a JSON value, or None: it goes deeper than
    ``max_depth`` objects and arrays (walked without recursion, so any depth is safe)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict | list):
            if depth > max_depth:
                return f"nests deeper than {max_depth} levels"
            items = v.values() if isinstance(v, dict) else v
            stack.extend((x, depth + 1) for x in items if isinstance(x, dict | list))
    return None
