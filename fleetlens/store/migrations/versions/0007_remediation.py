"""Remediation actions: drain, checkpoint, remove a node, resume.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "remediations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("node", sa.String(256), nullable=False),
        sa.Column("ranks", sa.JSON(), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("summary", sa.String(1024), nullable=False),
        sa.Column("finding_key", sa.String(256), nullable=False),
        sa.Column("alert_id", sa.Integer(), nullable=True),
        sa.Column("incident_id", sa.Integer(), nullable=True),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("decided_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("approved_by", sa.String(256), nullable=False),
        sa.Column("world_before", sa.Integer(), nullable=False),
        sa.Column("world_after", sa.Integer(), nullable=False),
        sa.Column("stop_step", sa.BigInteger(), nullable=False),
        sa.Column("resume_step", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint", sa.JSON(), nullable=False),
        sa.Column("phases", sa.JSON(), nullable=False),
        sa.Column("acks", sa.JSON(), nullable=False),
        sa.Column("actuators", sa.JSON(), nullable=False),
        sa.Column("cost", sa.JSON(), nullable=False),
        sa.Column("error", sa.String(1024), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_remediations"),
    )
    op.create_index("ix_remediations_tenant", "remediations", ["tenant"])
    op.create_index("ix_remediations_run_id", "remediations", ["run_id"])
    op.create_index("ix_remediations_incident_id", "remediations", ["incident_id"])


def downgrade() -> None:
    op.drop_table("remediations")
