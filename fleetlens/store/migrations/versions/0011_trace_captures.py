"""Profiler traces asked of a job's ranks when a step bound is crossed (triggered capture,
fleetlens/services/captures.py), and each rank's breakdown of the captured steps.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "trace_captures",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("ranks", sa.JSON(), nullable=False),
        sa.Column("from_step", sa.BigInteger(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("warmup", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(1024), nullable=False),
        sa.Column("finding_key", sa.String(256), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.String(1024), nullable=False),
        sa.Column("requested_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("results", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_trace_captures"),
    )
    op.create_index("ix_trace_captures_run", "trace_captures", ["tenant", "run_id"])
    op.create_index("ix_trace_captures_state", "trace_captures", ["state"])


def downgrade() -> None:
    op.drop_index("ix_trace_captures_state", "trace_captures")
    op.drop_index("ix_trace_captures_run", "trace_captures")
    op.drop_table("trace_captures")
