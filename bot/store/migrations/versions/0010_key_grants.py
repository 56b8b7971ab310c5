"""who may use which SSH key of the key directory (`/gpu keys allow`)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 13:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0010'
down_revision: str | Sequence[str] | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)


def upgrade() -> None:
    op.create_table('keygrant',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key_name', sqlmodel.sql.sqltypes.AutoString(length=100), nullable=False),
    sa.Column('person_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('granted_by', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('granted_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['person_id'], ['person.slack_id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key_name', 'person_id')
    )
    with op.batch_alter_table('keygrant', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_keygrant_key_name'), ['key_name'], unique=False)
        batch_op.create_index(batch_op.f('ix_keygrant_person_id'), ['person_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('keygrant', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_keygrant_person_id'))
        batch_op.drop_index(batch_op.f('ix_keygrant_key_name'))

    op.drop_table('keygrant')
