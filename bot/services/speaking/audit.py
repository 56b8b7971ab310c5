"""The audit log: who changed what, when. One row per change, in the changing transaction, at
the time of the runtime's clock. Every service writes its rows through :func:`record`."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from bot.store.models import AuditLog


def record(
    session: Session,
    actor: str,
    action: str,
    instance_id: int | None,
    *,
    at: datetime,
    **details: Any,
) -> AuditLog:
    """Add an audit row to ``session``'s transaction, so it lands with the change or not at all.

    ``actor`` is a Slack user ID (or ``gpubot`` for the bot's own decisions); ``at`` naive UTC
    from the runtime's clock (``rt.now()``); ``details`` anything JSON can show (other values
    as their ``str``)."""
    row = AuditLog(
        at=at,
        actor=actor,
        action=action,
        instance_id=instance_id,
        details_json=json.dumps(details, default=str, sort_keys=True),
    )
    session.add(row)
    return row


def entries(
    session: Session,
    *,
    instance_id: int | None = None,
    action: str | None = None,
    limit: int = 100,
) -> list[AuditLog]:
    """The newest audit rows first, optionally of one instance and/or one action."""
    query = select(AuditLog)
    if instance_id is not None:
        query = query.where(AuditLog.instance_id == instance_id)
    if action is not None:
        query = query.where(AuditLog.action == action)
    query = query.order_by(col(AuditLog.at).desc(), col(AuditLog.id).desc()).limit(limit)
    return list(session.exec(query).all())


def details(row: AuditLog) -> dict[str, Any]:
    """The row's details as a dict."""
    loaded = json.loads(row.details_json or "{}")
    return loaded if isinstance(loaded, dict) else {"value": loaded}
