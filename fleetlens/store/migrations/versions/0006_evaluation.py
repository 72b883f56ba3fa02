"""Evaluation: model aliases and their moves, evaluations, shards, gate decisions.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TABLES = ("model_aliases", "model_alias_moves", "evaluations", "eval_shards", "gate_decisions")


def upgrade() -> None:
    op.create_table(
        "model_aliases",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("project", sa.String(256), nullable=False),
        sa.Column("model_id", sa.String(256), nullable=False),
        sa.Column("alias", sa.String(128), nullable=False),
        sa.Column("version", sa.String(256), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("updated_by", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_model_aliases"),
        sa.UniqueConstraint("tenant", "model_id", "alias", name="uq_model_aliases_tenant"),
    )
    op.create_index("ix_model_aliases_tenant", "model_aliases", ["tenant"])
    op.create_table(
        "model_alias_moves",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("model_id", sa.String(256), nullable=False),
        sa.Column("alias", sa.String(128), nullable=False),
        sa.Column("from_version", sa.String(256), nullable=False),
        sa.Column("to_version", sa.String(256), nullable=False),
        sa.Column("decision_id", sa.String(64), nullable=False),
        sa.Column("override", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.String(2048), nullable=False),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_model_alias_moves"),
    )
    op.create_index("ix_model_alias_moves_tenant", "model_alias_moves", ["tenant"])
    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("project", sa.String(256), nullable=False),
        sa.Column("evaluation_id", sa.String(64), nullable=False),
        sa.Column("model_id", sa.String(256), nullable=False),
        sa.Column("model_version", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("checkpoint_id", sa.String(256), nullable=False),
        sa.Column("adapter", sa.JSON(), nullable=False),
        sa.Column("suite", sa.JSON(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("deadline", sa.Float(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("cache_key", sa.String(64), nullable=False),
        sa.Column("cached_from", sa.String(64), nullable=False),
        sa.Column("provenance", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("error", sa.String(4096), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("completed_at", sa.Float(), nullable=True),
        sa.Column("created_by", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_evaluations"),
        sa.UniqueConstraint("tenant", "evaluation_id", name="uq_evaluations_tenant"),
    )
    op.create_index("ix_evaluations_cache_key", "evaluations", ["cache_key"])
    op.create_index("ix_evaluations_tenant", "evaluations", ["tenant"])
    op.create_table(
        "eval_shards",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("project", sa.String(256), nullable=False),
        sa.Column("evaluation_id", sa.String(64), nullable=False),
        sa.Column("shard_index", sa.Integer(), nullable=False),
        sa.Column("benchmark", sa.String(256), nullable=False),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.Column("stop", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("deadline", sa.Float(), nullable=False),
        sa.Column("locality", sa.String(256), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("lease_token", sa.String(64), nullable=False),
        sa.Column("worker_id", sa.String(256), nullable=False),
        sa.Column("lease_expires", sa.Float(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("scores", sa.JSON(), nullable=False),
        sa.Column("error", sa.String(4096), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_eval_shards"),
        sa.UniqueConstraint("tenant", "evaluation_id", "shard_index", name="uq_eval_shards_tenant"),
    )
    op.create_index("ix_eval_shards_state", "eval_shards", ["state"])
    op.create_index("ix_eval_shards_tenant", "eval_shards", ["tenant"])
    op.create_table(
        "gate_decisions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("decision_id", sa.String(64), nullable=False),
        sa.Column("model_id", sa.String(256), nullable=False),
        sa.Column("candidate_version", sa.String(256), nullable=False),
        sa.Column("baseline_version", sa.String(256), nullable=False),
        sa.Column("candidate_evaluation", sa.String(64), nullable=False),
        sa.Column("baseline_evaluation", sa.String(64), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_gate_decisions"),
        sa.UniqueConstraint("tenant", "decision_id", name="uq_gate_decisions_tenant"),
    )
    op.create_index("ix_gate_decisions_tenant", "gate_decisions", ["tenant"])


def downgrade() -> None:
    for table in reversed(TABLES):
        op.drop_table(table)
