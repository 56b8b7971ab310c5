"""a stopped instance's deadline is when its disk is released, and its owner is reminded on a
widening schedule

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 15:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0015'
down_revision: str | Sequence[str] | None = '0014'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)


def upgrade() -> None:
    with op.batch_alter_table('instance', schema=None) as batch_op:
        batch_op.add_column(sa.Column('stopped_remind_at', sa.DateTime(), nullable=True))
        batch_op.create_index(
            'ix_instance_state_stopped_remind', ['state', 'stopped_remind_at'], unique=False
        )
    # Stopped at the deadline under policy "stop": the deadline now holds when the disk is
    # released (it was the deadline, the release came --release-after later).
    instance = sa.table(
        'instance',
        sa.column('state', sa.String()),
        sa.column('deadline_policy', sa.String()),
        sa.column('deadline_at', sa.DateTime()),
        sa.column('stopped_at', sa.DateTime()),
        sa.column('max_grace_s', sa.Integer()),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(sa.literal_column('id'), instance.c.deadline_at, instance.c.max_grace_s).where(
            instance.c.state == 'stopped',
            instance.c.deadline_policy == 'stop',
            instance.c.deadline_at.is_not(None),
            instance.c.deadline_at <= instance.c.stopped_at,
        )
    ).all()
    for row_id, deadline_at, grace_s in rows:
        connection.execute(
            sa.text('UPDATE instance SET deadline_at = :at WHERE id = :id'),
            {'at': deadline_at + _seconds(grace_s), 'id': row_id},
        )


def downgrade() -> None:
    with op.batch_alter_table('instance', schema=None) as batch_op:
        batch_op.drop_index('ix_instance_state_stopped_remind')
        batch_op.drop_column('stopped_remind_at')


def _seconds(value: int | None) -> object:
    from datetime import timedelta

    return timedelta(seconds=value or 0)
