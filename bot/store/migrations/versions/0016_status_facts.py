"""what views read of an instance's last status is stored beside it, and one person's
instances and running jobs are found by index

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 17:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = '0016'
down_revision: str | Sequence[str] | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)

#: The live rows (bot.store.models.LIVE), which the partial indexes below hold.
LIVE = "state != 'released'"


def upgrade() -> None:
    # Rows stored before have no facts: views derive them from the snapshot until the next
    # poll stores them. The team's figures are read from the live rows' index entries.
    with op.batch_alter_table('instance', schema=None) as batch_op:
        batch_op.add_column(sa.Column('status_facts_json', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('status_util_pct', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('status_gpu_count', sa.Integer(), nullable=True))
        batch_op.create_index(
            'ix_instance_owner_state', ['owner_id', 'ledger_settled', 'state'], unique=False
        )
        batch_op.create_index(
            'ix_instance_live_prices',
            [
                'state',
                'provider',
                'price_micros',
                'price_per',
                'gpu_count',
                'delivered_gpu_count',
                'disk_gb',
                'storage_micros_per_gb_month',
                'host',
            ],
            unique=False,
            sqlite_where=sa.text(LIVE),
            postgresql_where=sa.text(LIVE),
        )
        batch_op.create_index(
            'ix_instance_live_deadline',
            ['deadline_at', 'name', 'host'],
            unique=False,
            sqlite_where=sa.text(LIVE),
            postgresql_where=sa.text(LIVE),
        )
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.create_index('ix_job_requester_state', ['requested_by', 'state'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index('ix_job_requester_state')
    with op.batch_alter_table('instance', schema=None) as batch_op:
        batch_op.drop_index('ix_instance_live_deadline')
        batch_op.drop_index('ix_instance_live_prices')
        batch_op.drop_index('ix_instance_owner_state')
        batch_op.drop_column('status_gpu_count')
        batch_op.drop_column('status_util_pct')
        batch_op.drop_column('status_facts_json')
