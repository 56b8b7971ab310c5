"""Alembic migrations for bot.store.models, shipped inside the package.

Apply them with :meth:`bot.store.db.Database.migrate`. After changing ``bot/store/models.py``,
write the next revision with::

    python -m bot.store.migrations.autogen "add budget notes"

and review it: :func:`schema_diff` (and the store tests) report any drift between the models
and the migrated schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlmodel import SQLModel

import bot.store.models  # noqa: F401  (registers every table on SQLModel.metadata)

if TYPE_CHECKING:
    from bot.store.db import Database


def schema_diff(db: Database) -> list[Any]:
    """The differences between the tables in ``db`` and the models, as Alembic's autogenerate
    sees them (an empty list when the migrations are complete). Alembic's own version table is
    ignored."""
    with db.engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "render_as_batch": True}
        )
        diff: list[Any] = compare_metadata(context, SQLModel.metadata)
    return diff
