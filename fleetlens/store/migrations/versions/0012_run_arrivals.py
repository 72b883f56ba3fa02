"""A count of the registry writes of each run (data of it arrived), and the count the analysis
loop last read: the loop revisits a run when data arrived, not only when the run's newest record
time moved (an import's scalars, a rank's late rows are older than what was stored before them).

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("arrivals", sa.BigInteger(), nullable=False, server_default="0"))
    with op.batch_alter_table("analysis_cursors") as batch:
        batch.add_column(
            sa.Column("arrivals_seen", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("analysis_cursors") as batch:
        batch.drop_column("arrivals_seen")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("arrivals")
