"""Alert silences: label matchers and a time window during which matching alerts notify no one.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "silences",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("infra", sa.Boolean(), nullable=False),
        sa.Column("matchers", sa.JSON(), nullable=False),
        sa.Column("starts_at", sa.Float(), nullable=False),
        sa.Column("ends_at", sa.Float(), nullable=False),
        sa.Column("comment", sa.String(1024), nullable=False),
        sa.Column("created_by", sa.String(256), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_silences"),
    )
    op.create_index("ix_silences_tenant", "silences", ["tenant"])


def downgrade() -> None:
    op.drop_index("ix_silences_tenant", "silences")
    op.drop_table("silences")
