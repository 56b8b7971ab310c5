"""Alembic environment: the target is every SQLModel table in bot.store.models.

Run through :meth:`bot.store.db.Database.migrate` (which hands over its own connection) or
``python -m bot.store.migrations.autogen``. Batch mode is always on so that one revision runs
on SQLite (which rebuilds tables to alter them) and on PostgreSQL alike.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

import bot.store.models  # noqa: F401  (registers every table on SQLModel.metadata)

#: Taken for the length of a migration on PostgreSQL so that two processes never migrate at once.
PG_ADVISORY_LOCK_ID = 0x67707562

config = context.config
target_metadata = SQLModel.metadata


def run_offline() -> None:
    """Print the SQL instead of running it (``alembic upgrade --sql``)."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Migrate on the connection the caller handed over, or on a new one from the URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from bot.store.db import Database

    db = Database(config.get_main_option("sqlalchemy.url") or "")
    try:
        with db.engine.connect() as own:
            _run(own)
    finally:
        db.dispose()


def _run(connection: Connection) -> None:
    is_sqlite = connection.dialect.name == "sqlite"
    if is_sqlite:
        # Rebuilding a table in batch mode must not cascade through foreign keys; the pragma
        # only takes effect outside a transaction, so it goes straight to the driver.
        _sqlite_pragma(connection, "PRAGMA foreign_keys = OFF")
    try:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=True,
            compare_type=True,
        )
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_ADVISORY_LOCK_ID})")
            context.run_migrations()
    finally:
        if is_sqlite:
            _sqlite_pragma(connection, "PRAGMA foreign_keys = ON")


def _sqlite_pragma(connection: Connection, statement: str) -> None:
    driver = connection.connection.driver_connection
    if driver is not None:
        driver.execute(statement)


if context.is_offline_mode():
    run_offline()
else:
    run_online()
