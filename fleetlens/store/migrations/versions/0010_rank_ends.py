"""Each rank's last word in a job attempt (finish, failure, signal): a run's status is judged
from them (fleetlens/store/lifecycle.py).

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rank_ends",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("message", sa.String(1024), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rank_ends"),
        sa.UniqueConstraint("tenant", "run_id", "job_id", "rank", name="uq_rank_ends_tenant"),
    )
    op.create_index("ix_rank_ends_tenant", "rank_ends", ["tenant"])


def downgrade() -> None:
    op.drop_index("ix_rank_ends_tenant", "rank_ends")
    op.drop_table("rank_ends")
