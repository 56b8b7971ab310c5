"""a rental's state is a Launch row, claimed with a lease, instead of the audit log and two sets
of the process that rented

Until now `/gpu rent` wrote its state into the audit log as JSON (``rent_launching`` before the
launch call, with ``launch_id`` and ``platform_name``; ``rent_launched`` with the ``ids`` and
``names`` the platform answered; ``rent_launch_refused``; ``rent_launch_checked`` once a launch
without an answer was looked up on its platform; ``rent_given_back`` and ``rent_recovered`` for
an instance terminated; ``rent_recover_failed`` when the renter was told that terminating failed)
and orphan recovery read it back over the last 7 days. This revision creates the table and moves
every rental of those 7 days (counted back from the newest audit row, so that a store restored
from a backup moves the same rentals) into Launch rows:

- a ``rent_launching`` without an answer: one ``launching`` row per name, due to recovery (which
  looks its platform name up) 10 minutes after the call began, as before;
- a refused one: ``refused`` rows; one checked after it got no answer: ``terminated`` rows;
- each id a ``rent_launched`` names: ``adopted`` when an instance registers it, ``terminated``
  when it was given back or recovered, ``orphaned`` and due at once when giving it back failed
  (it was left billing; recovery now tries again), else ``launched``, held by no process and due
  to recovery once the longest a rental could take has passed (25 minutes an instance), as
  before. A renter already told that terminating failed is not told again.

The audit rows stay as they are, and the bot still writes them in the same shape, so going down
only drops the table.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04 21:00:00.000000
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0019'
down_revision: str | Sequence[str] | None = '0018'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep the imports used even when a revision needs none of them.
_ = (sa, sqlmodel)

#: How far back the old recovery looked, and so which rentals can be in flight.
LOOKBACK = timedelta(days=7)
#: After this, a launch call without an answer had ended (as the old recovery counted).
LAUNCH_CALL = timedelta(minutes=10)
#: The longest setting one instance up could take (waiting to run, for SSH, registering).
PER_INSTANCE = timedelta(seconds=900 + 300 + 300)
#: Why an instance given back could not be terminated then (the bot's words, translated).
COULD_NOT_REGISTER = "it could not be registered"
_ACTIONS = (
    'rent_launching',
    'rent_launched',
    'rent_launch_refused',
    'rent_launch_checked',
    'rent_given_back',
    'rent_recovered',
    'rent_recover_failed',
)


def upgrade() -> None:
    op.create_table('launch',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('launch_key', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('provider', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('instance_type', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('platform_name', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
    sa.Column('renter', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('provider_id', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
    sa.Column('state', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('holder', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
    sa.Column('lease_until', sa.DateTime(), nullable=False),
    sa.Column('started_at', sa.DateTime(), nullable=False),
    sa.Column('changed_at', sa.DateTime(), nullable=False),
    sa.Column('reason', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('told_at', sa.DateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('launch_key', 'position')
    )
    with op.batch_alter_table('launch', schema=None) as batch_op:
        batch_op.create_index('ix_launch_due', ['state', 'lease_until'], unique=False)
        batch_op.create_index('ix_launch_provider_id', ['provider', 'provider_id'], unique=False)
    rows = _rentals_in_flight(op.get_bind())
    if rows:
        op.bulk_insert(_launch_table(), rows)


def downgrade() -> None:
    with op.batch_alter_table('launch', schema=None) as batch_op:
        batch_op.drop_index('ix_launch_provider_id')
        batch_op.drop_index('ix_launch_due')
    op.drop_table('launch')


def _launch_table() -> Any:
    return sa.table(
        'launch',
        sa.column('launch_key', sa.String()),
        sa.column('position', sa.Integer()),
        sa.column('provider', sa.String()),
        sa.column('instance_type', sa.String()),
        sa.column('platform_name', sa.String()),
        sa.column('name', sa.String()),
        sa.column('renter', sa.String()),
        sa.column('provider_id', sa.String()),
        sa.column('state', sa.String()),
        sa.column('holder', sa.String()),
        sa.column('lease_until', sa.DateTime()),
        sa.column('started_at', sa.DateTime()),
        sa.column('changed_at', sa.DateTime()),
        sa.column('reason', sa.String()),
        sa.column('attempts', sa.Integer()),
        sa.column('last_error', sa.Text()),
        sa.column('told_at', sa.DateTime()),
    )


class _Audit:
    """The rent rows of the audit log within the lookback, read once."""

    def __init__(self, bind: Any) -> None:
        audit = sa.table(
            'auditlog',
            sa.column('id', sa.Integer()),
            sa.column('at', sa.DateTime()),
            sa.column('actor', sa.String()),
            sa.column('action', sa.String()),
            sa.column('details_json', sa.Text()),
        )
        newest = bind.execute(sa.select(sa.func.max(audit.c.at))).scalar()
        self.rows: list[tuple[int, datetime, str, str, dict[str, Any]]] = []
        if newest is not None:
            found = bind.execute(
                sa.select(audit.c.id, audit.c.at, audit.c.actor, audit.c.action,
                          audit.c.details_json)
                .where(audit.c.action.in_(_ACTIONS), audit.c.at >= newest - LOOKBACK)
                .order_by(audit.c.id)
            ).all()
            self.rows = [(i, at, actor, action, _details(text)) for i, at, actor, action, text in found]
        instance = sa.table(
            'instance', sa.column('provider', sa.String()),
            sa.column('provider_instance_id', sa.String()),
        )
        self.registered = {
            (p, i) for p, i in bind.execute(
                sa.select(instance.c.provider, instance.c.provider_instance_id)
                .where(instance.c.provider_instance_id.is_not(None))
            ).all()
        }
        self.settled: dict[tuple[str, str], tuple[datetime, str]] = {}
        self.told: dict[tuple[str, str], datetime] = {}
        self.answers: dict[str, tuple[str, datetime, dict[str, Any]]] = {}
        for _id, at, _actor, action, details in self.rows:
            key = (str(details.get('provider')), str(details.get('id')))
            if action in ('rent_given_back', 'rent_recovered'):
                self.settled[key] = (at, str(details.get('detail') or ''))
            elif action == 'rent_recover_failed':
                self.told.setdefault(key, at)
            elif action != 'rent_launching' and details.get('launch_id'):
                self.answers.setdefault(str(details['launch_id']), (action, at, details))


def _rentals_in_flight(bind: Any) -> list[dict[str, Any]]:
    audit = _Audit(bind)
    rows: list[dict[str, Any]] = []
    launching = {
        str(d.get('launch_id')) for _i, _at, _a, action, d in audit.rows
        if action == 'rent_launching' and d.get('launch_id')
    }
    for audit_id, at, actor, action, details in audit.rows:
        launch_id = str(details.get('launch_id') or '')
        if action == 'rent_launching' and launch_id:
            rows.extend(_from_intent(audit, launch_id, at, actor, details))
        elif action == 'rent_launched' and launch_id not in launching:
            key = launch_id or f'audit-{audit_id}'  # written before launches had an id
            rows.extend(_launched(audit, key, at, actor, details, {}))
    return rows


def _from_intent(
    audit: _Audit, launch_id: str, at: datetime, actor: str, intent: dict[str, Any]
) -> list[dict[str, Any]]:
    answer = audit.answers.get(launch_id)
    base = _base(launch_id, at, actor, intent)
    names = [str(n) for n in intent.get('names') or ()] or [None]
    if answer is None:
        return [
            {**base, 'position': pos, 'name': name, 'state': 'launching',
             'lease_until': at + LAUNCH_CALL}
            for pos, name in enumerate(names, start=1)
        ]
    action, answered_at, details = answer
    if action == 'rent_launched':
        return _launched(audit, launch_id, answered_at, actor, details, intent)
    if action == 'rent_launch_refused':
        return [
            {**base, 'position': pos, 'name': name, 'state': 'refused',
             'last_error': str(details.get('error') or '')}
            for pos, name in enumerate(names, start=1)
        ]
    found = [str(i) for i in details.get('terminated') or ()]
    return [
        {**base, 'position': pos, 'name': None, 'state': 'terminated', 'provider_id': pid,
         'last_error': 'found and terminated' if pid else 'nothing started'}
        for pos, pid in enumerate(found or [None], start=1)
    ]


def _launched(
    audit: _Audit,
    key: str,
    at: datetime,
    actor: str,
    details: dict[str, Any],
    intent: dict[str, Any],
) -> list[dict[str, Any]]:
    base = _base(key, at, actor, {**details, **intent})
    provider = base['provider']
    ids = [str(i) for i in details.get('ids') or ()]
    names = [str(n) for n in details.get('names') or ()]
    longest = at + PER_INSTANCE * len(ids)
    rows = []
    for pos, pid in enumerate(ids, start=1):
        row = {**base, 'position': pos, 'name': names[pos - 1] if pos <= len(names) else None,
               'provider_id': pid, 'lease_until': longest,
               'told_at': audit.told.get((provider, pid))}
        settled = audit.settled.get((provider, pid))
        if (provider, pid) in audit.registered:
            row['state'] = 'adopted'
        elif settled is not None and settled[1].startswith('terminating failed'):
            row.update(state='orphaned', lease_until=settled[0], reason=COULD_NOT_REGISTER,
                       told_at=settled[0], last_error=settled[1])
        elif settled is not None:
            row.update(state='terminated', last_error=settled[1])
        else:
            row['state'] = 'launched'
        rows.append(row)
    return rows


def _base(key: str, at: datetime, actor: str, details: dict[str, Any]) -> dict[str, Any]:
    return {
        'launch_key': key[:32],
        'provider': str(details.get('provider'))[:32],
        'instance_type': str(details.get('instance_type') or '')[:128],
        'platform_name': str(details.get('platform_name') or '')[:128],
        'renter': actor[:64],
        'provider_id': None,
        'holder': None,
        'lease_until': at,
        'started_at': at,
        'changed_at': at,
        'reason': None,
        'attempts': 0,
        'last_error': None,
        'told_at': None,
    }


def _details(text: str | None) -> dict[str, Any]:
    try:
        details = json.loads(text or '{}')
    except ValueError:
        return {}
    return details if isinstance(details, dict) else {}
