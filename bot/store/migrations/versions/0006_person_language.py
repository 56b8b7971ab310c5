"""each person's language (`/gpu lang`)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 15:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0006'
down_revision: str | Sequence[str] | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)


def upgrade() -> None:
    with op.batch_alter_table('person', schema=None) as batch_op:
        batch_op.add_column(sa.Column('language', sa.String(length=8), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('person', schema=None) as batch_op:
        batch_op.drop_column('language')
