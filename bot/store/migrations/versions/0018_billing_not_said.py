"""a platform instance's billing rule equal to its platform's documented one is not said (NULL):
rentals and registrations copied the provider's rules into the row, which could not be told
from a rule someone gave

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 20:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0018'
down_revision: str | Sequence[str] | None = '0017'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)

#: Each platform's documented rules when this revision was written (increment, minimum per
#: start in seconds, billing from), as its provider module declared them; a row holding the
#: same value bills the same with NULL. ``manual`` rows bill as typed and are left alone.
_DOCUMENTED = {
    'aws': ('second', 60, 'created'),
    'lambda': ('minute', 0, 'ssh_ready'),
    'runpod': ('second', 0, 'created'),
    'vast': ('second', 0, 'created'),
    'compshare': ('hour', 0, 'created'),
}

_COLUMNS = (
    ('billing_increment', sqlmodel.sql.sqltypes.AutoString(length=8)),
    ('min_charge_s', sa.Integer()),
    ('billing_from', sqlmodel.sql.sqltypes.AutoString(length=16)),
)


def upgrade() -> None:
    instance = sa.table('instance', sa.column('provider', sa.String()),
                        *(sa.column(name, kind) for name, kind in _COLUMNS))
    for provider, values in _DOCUMENTED.items():
        for (name, _kind), value in zip(_COLUMNS, values, strict=True):
            op.execute(
                instance.update()
                .where(instance.c.provider == provider, instance.c[name] == value)
                .values({name: None})
            )


def downgrade() -> None:
    # NULL already meant "the platform's rule" at 0017: nothing to put back.
    pass
