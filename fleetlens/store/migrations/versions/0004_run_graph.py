"""The run graph: experiments, run extras, dataset versions, checkpoints, model versions,
artifacts.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _id() -> list[sa.Column]:  # type: ignore[type-arg]
    return [
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(256), nullable=False),
    ]


def _table(name: str, unique: tuple[str, ...], *cols: sa.Column) -> None:  # type: ignore[type-arg]
    op.create_table(
        name,
        *_id(),
        *cols,
        sa.PrimaryKeyConstraint("id", name=f"pk_{name}"),
        sa.UniqueConstraint("tenant", *unique, name=f"uq_{name}_tenant"),
    )
    op.create_index(f"ix_{name}_tenant", name, ["tenant"])


def upgrade() -> None:
    S = sa.String
    _table(
        "experiments",
        ("experiment_id",),
        sa.Column("project", S(256), nullable=False),
        sa.Column("experiment_id", S(256), nullable=False),
        sa.Column("description", S(1024), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    _table(
        "run_extras",
        ("run_id",),
        sa.Column("run_id", S(256), nullable=False),
        sa.Column("code", sa.JSON(), nullable=False),
        sa.Column("dataset_name", S(256), nullable=False),
        sa.Column("dataset_version", S(256), nullable=False),
        sa.Column("launch_command", S(8192), nullable=False),
        sa.Column("environment", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    _table(
        "dataset_versions",
        ("name", "version"),
        sa.Column("project", S(256), nullable=False),
        sa.Column("name", S(256), nullable=False),
        sa.Column("version", S(256), nullable=False),
        sa.Column("content_hash", S(128), nullable=False),
        sa.Column("uri", S(2048), nullable=False),
        sa.Column("shards", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    _table(
        "checkpoints",
        ("run_id", "checkpoint_id"),
        sa.Column("run_id", S(256), nullable=False),
        sa.Column("checkpoint_id", S(256), nullable=False),
        sa.Column("job_id", S(256), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("uri", S(2048), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("checksum", S(128), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("sync", sa.Boolean(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
    )
    _table(
        "model_versions",
        ("model_id", "version"),
        sa.Column("project", S(256), nullable=False),
        sa.Column("model_id", S(256), nullable=False),
        sa.Column("version", S(256), nullable=False),
        sa.Column("run_id", S(256), nullable=False),
        sa.Column("checkpoint_id", S(256), nullable=False),
        sa.Column("evaluation_id", S(256), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", S(256), nullable=False),
    )
    _table(
        "artifacts",
        ("run_id", "name"),
        sa.Column("run_id", S(256), nullable=False),
        sa.Column("name", S(512), nullable=False),
        sa.Column("kind", S(64), nullable=False),
        sa.Column("uri", S(2048), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("sha256", S(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    for name in (
        "artifacts",
        "model_versions",
        "checkpoints",
        "dataset_versions",
        "run_extras",
        "experiments",
    ):
        op.drop_table(name)
