"""billing rules the registration did not give are NULL (the platform's apply), not the
column defaults that could not be told from a rule someone gave

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 14:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0013'
down_revision: str | Sequence[str] | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)

_COLUMNS = (
    ('billing_increment', sqlmodel.sql.sqltypes.AutoString(length=8), 'second'),
    ('min_charge_s', sa.Integer(), 0),
    ('billing_from', sqlmodel.sql.sqltypes.AutoString(length=16), 'created'),
)


def upgrade() -> None:
    with op.batch_alter_table('instance', schema=None) as batch_op:
        for name, kind, _default in _COLUMNS:
            batch_op.alter_column(name, existing_type=kind, nullable=True)
    # A platform instance holding a column default meant "not said" until now: keep its meaning.
    instance = sa.table('instance', sa.column('provider', sa.String()),
                        *(sa.column(name, kind) for name, kind, _default in _COLUMNS))
    for name, _kind, default in _COLUMNS:
        op.execute(
            instance.update()
            .where(instance.c.provider != 'manual', instance.c[name] == default)
            .values({name: None})
        )


def downgrade() -> None:
    instance = sa.table('instance', *(sa.column(name, kind) for name, kind, _default in _COLUMNS))
    for name, _kind, default in _COLUMNS:
        op.execute(instance.update().where(instance.c[name].is_(None)).values({name: default}))
    with op.batch_alter_table('instance', schema=None) as batch_op:
        for name, kind, _default in _COLUMNS:
            batch_op.alter_column(name, existing_type=kind, nullable=False)
