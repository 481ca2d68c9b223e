"""Alembic environment: runs against the connection treg.infra.migrate hands over."""

from alembic import context
from sqlalchemy import text

from treg.infra.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # plain `alembic` CLI use: build one from the treg settings
    from treg.infra.migrate import engine_for_settings

    engine = engine_for_settings()
    connection = engine.connect()

context.configure(connection=connection, target_metadata=metadata, compare_type=True)
with context.begin_transaction():
    # Several treg processes may start at once on one database: upgrade one at a time.
    connection.execute(text("SELECT pg_advisory_xact_lock(7261011)"))
    context.run_migrations()
