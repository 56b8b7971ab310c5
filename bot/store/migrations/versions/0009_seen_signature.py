"""Slack request signatures already applied, so that two processes apply a request once

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 13:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0009'
down_revision: str | Sequence[str] | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)


def upgrade() -> None:
    op.create_table(
        'seen_signature',
        sa.Column('signature', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column('expires_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('signature'),
    )
    with op.batch_alter_table('seen_signature', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_seen_signature_expires_at'), ['expires_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('seen_signature', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_seen_signature_expires_at'))
    op.drop_table('seen_signature')
