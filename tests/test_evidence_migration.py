"""Findings stored before their evidence was snake_case read the same after the upgrade.

A database at revision 0012 holds a finding whose evidence has the camelCase keys the analysis
wrote then; opening it with the current code (migration 0013) renames the entries' own keys and
their windows', keeps keys that are data and every value, and the API's answer for it is what
it was. The downgrade gives the stored shape back.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from fleetlens.api.evidence import evidence_json
from fleetlens.store.metadata import _MIGRATIONS, MetadataStore

pytestmark = pytest.mark.unit

STORED_BEFORE: list[dict[str, Any]] = [
    {"metric": "memory", "usedBytes": 7, "limitBytes": 8, "window": {"fromStep": 3, "toStep": 9}},
    # a heartbeat's ranks are data: the keys under "value" are never renamed
    {"metric": "heartbeat", "value": {"fromStep": 1, "rank_3": 2.5}, "lastStep": 40},
    {"signal": "gpu", "gpuTempMax": 91.0, "smClockRatioMin": 0.6, "node": "node_1"},
]

STORED_AFTER: list[dict[str, Any]] = [
    {"metric": "memory", "used_bytes": 7, "limit_bytes": 8,
     "window": {"from_step": 3, "to_step": 9}},
    {"metric": "heartbeat", "value": {"fromStep": 1, "rank_3": 2.5}, "last_step": 40},
    {"signal": "gpu", "gpu_temp_max": 91.0, "sm_clock_ratio_min": 0.6, "node": "node_1"},
]  # fmt: skip

ROW: dict[str, Any] = {
    "tenant": "t", "run_id": "r1", "key": "k1", "kind": "event", "diagnosis": "memory_climb",
    "owner": "user", "confidence": 0.8, "summary": "", "step": 9, "start_step": 3,
    "end_step": 9, "job_id": "a0", "rack": "", "ranks": [0], "nodes": [], "gpus": [],
    "first_seen": 1.0, "updated_at": 1.0,
}  # fmt: skip


def _alembic(engine: sa.Engine, *, up: str = "", down: str = "") -> None:
    cfg = Config()
    cfg.set_main_option("script_location", _MIGRATIONS)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        if up:
            command.upgrade(cfg, up)
        else:
            command.downgrade(cfg, down)


def _evidence(engine: sa.Engine) -> Any:
    findings = sa.table("findings", sa.column("key"), sa.column("evidence", sa.JSON()))
    with engine.connect() as conn:
        return conn.execute(
            sa.select(findings.c.evidence).where(findings.c.key == "k1")
        ).scalar_one()


def test_stored_evidence_is_renamed_and_answers_the_same(metadata_url: str) -> None:
    url = metadata_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = sa.create_engine(url)
    _alembic(engine, up="0012")
    json_columns = ("ranks", "nodes", "gpus", "evidence")
    findings = sa.table(
        "findings",
        *(sa.column(c, sa.JSON() if c in json_columns else None) for c in [*ROW, "evidence"]),
    )
    with engine.begin() as conn:
        conn.execute(findings.insert().values(**ROW, evidence=STORED_BEFORE))
    answered_before = evidence_json(STORED_BEFORE)

    MetadataStore(metadata_url).engine.dispose()  # opening it migrates to the head
    assert _evidence(engine) == STORED_AFTER
    assert evidence_json(STORED_AFTER) == answered_before  # the API's answer is unchanged
    assert answered_before[0]["window"] == {"fromStep": 3, "toStep": 9}

    _alembic(engine, down="0012")
    assert _evidence(engine) == STORED_BEFORE
    engine.dispose()
