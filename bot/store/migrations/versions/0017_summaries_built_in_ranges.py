"""a month's spend summary is built a range of instances at a time; charges indexed by
instance and start

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 17:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0017'
down_revision: str | Sequence[str] | None = '0016'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)


def upgrade() -> None:
    with op.batch_alter_table('spendmonth', schema=None) as batch_op:
        batch_op.add_column(sa.Column('summed_to_id', sa.Integer(), nullable=True))
    with op.batch_alter_table('charge', schema=None) as batch_op:
        batch_op.create_index(
            'ix_charge_instance_start', ['instance_id', 'start_at'], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table('charge', schema=None) as batch_op:
        batch_op.drop_index('ix_charge_instance_start')
    with op.batch_alter_table('spendmonth', schema=None) as batch_op:
        batch_op.drop_column('summed_to_id')
