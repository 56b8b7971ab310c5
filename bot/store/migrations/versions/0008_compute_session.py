"""a billing session per start: when the current one began, what the closed ones billed

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 18:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0008'
down_revision: str | Sequence[str] | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)


def upgrade() -> None:
    with op.batch_alter_table('instance', schema=None) as batch_op:
        batch_op.add_column(sa.Column('compute_session_at', sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column('compute_closed_s', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('compute_closed_used_s', sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('instance', schema=None) as batch_op:
        batch_op.drop_column('compute_closed_used_s')
        batch_op.drop_column('compute_closed_s')
        batch_op.drop_column('compute_session_at')
