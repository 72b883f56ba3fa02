"""Runs and their job attempts.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("project", sa.String(256), nullable=False),
        sa.Column("experiment_id", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("status_at", sa.Float(), nullable=False),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.UniqueConstraint("tenant", "run_id", name="uq_runs_tenant"),
    )
    op.create_index("ix_runs_tenant", "runs", ["tenant"])
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.UniqueConstraint("tenant", "run_id", "job_id", name="uq_jobs_tenant"),
    )
    op.create_index("ix_jobs_tenant", "jobs", ["tenant"])


def downgrade() -> None:
    op.drop_table("jobs")
    op.drop_table("runs")
