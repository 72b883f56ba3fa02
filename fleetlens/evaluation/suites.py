"""Named, versioned evaluation suites, and the policies (triggers) that start evaluations.

A suite is registered once (``name`` + ``version``: its benchmarks, its gates, its decoding, and
optionally the adapter and the price table its evaluations use) and is then named in a request
(``"benchmarkSuite": "preproduction-v12"``, the newest version, or ``"preproduction@12"``). A
version is immutable: registering it again with the same content is a no-op, with other content
a conflict.

A trigger is a policy: in ``project`` (empty: every project), when a model version of ``modelId``
(empty: any model) is registered (``on: model``), a verified checkpoint (one with a checksum) is
recorded (``on: checkpoint``), or ``alias`` is moved to a version (``on: alias``), evaluate it on
``suite`` with ``adapter``. Adapter strings may name ``{checkpointUri}``, ``{checkpointId}``,
``{runId}``, ``{modelId}`` and ``{modelVersion}``. Each trigger evaluates a model version or
checkpoint once.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from ..errors import ConfigError, Conflict, NotFound
from ..store.scope import Scope
from ..store.scoped import scoped
from .adapters import Decoding, validate_spec
from .cache import canonical_hash
from .doc_types import AdapterSpec, Price, SuiteSpec, TemplateValues
from .gates import parse_policies
from .models import EvalSuite, EvalTrigger, Evaluation
from .requests import TriggerRequest
from .rows import SessionFactory

__all__ = [
    "EVENTS",
    "PERFORMANCE",
    "SuiteRegistry",
    "SuiteView",
    "TriggerView",
    "fill_template",
    "validate_suite",
]

EVENTS = ("model", "checkpoint", "alias")
PERFORMANCE = "performance"  # the reserved benchmark name of latency and cost aggregates
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SUITE_FIELDS = {"name", "version", "description", "benchmarks", "gates", "decoding", "adapter",
                 "prices"}  # fmt: skip


def validate_suite(spec: dict[str, Any]) -> SuiteSpec:
    """A suite's spec checked field by field; returns it normalised."""
    unknown = sorted(set(spec) - _SUITE_FIELDS)
    if unknown:
        raise ConfigError(f"suite field(s) {unknown} are unknown; use {sorted(_SUITE_FIELDS)}")
    name, version = str(spec.get("name", "")), str(spec.get("version", ""))
    if not _NAME.match(name):
        raise ConfigError(f"suite.name {name!r} must be 1-128 of letters, digits, '.', '_', '-'")
    if not _NAME.match(version):
        raise ConfigError(f"suite.version {version!r} must be 1-128 of letters, digits, . _ -")
    benchmarks = spec.get("benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise ConfigError("suite.benchmarks is empty; name at least one benchmark")
    for i, b in enumerate(benchmarks):
        if not isinstance(b, dict) or not b.get("name"):
            raise ConfigError(f"suite.benchmarks[{i}] needs a name")
        if b["name"] == PERFORMANCE:
            raise ConfigError(f"suite.benchmarks[{i}]: {PERFORMANCE!r} is reserved (latency, cost)")
    out = {**spec, "name": name, "version": version}
    if spec.get("gates") is not None:
        if not isinstance(spec["gates"], list):
            raise ConfigError("suite.gates must be a list of gate policies")
        parse_policies(spec["gates"])
    out["decoding"] = Decoding.from_json(spec.get("decoding")).as_json()
    if spec.get("adapter") is not None:
        if not isinstance(spec["adapter"], dict):
            raise ConfigError("suite.adapter must be an object {kind, ...}")
        validate_spec(spec["adapter"])
    if spec.get("prices") is not None:
        validate_prices(spec["prices"])
    return SuiteSpec.model_validate(out)


def validate_prices(prices: Any) -> None:
    """``{"<model or endpoint or *>": {"inputPer1kTokens": x, "outputPer1kTokens": y}}``."""
    if not isinstance(prices, dict):
        raise ConfigError("prices must be an object: model or endpoint -> price")
    for key, p in prices.items():
        if not isinstance(p, dict) or set(p) - {f.alias for f in Price.model_fields.values()}:
            raise ConfigError(
                f"prices[{key!r}] must be {{inputPer1kTokens, outputPer1kTokens}}, got {p!r}"
            )
        for k, v in p.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"prices[{key!r}].{k} is {v!r}; a price is a number >= 0")


def fill_template(adapter: dict[str, Any], values: TemplateValues) -> AdapterSpec:
    """The adapter spec with ``{checkpointUri}``-style placeholders filled in."""
    out: dict[str, Any] = {}
    for k, v in adapter.items():
        if isinstance(v, str):
            for name, value in values.as_json().items():
                v = v.replace("{" + name + "}", value)
        out[k] = v
    return AdapterSpec.of(out)


@dataclass(frozen=True, slots=True)
class SuiteView:
    """A registered suite version: its spec as registered (the user's JSON, normalised by
    :func:`validate_suite`), and who registered it when. ``created`` is set by a registration
    only (False when that version existed already)."""

    name: str
    version: str
    spec: dict[str, Any]
    spec_hash: str
    created_at: float
    created_by: str
    created: bool | None = None


@dataclass(frozen=True, slots=True)
class TriggerView:
    """A policy that starts evaluations."""

    trigger_id: str
    project: str  # empty: every project
    on: str
    model_id: str  # empty: any model
    alias: str
    suite: str  # a registered suite: name or name@version
    adapter: dict[str, Any]  # the adapter template
    priority: str
    created_at: float
    created_by: str


