"""Silences as Alertmanager users expect them: a matching alert keeps firing and shows as
silenced, notifies no one while the silence lasts, and is notified once it is expired; other
alerts are not held back; who may silence what; the API refuses a silence without a reason,
without matchers, without an end or for longer than 30 days."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fleetlens.alerts.engine import Candidate
from fleetlens.alerts.policy import DEFAULT_POLICY
from fleetlens.alerts.silences import SilenceStore
from fleetlens.alerts.store import AlertStore
from fleetlens.errors import ConfigError, NotFound
from fleetlens.store.access import AccessStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope
from fleetlens.testing import InProcessServer

pytestmark = pytest.mark.unit


def _candidate(rule: str, run: str, node: str = "") -> Candidate:
    r = DEFAULT_POLICY.rule(rule)
    labels = {"alertname": r.name, "severity": r.severity, "audience": r.audience,
              "tenant": "t1", "run_id": run, "project": "p"}  # fmt: skip
    if node:
        labels["node"] = node
    return Candidate(r, labels, {"summary": f"{rule} on {run}"}, time.time() - 60)


def test_a_silenced_alert_fires_but_notifies_no_one_until_the_silence_ends(
    metadata_url: str,
) -> None:
    meta = MetadataStore(metadata_url)  # SQLite and PostgreSQL: migration 0009 on both
    access = AccessStore(meta)
    alerts, silences = AlertStore(meta, access), SilenceStore(meta, access)
    writer = Scope("t1", "editor", actor="alice")
    hang, slow = _candidate("JobHang", "r1"), _candidate("GoodputLow", "r2")
    sil = silences.create(writer, {"alertname": "JobHang", "run_id": "r1"}, time.time() + 3600,
                          "known: the job is being debugged")  # fmt: skip
    now = time.time()
    sent = alerts.apply("t1", None, [hang, slow], now)
    assert [p.labels["alertname"] for p in sent] == ["GoodputLow"]  # the hang is held back
    listed = {a.alertname: a for a in alerts.list(writer, "firing")}
    assert listed["JobHang"].silenced_by == [sil.id]
    assert listed["GoodputLow"].silenced_by == []
    assert alerts.apply("t1", None, [hang, slow], now + 60) == []  # no reminder either
    # Expired early: the next pass notifies the hang, which still fires.
    silences.expire(writer, sil.id)
    sent = alerts.apply("t1", None, [hang, slow], time.time() + 1)
    assert [p.labels["alertname"] for p in sent] == ["JobHang"]
    assert alerts.list(writer, "firing")[0].silenced_by == []
    # An alert silenced for all its life resolves without telling anyone it ended.
    silences.create(writer, {"alertname": "GoodputLow", "run_id": "r3"}, time.time() + 3600, "x")
    quiet = _candidate("GoodputLow", "r3")
    assert alerts.apply("t1", ["r3"], [quiet], time.time() + 2) == []
    assert alerts.apply("t1", ["r3"], [], time.time() + 3) == []
    # Another tenant neither sees nor expires it.
    other = Scope("t2", "admin", actor="eve")
    assert silences.list(other) == []
    with pytest.raises(NotFound):
        silences.expire(other, sil.id)
    meta.close()


def test_oncall_silences_every_tenants_infrastructure_alerts_and_nothing_else(
    tmp_path: Path,
) -> None:
    meta = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    access = AccessStore(meta)
    alerts, silences = AlertStore(meta, access), SilenceStore(meta, access)
    oncall = Scope("ops", "oncall", actor="pager")
    assert oncall.cross_tenant_infra
    silences.create(oncall, {"node": "gpu-17"}, time.time() + 3600, "node in repair")
    fatal = _candidate("FatalHardwareFault", "r1", node="gpu-17")
    hang = _candidate("JobHang", "r1", node="gpu-17")  # a researcher's alert: not on-call's
    sent = alerts.apply("t1", None, [fatal, hang], time.time())
    assert [p.labels["alertname"] for p in sent] == ["JobHang"]
    assert [s.matchers for s in silences.list(oncall)] == [{"node": "gpu-17"}]
    assert silences.list(Scope("t1", "viewer")) == []  # not the tenant's own silence
    for bad in ({}, {"node": ""}):
        with pytest.raises(ConfigError, match="matcher"):
            silences.create(oncall, bad, time.time() + 60, "x")
    with pytest.raises(ConfigError, match="say why"):
        silences.create(oncall, {"node": "a"}, time.time() + 60, "  ")
    with pytest.raises(ConfigError, match="30 days"):
        silences.create(oncall, {"node": "a"}, time.time() + 31 * 86400, "long")
    meta.close()


@pytest.mark.api
def test_silences_over_http(app: InProcessServer) -> None:
    body = {"matchers": {"alertname": "JobHang", "run_id": "r1"}, "comment": "debugging",
            "durationSeconds": 3600}  # fmt: skip
    st, sil = app.request("POST", "/v1/silences", body)
    assert st == 201 and sil["createdBy"] and sil["endsAt"] - sil["startsAt"] == 3600
    assert [s["id"] for s in app.get("/v1/silences")["silences"]] == [sil["id"]]
    st, err = app.request("POST", "/v1/silences", {**body, "endsAt": time.time() + 60})
    assert st == 400 and "one of them" in err["detail"]
    st, _ = app.request("POST", "/v1/silences", {**body, "matchers": {}})
    assert st == 422
    st, out = app.request("DELETE", f"/v1/silences/{sil['id']}")
    assert st == 200 and out["endsAt"] <= time.time()
    st, err = app.request("DELETE", "/v1/silences/999999")
    assert st == 404 and "999999" in err["detail"]
