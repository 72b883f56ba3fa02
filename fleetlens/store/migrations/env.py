"""Alembic environment: the caller hands us a connection (see fleetlens.store.metadata)."""

from alembic import context

from fleetlens.store.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
