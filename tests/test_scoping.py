"""Tenant scoping of the metadata store, in one helper (fleetlens/store/scoped.py).

Two tenants hold objects with the same names (run ``r1``, model ``m``, dataset ``web:v1``,
finding ``k``, ...), so a query that forgot its tenant predicate would return the other
tenant's row; each repository is read as one tenant and must show that tenant's rows only, on
both engines. A structural check then scans the package: no tenant comparison is written outside
the helper, and every statement over a tenant's table is built through it (or declared
cross-tenant).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

import fleetlens
import fleetlens.alerts.models
import fleetlens.evaluation.models
import fleetlens.remediation.models
import fleetlens.store.graph_models  # the models register the tables checked below
from fleetlens.alerts.engine import Candidate
from fleetlens.alerts.policy import DEFAULT_POLICY
from fleetlens.alerts.store import AlertStore
from fleetlens.analysis.rootcause import Diagnosis
from fleetlens.errors import NotFound, StoreError
from fleetlens.evaluation.registry import Registry
from fleetlens.evaluation.requests import EvaluationRequest
from fleetlens.evaluation.store import EvalStore
from fleetlens.remediation.machine import Action, State
from fleetlens.remediation.repository import Repository
from fleetlens.store.access import AccessStore
from fleetlens.store.findings import FindingsStore
from fleetlens.store.graph import GraphStore
from fleetlens.store.graph_types import DatasetInfo
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.models import Base, Job, Run, Tenant
from fleetlens.store.scope import Scope
from fleetlens.store.scoped import all_tenants, infra_scoped, scoped

from .test_eval_support import toy_suite

pytestmark = pytest.mark.unit

A = Scope(tenant="acme", role="admin", actor="alice")
B = Scope(tenant="bolt", role="admin", actor="bob")
ONCALL = Scope(tenant="ops", role="oncall", actor="olga")
ECHO = {"kind": "callable", "target": "tests.test_eval_support:echo_answer"}


@pytest.fixture
def meta(metadata_url: str) -> Iterator[MetadataStore]:
    store = MetadataStore(metadata_url)
    yield store
    store.close()


def _observe_both(meta: MetadataStore) -> None:
    meta.observe("acme", "r1", job_id="ja", project="llm", first=1.0, last=2.0, step=10)
    meta.observe("bolt", "r1", job_id="jb", project="llm", first=1.0, last=3.0, step=20)
    meta.observe("bolt", "rb", project="vision", first=1.0, last=3.0, step=5)


# -- the helper ----------------------------------------------------------------------------------


def test_scoped_adds_the_tenant_and_on_request_the_project() -> None:
    q = scoped(select(Run), A)
    assert set(q.compile().params.values()) == {"acme"}
    vision = Scope(tenant="acme", role="editor", project="vision")
    assert set(scoped(select(Run), vision).compile().params.values()) == {"acme"}
    own = scoped(select(Run), vision, within="project").compile().params
    assert sorted(map(str, own.values())) == ["acme", "vision"]
    shared = str(scoped(select(Run), vision, within="project_or_unassigned").compile())
    assert " IN " in shared
    # A tenant given as a string scopes the tenant only; the models of a join are each scoped.
    both = scoped(select(Run.run_id, Job.job_id), "bolt").compile()
    assert list(both.params.values()) == ["bolt", "bolt"]
    with pytest.raises(StoreError, match="name the model"):
        scoped(select(func.count()), A)
    with pytest.raises(StoreError, match="no tenant column"):
        scoped(select(Tenant), A)
    with pytest.raises(StoreError, match="no project column"):
        scoped(select(Job), vision, within="project")
    plain = select(Run)
    assert all_tenants(plain) is plain
    assert infra_scoped(plain, ONCALL) is plain
    assert set(infra_scoped(plain, A).compile().params.values()) == {"acme"}


# -- each repository, as one tenant ---------------------------------------------------------------


def test_runs_and_jobs(meta: MetadataStore) -> None:
    _observe_both(meta)
    assert [(r.tenant, r.run_id, r.last_step) for r in meta.list_runs(A)] == [("acme", "r1", 10)]
    assert meta.get_run(B, "r1").last_step == 20
    with pytest.raises(NotFound):
        meta.get_run(A, "rb")
    assert [j.job_id for j in meta.jobs(A, "r1")] == ["ja"]
    meta.set_status("acme", "r1", "FINISHED", 5.0)
    assert meta.get_run(A, "r1").status == "FINISHED"
    assert meta.get_run(B, "r1").status != "FINISHED"
    # A project-scoped caller sees its project's runs only.
    llm = Scope(tenant="bolt", role="viewer", project="llm")
    assert [r.run_id for r in meta.list_runs(llm)] == ["r1"]
    with pytest.raises(NotFound):
        meta.get_run(llm, "rb")
    # The monitoring loop's scan is declared cross-tenant: it sees every tenant's runs.
    assert {(r.tenant, r.run_id) for r in meta.active_runs(0.0, 10)} == {
        ("acme", "r1"),
        ("bolt", "r1"),
        ("bolt", "rb"),
    }


def test_tokens_and_audit(meta: MetadataStore) -> None:
    access = AccessStore(meta)
    _, a_info = access.create_token("acme", "viewer", name="a")
    b_plain, b_info = access.create_token("bolt", "viewer", name="b")
    assert [t.id for t in access.list_tokens(A)] == [a_info.id]
    with pytest.raises(NotFound):
        access.revoke_token(A, b_info.id)
    assert access.list_tokens(B)[0].revoked_at is None
    assert [e["target"] for e in access.audit_log(A)] == [f"token:{a_info.id}"]
    # Authentication looks a token up before its tenant is known, and finds bolt's.
    found = access.authenticate(b_plain)
    assert found is not None and found.tenant == "bolt"


def _diag(summary: str) -> Diagnosis:
    return Diagnosis("k", "straggler", "straggler", 0.9, summary, 5, 1, -1)


def test_findings_cursors_and_baselines(meta: MetadataStore) -> None:
    _observe_both(meta)
    findings = FindingsStore(meta)
    findings.upsert("acme", "r1", [_diag("acme's")])
    findings.upsert("bolt", "r1", [_diag("bolt's")])
    assert [f.summary for f in findings.rows(A, "r1")] == ["acme's"]
    findings.clear("acme", "r1")
    assert findings.rows(A, "r1") == []
    assert [f.summary for f in findings.rows(B, "r1")] == ["bolt's"]
    findings.save_baseline("acme", "sig", "step", {"p50": 1.0})
    assert findings.baseline("bolt", "sig", "step") == {}
    assert findings.baseline("acme", "sig", "step") == {"p50": 1.0}
    (read,) = [r for r in findings.runs_with_new_data() if (r.tenant, r.run_id) == ("acme", "r1")]
    findings.save_cursor("acme", "r1", 2.0, {"n": 1}, read.arrivals)
    # The loop's scan crosses tenants on purpose: bolt's r1 is still new after acme's cursor.
    new = {(r.tenant, r.run_id) for r in findings.runs_with_new_data()}
    assert ("bolt", "r1") in new and ("acme", "r1") not in new


def _candidate(tenant: str) -> Candidate:
    rule = next(r for r in DEFAULT_POLICY.rules if r.audience == "infra_oncall")
    labels = {"tenant": tenant, "alertname": rule.name, "run_id": "r1", "node": "n3"}
    return Candidate(rule, labels, {"summary": f"{tenant}'s"}, starts_at=100.0, finding_key="k")


def test_alerts_and_incidents(meta: MetadataStore) -> None:
    alerts = AlertStore(meta, AccessStore(meta))
    alerts.apply("acme", ["r1"], [_candidate("acme")], now=200.0)
    alerts.apply("bolt", ["r1"], [_candidate("bolt")], now=200.0)
    (mine,) = alerts.list(A)
    (theirs,) = alerts.list(B)
    assert mine.annotations["summary"] == "acme's"
    assert mine.incident_id is not None and theirs.incident_id is not None
    for read in (alerts.get, alerts.ack, alerts.resolve):
        with pytest.raises(NotFound):
            read(A, theirs.id)
    with pytest.raises(NotFound):
        alerts.incident(A, theirs.incident_id)
    inc = alerts.incident(A, mine.incident_id)
    assert [a.id for a in inc.alerts] == [mine.id]
    # On-call sees every tenant's infrastructure alerts; a tenant's admin its own only.
    assert {a.tenant for a in alerts.list_infra(ONCALL)} == {"acme", "bolt"}
    assert {a.tenant for a in alerts.list_infra(A)} == {"acme"}
    # Reconciling acme's runs with nothing firing resolves acme's alert, not bolt's.
    alerts.apply("acme", ["r1"], [], now=300.0)
    assert alerts.get(A, mine.id).state == "resolved"
    assert alerts.get(B, theirs.id).state == "firing"
    assert alerts.incident(B, theirs.incident_id).status == "open"


def test_oncall_acknowledges_every_tenants_infrastructure_alerts_and_nothing_else(
    meta: MetadataStore,
) -> None:
    alerts = AlertStore(meta, AccessStore(meta))
    job_rule = next(r for r in DEFAULT_POLICY.rules if r.audience != "infra_oncall")
    job = Candidate(
        job_rule,
        {"tenant": "bolt", "alertname": job_rule.name, "run_id": "r1"},
        {"summary": "bolt's job"},
        starts_at=100.0,
        finding_key="j",
    )
    alerts.apply("bolt", ["r1"], [_candidate("bolt"), job], now=200.0)
    by_name = {a.alertname: a for a in alerts.list(B)}
    infra = by_name[_candidate("bolt").rule.name]
    assert alerts.ack(ONCALL, infra.id).acked_by == "olga"
    with pytest.raises(NotFound):  # a tenant's job alert is the tenant's to acknowledge
        alerts.ack(ONCALL, by_name[job_rule.name].id)
    assert alerts.get(B, by_name[job_rule.name].id).acked_by is None


def _graph_of(g: GraphStore, scope: Scope, ck_size: int) -> None:
    g.register_dataset(scope, "web", "v1", content_hash=f"sha256:{scope.tenant}")
    g.describe_run(scope, "r1", code=scope.tenant, dataset="web:v1", experiment_id="e")
    g.record_checkpoint(scope, "r1", 10, checkpoint_id="ck", size_bytes=ck_size)
    g.register_artifact(scope, "r1", "log", f"s3://{scope.tenant}/log", sha256="ab")
    g.register_model_version(scope, "m", "v1", "r1", checkpoint_id="ck")


def test_graph_objects(meta: MetadataStore) -> None:
    _observe_both(meta)
    g = GraphStore(meta)
    _graph_of(g, A, 1)
    _graph_of(g, B, 2)
    lineage = g.run_lineage(A, "r1")
    assert lineage.code == {"commit": "acme"}
    assert isinstance(lineage.dataset, DatasetInfo)
    assert lineage.dataset.content_hash == "sha256:acme"
    assert [j.job_id for j in lineage.jobs] == ["ja"]
    assert [c.size_bytes for c in lineage.checkpoints] == [1]
    assert len(lineage.model_versions) == 1
    assert g.dataset(A, "web", "v1").content_hash == "sha256:acme"
    assert [c.size_bytes for c in g.checkpoints(B, "r1")] == [2]
    assert [a.uri for a in g.artifacts(A, "r1")] == ["s3://acme/log"]
    assert len(g.model_versions(A)) == 1
    assert g.model_lineage(B, "m", "v1").checkpoint.size_bytes == 2
    with pytest.raises(NotFound):
        g.checkpoints(A, "rb")
    # A project-scoped caller: bolt's vision project does not see its llm run's model.
    vision = Scope(tenant="bolt", role="editor", project="vision")
    assert g.model_versions(vision) == []
    with pytest.raises(NotFound):
        g.model_lineage(vision, "m", "v1")


def _req(model_version: str, shard_size: int = 2) -> EvaluationRequest:
    return EvaluationRequest(
        adapter=ECHO,
        suite=toy_suite(4),
        shard_size=shard_size,
        model_id="m",
        model_version=model_version,
    )


def test_evaluations_and_registry(meta: MetadataStore) -> None:
    _observe_both(meta)
    g = GraphStore(meta)
    for scope, version in ((A, "va"), (B, "vb")):
        g.record_checkpoint(scope, "r1", 10, checkpoint_id="ck", checksum="sha256:same")
        g.register_model_version(scope, "m", version, "r1", checkpoint_id="ck")
    evals = EvalStore(meta)
    a_ev = evals.submit(A, _req("va")).evaluation_id
    b_ev = evals.submit(B, _req("vb", shard_size=4)).evaluation_id
    assert [e.evaluation_id for e in evals.evaluations(A)] == [a_ev]
    with pytest.raises(NotFound):
        evals.get(A, b_ev)
    b_shard = evals.lease(B, "w")
    assert b_shard is not None and b_shard.evaluation_id == b_ev
    with pytest.raises(NotFound):
        evals.heartbeat(A, b_shard.shard_id, b_shard.lease_token)
    # A's workers lease A's two shards, then nothing: bolt's queue is not theirs.
    for _ in range(2):
        sh = evals.lease(A, "w")
        assert sh is not None and sh.evaluation_id == a_ev
        evals.complete(A, sh.shard_id, sh.lease_token,
                       {e["id"]: {"exact_match": 1.0} for e in sh.examples})  # fmt: skip
    assert evals.lease(A, "w") is None
    assert evals.get(A, a_ev).state == "COMPLETED"
    assert evals.get(B, b_ev).state == "RUNNING"
    # Same inputs, same cache key: bolt does not reuse acme's result.
    assert not evals.submit(B, _req("vb")).cache_hit
    assert evals.submit(A, _req("va")).cache_hit
    # Model registry: the same model name in both tenants, each alias its tenant's.
    registry = Registry(meta, evals)
    registry.set_alias(A, "m", "candidate", "va")
    registry.set_alias(B, "m", "candidate", "vb")
    assert registry.aliases(A, "m") == {"candidate": "va"}
    assert [h.to_version for h in registry.history(B, "m")] == ["vb"]
    with pytest.raises(NotFound):
        registry.set_alias(A, "m", "candidate", "vb")


def _action(tenant: str, node: str, state: State = State.AWAITING_APPROVAL) -> Action:
    return Action(id=0, tenant=tenant, run_id="r1", node=node, reason="straggler",
                  mode="approve", state=state, decided_at=1.0, updated_at=1.0,
                  alert_id=7)  # fmt: skip


def test_remediations(meta: MetadataStore) -> None:
    _observe_both(meta)
    repo = Repository(meta, telemetry=None)  # type: ignore[arg-type]
    a = repo.add(_action("acme", "na", State.RESTARTING))
    b = repo.add(_action("bolt", "nb", State.RESTARTING))
    assert [x.node for x in repo.for_run("acme", "r1")] == ["na"]
    assert repo.get("acme", b.id) is None and repo.get(A, b.id) is None
    got = repo.get(ONCALL, b.id)
    assert got is not None and got.node == "nb"
    restarting = repo.restarting("acme", "r1")
    assert restarting is not None and restarting.id == a.id
    assert [x.node for x in repo.find(A, None, None, 10)] == ["na"]
    assert {x.node for x in repo.find(ONCALL, None, None, 10)} == {"na", "nb"}
    assert [x.node for x in repo.linked("bolt", "", alert_id=7)] == ["nb"]
    assert [x.node for x in repo.linked("bolt", "vision", alert_id=7)] == []
    # The controller's pass and /metrics cover every tenant, declared as such.
    assert {x.node for x in repo.active()} == {"na", "nb"}
    assert sum(repo.state_counts().values()) == 2


# -- the package, read structurally ---------------------------------------------------------------

PACKAGE = Path(fleetlens.__file__).parent
HELPER = PACKAGE / "store" / "scoped.py"
HELPERS = {"scoped", "all_tenants", "infra_scoped", "same_tenant"}
STATEMENTS = {"select", "update", "delete"}
TENANT_MODELS = {
    m.class_.__name__ for m in Base.registry.mappers if "tenant" in m.local_table.columns
}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_statement(node: ast.AST) -> bool:
    """``select(...)``, ``update(...)``, ``delete(...)`` (or ``sa.select(...)``), not a method
    of that name such as ``dict.update`` or ``Session.delete``."""
    if not isinstance(node, ast.Call) or _name(node.func) not in STATEMENTS:
        return False
    f = node.func
    return isinstance(f, ast.Name) or (
        isinstance(f, ast.Attribute) and _name(f.value) in ("sa", "sqlalchemy")
    )


def _touches_metadata(tree: ast.AST) -> bool:
    """The module imports SQLAlchemy or the metadata store's tables (a Prometheus filter on a
    ``tenant`` label, say, is not a metadata query)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            a.name.startswith("sqlalchemy") for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (
            (node.module or "").startswith("sqlalchemy")
            or (node.module or "").rsplit(".", 1)[-1] in ("models", "graph_models")
            or any(a.name in TENANT_MODELS for a in node.names)
        ):
            return True
    return False


