"""Alerts, incidents and failure-window preservations.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("alertname", sa.String(128), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("audience", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("annotations", sa.JSON(), nullable=False),
        sa.Column("finding_key", sa.String(256), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("starts_at", sa.Float(), nullable=False),
        sa.Column("ends_at", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("notified_at", sa.Float(), nullable=True),
        sa.Column("acked_by", sa.String(256), nullable=False),
        sa.Column("acked_at", sa.Float(), nullable=True),
        sa.Column("incident_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
        sa.UniqueConstraint("tenant", "fingerprint", name="uq_alerts_tenant"),
    )
    op.create_index("ix_alerts_tenant", "alerts", ["tenant"])
    op.create_index("ix_alerts_incident_id", "alerts", ["incident_id"])
    op.create_table(
        "incidents",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("title", sa.String(512), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("opened_at", sa.Float(), nullable=False),
        sa.Column("closed_at", sa.Float(), nullable=True),
        sa.Column("findings", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_incidents"),
    )
    op.create_index("ix_incidents_tenant", "incidents", ["tenant"])
    op.create_table(
        "preservations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("t0", sa.Float(), nullable=False),
        sa.Column("t1", sa.Float(), nullable=False),
        sa.Column("copied_until", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_preservations"),
    )
    op.create_index("ix_preservations_tenant", "preservations", ["tenant"])


def downgrade() -> None:
    op.drop_table("preservations")
    op.drop_table("incidents")
    op.drop_table("alerts")
