"""the platforms' own bills per instance, and when each platform's were read

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 12:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0011'
down_revision: str | Sequence[str] | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)


def upgrade() -> None:
    op.create_table('platformbill',
    sa.Column('provider', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('provider_instance_id', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('start_at', sa.DateTime(), nullable=False),
    sa.Column('end_at', sa.DateTime(), nullable=False),
    sa.Column('compute_micros', sa.BigInteger(), nullable=False),
    sa.Column('storage_micros', sa.BigInteger(), nullable=True),
    sa.Column('total_micros', sa.BigInteger(), nullable=False),
    sa.Column('currency', sqlmodel.sql.sqltypes.AutoString(length=8), nullable=False),
    sa.Column('fetched_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('provider', 'provider_instance_id', 'start_at')
    )
    with op.batch_alter_table('platformbill', schema=None) as batch_op:
        batch_op.create_index('ix_platformbill_provider_start', ['provider', 'start_at'], unique=False)

    op.create_table('billfetch',
    sa.Column('provider', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('due_at', sa.DateTime(), nullable=False),
    sa.Column('tried_at', sa.DateTime(), nullable=True),
    sa.Column('fetched_at', sa.DateTime(), nullable=True),
    sa.Column('covered_from', sa.DateTime(), nullable=True),
    sa.Column('covered_to', sa.DateTime(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('provider')
    )


def downgrade() -> None:
    op.drop_table('billfetch')
    with op.batch_alter_table('platformbill', schema=None) as batch_op:
        batch_op.drop_index('ix_platformbill_provider_start')
    op.drop_table('platformbill')
