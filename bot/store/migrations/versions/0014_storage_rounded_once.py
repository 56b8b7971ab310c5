"""storage carried across a change of disk or price keeps the part that was rounding up, so
the disk's cost is rounded to a micro once over its life

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 15:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0014'
down_revision: str | Sequence[str] | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)


def upgrade() -> None:
    with op.batch_alter_table('instance', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('storage_carried_excess', sa.BigInteger(), server_default='0', nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table('instance', schema=None) as batch_op:
        batch_op.drop_column('storage_carried_excess')
