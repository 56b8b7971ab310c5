"""GPU-samples idle, in use and not measured, per poll, per ledger bucket and per charge

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 15:00:00.000000

The spend summaries are dropped: they split compute the old way (a bucket idle or not as a
whole) and are built again, the new way, when a report asks for their month.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0012'
down_revision: str | Sequence[str] | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)


def upgrade() -> None:
    with op.batch_alter_table('utilsample', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gpus_idle', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('gpus_busy', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('gpus_unmeasured', sa.Integer(), server_default='0', nullable=False))

    with op.batch_alter_table('utilhour', schema=None) as batch_op:
        batch_op.add_column(sa.Column('idle_gpu_samples', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('busy_gpu_samples', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('unmeasured_gpu_samples', sa.Integer(), server_default='0', nullable=False))

    with op.batch_alter_table('charge', schema=None) as batch_op:
        batch_op.add_column(sa.Column('idle_gpu_samples', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('busy_gpu_samples', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('unmeasured_gpu_samples', sa.Integer(), nullable=True))

    op.execute("DELETE FROM spendday")
    op.execute("DELETE FROM spendmonth")


def downgrade() -> None:
    op.execute("DELETE FROM spendday")
    op.execute("DELETE FROM spendmonth")

    with op.batch_alter_table('charge', schema=None) as batch_op:
        batch_op.drop_column('unmeasured_gpu_samples')
        batch_op.drop_column('busy_gpu_samples')
        batch_op.drop_column('idle_gpu_samples')

    with op.batch_alter_table('utilhour', schema=None) as batch_op:
        batch_op.drop_column('unmeasured_gpu_samples')
        batch_op.drop_column('busy_gpu_samples')
        batch_op.drop_column('idle_gpu_samples')

    with op.batch_alter_table('utilsample', schema=None) as batch_op:
        batch_op.drop_column('gpus_unmeasured')
        batch_op.drop_column('gpus_busy')
        batch_op.drop_column('gpus_idle')
