"""a person's Feishu identity linked to their Slack ID by an admin, and the message the bot
keeps pinned in a chat (the fleet's summary in Feishu's ops group)

Two new tables, empty; going down drops them.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04 22:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)


def upgrade() -> None:
    op.create_table(
        "identitylink",
        sa.Column("feishu_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("slack_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("linked_by", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("linked_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("feishu_id"),
        sa.UniqueConstraint("slack_id"),
    )
    op.create_table(
        "chatpin",
        sa.Column("chat_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("message_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("pinned_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("chat_id"),
    )


def downgrade() -> None:
    op.drop_table("chatpin")
    op.drop_table("identitylink")