def _suite_view(r: EvalSuite, created: bool | None = None) -> SuiteView:
    return SuiteView(
        name=r.name,
        version=r.version,
        spec=dict(r.spec),
        spec_hash=r.spec_hash,
        created_at=r.created_at,
        created_by=r.created_by,
        created=created,
    )


def _trigger_view(r: EvalTrigger) -> TriggerView:
    return TriggerView(
        trigger_id=r.trigger_id,
        project=r.project,
        on=r.on,
        model_id=r.model_id,
        alias=r.alias,
        suite=r.suite,
        adapter=dict(r.adapter),
        priority=r.priority,
        created_at=r.created_at,
        created_by=r.created_by,
    )


class SuiteRegistry:
    def __init__(self, session: SessionFactory) -> None:
        self._session = session

    # -- suites ---------------------------------------------------------------------------------

    def register(self, scope: Scope, raw: dict[str, Any]) -> SuiteView:
        suite = validate_suite(raw)
        spec = suite.as_json()
        digest = canonical_hash(spec)
        with self._session() as s:
            row = s.scalars(
                scoped(select(EvalSuite), scope).where(
                    EvalSuite.name == spec["name"], EvalSuite.version == spec["version"]
                )
            ).first()
            if row is not None:
                if row.spec_hash != digest:
                    raise Conflict(
                        f"suite {spec['name']}@{spec['version']} is already registered with "
                        "other content; a version is immutable, register a new version"
                    )
                return _suite_view(row, created=False)
            row = EvalSuite(
                tenant=scope.tenant,
                name=spec["name"],
                version=spec["version"],
                spec=spec,
                spec_hash=digest,
                created_at=time.time(),
                created_by=scope.actor,
            )
            s.add(row)
            s.flush()
            return _suite_view(row, created=True)

    def resolve(self, scope: Scope, ref: str) -> SuiteView:
        """``name`` (its newest version) or ``name@version``."""
        name, _, version = ref.partition("@")
        with self._session() as s:
            q = scoped(select(EvalSuite), scope).where(EvalSuite.name == name)
            if version:
                q = q.where(EvalSuite.version == version)
            row = s.scalars(q.order_by(EvalSuite.id.desc())).first()
            if row is None:
                known = sorted(set(s.scalars(scoped(select(EvalSuite.name), scope)).all()))
                raise NotFound(f"benchmarkSuite {ref!r} is not registered; suites: {known}")
            return _suite_view(row)

    def suites(self, scope: Scope, name: str = "") -> list[SuiteView]:
        with self._session() as s:
            q = scoped(select(EvalSuite), scope)
            if name:
                q = q.where(EvalSuite.name == name)
            return [_suite_view(r) for r in s.scalars(q.order_by(EvalSuite.id)).all()]

    # -- triggers -------------------------------------------------------------------------------

    def add_trigger(self, scope: Scope, body: TriggerRequest) -> TriggerView:
        on = body.on
        if on not in EVENTS:
            raise ConfigError(f"on {on!r} is unknown; use one of {EVENTS}")
        if on == "alias" and not (body.alias and body.model_id):
            raise ConfigError("a trigger on an alias needs modelId and alias")
        project = body.project or scope.project
        if scope.project and project != scope.project:
            raise ConfigError(f"project {project!r}: this token is limited to {scope.project!r}")
        suite = self.resolve(scope, body.suite)
        adapter = dict(body.adapter or suite.spec.get("adapter") or {})
        if not adapter:
            raise ConfigError("adapter is missing: give the trigger one, or the suite a default")
        validate_spec(adapter)
        with self._session() as s:
            row = EvalTrigger(
                tenant=scope.tenant,
                trigger_id="et-" + uuid.uuid4().hex[:12],
                project=project,
                on=on,
                model_id=body.model_id,
                alias=body.alias,
                suite=body.suite,
                adapter=adapter,
                priority=body.priority or "P1",
                created_at=time.time(),
                created_by=scope.actor,
            )
            s.add(row)
            s.flush()
            return _trigger_view(row)

    def triggers(self, scope: Scope) -> list[TriggerView]:
        with self._session() as s:
            q = scoped(select(EvalTrigger), scope)
            if scope.project:
                q = q.where(EvalTrigger.project.in_(("", scope.project)))
            return [_trigger_view(r) for r in s.scalars(q.order_by(EvalTrigger.id)).all()]

    def matching(
        self, tenant: str, project: str, on: str, model_id: str = "", alias: str = ""
    ) -> list[TriggerView]:
        """The triggers an event in ``project`` fires."""
        with self._session() as s:
            q = scoped(select(EvalTrigger), tenant).where(
                EvalTrigger.on == on, EvalTrigger.project.in_(("", project))
            )
            rows = s.scalars(q.order_by(EvalTrigger.id)).all()
            return [
                _trigger_view(r)
                for r in rows
                if (not r.model_id or r.model_id == model_id)
                and (on != "alias" or r.alias == alias)
            ]

    def already_fired(self, tenant: str, trigger_id: str, key: dict[str, str]) -> bool:
        with self._session() as s:
            q = scoped(select(Evaluation.id), tenant).where(Evaluation.trigger_id == trigger_id)
            for col in ("model_id", "model_version", "run_id", "checkpoint_id"):
                q = q.where(getattr(Evaluation, col) == key.get(col, ""))
            return s.scalars(q.limit(1)).first() is not None
