"""Findings of the analysis loop, its cursors, and workload baselines.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "findings",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("diagnosis", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("summary", sa.String(1024), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("start_step", sa.BigInteger(), nullable=False),
        sa.Column("end_step", sa.BigInteger(), nullable=False),
        sa.Column("time", sa.Float(), nullable=True),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("rack", sa.String(256), nullable=False),
        sa.Column("ranks", sa.JSON(), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_findings"),
        sa.UniqueConstraint("tenant", "run_id", "key", name="uq_findings_tenant"),
    )
    op.create_index("ix_findings_tenant", "findings", ["tenant"])
    op.create_table(
        "analysis_cursors",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("seen_last", sa.Float(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_analysis_cursors"),
        sa.UniqueConstraint("tenant", "run_id", name="uq_analysis_cursors_tenant"),
    )
    op.create_index("ix_analysis_cursors_tenant", "analysis_cursors", ["tenant"])
    op.create_table(
        "workload_baselines",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("signature", sa.String(64), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("values", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workload_baselines"),
        sa.UniqueConstraint("tenant", "signature", "metric", name="uq_workload_baselines_tenant"),
    )
    op.create_index("ix_workload_baselines_tenant", "workload_baselines", ["tenant"])


def downgrade() -> None:
    op.drop_table("workload_baselines")
    op.drop_table("analysis_cursors")
    op.drop_table("findings")
