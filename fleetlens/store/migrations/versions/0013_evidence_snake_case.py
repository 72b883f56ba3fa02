"""Findings' evidence under snake_case keys: the analysis writes ``from_step``, ``used_bytes``, ...
and the API names them in camelCase (fleetlens/api/evidence.py). The findings stored before keep
their entries' camelCase keys; this renames them (an entry's own keys and its ``window``'s; keys
that are data, such as the ranks of a heartbeat, are left as they are).

Revision ID: 0013
Revises: 0012
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_BATCH = 500

_SNAKE = {
    "fromStep": "from_step",
    "toStep": "to_step",
    "lastStep": "last_step",
    "flaggedSteps": "flagged_steps",
    "waitPerStepS": "wait_per_step_s",
    "waitedForMedianS": "waited_for_median_s",
    "seqLen": "seq_len",
    "batchSize": "batch_size",
    "requestedBytes": "requested_bytes",
    "usedBytes": "used_bytes",
    "limitBytes": "limit_bytes",
    "perStepBytes": "per_step_bytes",
    "stepsToLimit": "steps_to_limit",
    "fromBytes": "from_bytes",
    "toBytes": "to_bytes",
    "stalledRankSteps": "stalled_rank_steps",
    "rankSteps": "rank_steps",
    "stalledShare": "stalled_share",
    "gpuTempMax": "gpu_temp_max",
    "smClockRatioMin": "sm_clock_ratio_min",
    "powerMax": "power_max",
    "bandwidthMin": "bandwidth_min",
    "baselineMedianS": "baseline_median_s",
    "othersRatio": "others_ratio",
    "baselineRuns": "baseline_runs",
    "baselineSoftware": "baseline_software",
}
"""The evidence keys the analysis wrote in camelCase before this revision."""

_CAMEL = {v: k for k, v in _SNAKE.items()}

_findings = sa.table("findings", sa.column("id", sa.Integer()), sa.column("evidence", sa.JSON()))


def _entry(e: Any, names: dict[str, str]) -> Any:
    if not isinstance(e, dict):
        return e
    out = {names.get(k, k): v for k, v in e.items()}
    if isinstance(out.get("window"), dict):
        out["window"] = {names.get(k, k): v for k, v in out["window"].items()}
    return out


def _rename(names: dict[str, str]) -> None:
    """Rename the keys of every stored finding's evidence, a batch of rows at a time."""
    conn = op.get_bind()
    last = 0
    while True:
        rows = conn.execute(
            sa.select(_findings.c.id, _findings.c.evidence)
            .where(_findings.c.id > last)
            .order_by(_findings.c.id)
            .limit(_BATCH)
        ).all()
        if not rows:
            return
        for row_id, evidence in rows:
            if isinstance(evidence, list):
                renamed = [_entry(e, names) for e in evidence]
                if renamed != evidence:
                    conn.execute(
                        _findings.update().where(_findings.c.id == row_id).values(evidence=renamed)
                    )
        last = rows[-1][0]


def upgrade() -> None:
    _rename(_SNAKE)


def downgrade() -> None:
    _rename(_CAMEL)