def _violations(source: str) -> list[str]:
    """In a module of the metadata side, tenant comparisons; anywhere, statements over a
    tenant's table built outside the helper."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    metadata_side = _touches_metadata(tree)
    out = []
    for node in ast.walk(tree):
        if (
            metadata_side
            and isinstance(node, ast.Compare)
            and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops)
        ):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "tenant" for s in sides):
                out.append(f"line {node.lineno}: tenant comparison {ast.unparse(node)}")
        if not _is_statement(node):
            continue
        top: ast.AST = node  # the whole chain: select(...).where(...).order_by(...)
        while (p := parents.get(top)) is not None and (
            (isinstance(p, ast.Attribute) and p.value is top)
            or (isinstance(p, ast.Call) and p.func is top)
        ):
            top = p
        names = {n.id for n in ast.walk(top) if isinstance(n, ast.Name)}
        if not names & TENANT_MODELS:
            continue
        inside = any(isinstance(n, ast.Call) and _name(n.func) in HELPERS for n in ast.walk(top))
        above, p = False, parents.get(node)
        while p is not None and not above:
            above = isinstance(p, ast.Call) and _name(p.func) in HELPERS
            p = parents.get(p)
        if not (inside or above):
            out.append(f"line {node.lineno}: unscoped statement {ast.unparse(top)[:120]}")
    return out


def test_the_structural_check_catches_a_hand_written_filter() -> None:
    assert {"Run", "ApiToken", "Finding", "Alert", "Evaluation", "Remediation"} <= TENANT_MODELS
    bad = (
        "from sqlalchemy import select\n"
        "q = select(Run).where(Run.tenant == t)\n"
        "ok = a.tenant != b\n"
    )
    assert len(_violations(bad)) == 3
    assert _violations("ok = labels.get('tenant') == self.tenant\n") == []
    unscoped = "rows = s.scalars(select(func.count()).where(EvalShard.state == 'x'))\n"
    assert len(_violations(unscoped)) == 1
    good = (
        "q = scoped(select(Run), scope).where(Run.run_id == r)\n"
        "n = all_tenants(select(func.count()).select_from(ApiToken))\n"
        "e = select(Run.id).where(same_tenant(Run, Remediation)).exists()\n"
        "t = select(Tenant).where(Tenant.name == name)\n"
    )
    assert _violations(good) == []


def test_every_metadata_query_is_scoped_or_declared_cross_tenant() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == HELPER or "migrations" in path.parts:
            continue
        found += [f"{path.relative_to(PACKAGE.parent)} {v}" for v in _violations(path.read_text())]
    assert found == [], "\n".join(found)
