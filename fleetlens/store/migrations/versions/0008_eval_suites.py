"""Evaluation suites (named, versioned), the policies that start evaluations by themselves, and
what an evaluation found against its baseline (regressions) and which policy started it.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eval_suites",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_eval_suites"),
        sa.UniqueConstraint("tenant", "name", "version", name="uq_eval_suites_tenant"),
    )
    op.create_index("ix_eval_suites_tenant", "eval_suites", ["tenant"])
    op.create_table(
        "eval_triggers",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("trigger_id", sa.String(64), nullable=False),
        sa.Column("project", sa.String(256), nullable=False),
        sa.Column("on", sa.String(32), nullable=False),
        sa.Column("model_id", sa.String(256), nullable=False),
        sa.Column("alias", sa.String(128), nullable=False),
        sa.Column("suite", sa.String(260), nullable=False),
        sa.Column("adapter", sa.JSON(), nullable=False),
        sa.Column("priority", sa.String(4), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_eval_triggers"),
        sa.UniqueConstraint("tenant", "trigger_id", name="uq_eval_triggers_tenant"),
    )
    op.create_index("ix_eval_triggers_tenant", "eval_triggers", ["tenant"])
    with op.batch_alter_table("evaluations") as b:
        b.add_column(sa.Column("trigger_id", sa.String(64), nullable=False, server_default=""))
        b.add_column(sa.Column("regressions", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("evaluations") as b:
        b.drop_column("regressions")
        b.drop_column("trigger_id")
    op.drop_index("ix_eval_triggers_tenant", "eval_triggers")
    op.drop_table("eval_triggers")
    op.drop_index("ix_eval_suites_tenant", "eval_suites")
    op.drop_table("eval_suites")
