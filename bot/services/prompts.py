"""Prompt rows: create once, post at most once per claim, record where they were posted.

A prompt is unique per (instance, kind, key). Posting claims the row first with a conditional
UPDATE (``sent_at`` set while ``message_ts`` is empty), commits, posts outside any transaction and
records the message after. A claim left behind by a crash expires after ``CLAIM_LEASE_S``, so a
prompt is never lost; two processes never both post it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import or_, update
from sqlmodel import Session, col, select

from bot.errors import GpubotError
from bot.notify import MessageRef
from bot.runtime import Runtime
from bot.store.models import AuditLog, Instance, Prompt

log = logging.getLogger(__name__)

#: How long a claim to post a prompt holds before another tick may take it over.
CLAIM_LEASE_S = 120

Message = tuple[str, tuple[dict[str, Any], ...]]
#: Renders a prompt of some kind at posting time, from the current rows; None means the prompt
#: no longer applies (it is then closed as "skipped" without being posted).
Renderer = Callable[[Runtime, Session, Prompt, Instance], Message | None]

#: Renderers by prompt kind; service modules add theirs when imported.
RENDERERS: dict[str, Renderer] = {}


def ensure_prompt(
    session: Session,
    *,
    instance_id: int,
    kind: str,
    key: str,
    recipient: str,
    due_at: datetime,
) -> Prompt:
    """The prompt (instance_id, kind, key), inserted when missing. Safe when two processes race:
    the loser of the unique key reads the winner's row."""
    existing = find_prompt(session, instance_id, kind, key)
    if existing is not None:
        return existing
    prompt = Prompt(instance_id=instance_id, kind=kind, key=key, recipient=recipient, due_at=due_at)
    try:
        with session.begin_nested():
            session.add(prompt)
    except sa_exc.IntegrityError:
        found = find_prompt(session, instance_id, kind, key)
        if found is None:
            raise
        return found
    return prompt


def find_prompt(session: Session, instance_id: int, kind: str, key: str) -> Prompt | None:
    """The prompt with this unique key, or None."""
    return session.exec(
        select(Prompt).where(
            Prompt.instance_id == instance_id, Prompt.kind == kind, Prompt.key == key
        )
    ).first()


def deliver(
    rt: Runtime,
    prompt_id: int,
    text: str,
    blocks: Sequence[dict[str, Any]] = (),
    *,
    channel: str | None = None,
) -> MessageRef | None:
    """Post the prompt to its recipient (or ``channel``) unless it was posted or is being posted.

    Returns where it was posted, or None when another claim holds it, it was already posted, or
    posting failed (the claim is then released so the next tick tries again)."""
    claimed_at = rt.now()
    stale = claimed_at - timedelta(seconds=CLAIM_LEASE_S)
    with rt.db.session() as session:
        result = session.exec(
            update(Prompt)
            .where(
                col(Prompt.id) == prompt_id,
                col(Prompt.message_ts).is_(None),
                col(Prompt.resolved_at).is_(None),
                or_(col(Prompt.sent_at).is_(None), col(Prompt.sent_at) < stale),
            )
            .values(sent_at=claimed_at)
        )
        if result.rowcount != 1:
            return None
        prompt = session.get(Prompt, prompt_id)
        assert prompt is not None
        recipient = channel or prompt.recipient
    try:
        ref = rt.notifier.post(recipient, text, blocks)
    except GpubotError as exc:
        log.warning("posting prompt %s to %s failed: %s", prompt_id, recipient, exc)
        with rt.db.session() as session:
            session.exec(
                update(Prompt)
                .where(
                    col(Prompt.id) == prompt_id,
                    col(Prompt.sent_at) == claimed_at,
                    col(Prompt.message_ts).is_(None),
                )
                .values(sent_at=None)
            )
        return None
    with rt.db.session() as session:
        session.exec(
            update(Prompt)
            .where(col(Prompt.id) == prompt_id)
            .values(sent_at=rt.now(), channel_id=ref.channel, message_ts=ref.ts)
        )
    return ref


def deliver_pending(rt: Runtime, now: datetime, *, instance_id: int | None = None) -> int:
    """Post every due, unposted, unanswered prompt of a kind with a renderer (optionally of one
    instance). Returns how many were posted."""
    stale = now - timedelta(seconds=CLAIM_LEASE_S)
    todo: list[tuple[int, Message]] = []
    with rt.db.session() as session:
        query = select(Prompt).where(
            col(Prompt.message_ts).is_(None),
            col(Prompt.resolved_at).is_(None),
            col(Prompt.due_at) <= now,
            col(Prompt.kind).in_(list(RENDERERS)),
            or_(col(Prompt.sent_at).is_(None), col(Prompt.sent_at) < stale),
        )
        if instance_id is not None:
            query = query.where(Prompt.instance_id == instance_id)
        for prompt in session.exec(query.order_by(col(Prompt.id))).all():
            assert prompt.id is not None
            inst = session.get(Instance, prompt.instance_id)
            message = None if inst is None else RENDERERS[prompt.kind](rt, session, prompt, inst)
            if message is None:
                resolve(session, prompt.id, resolution="skipped", by=None, now=now)
                continue
            todo.append((prompt.id, message))
    posted = 0
    for prompt_id, (text, blocks) in todo:
        if deliver(rt, prompt_id, text, blocks) is not None:
            posted += 1
    return posted


def resolve(
    session: Session, prompt_id: int, *, resolution: str, by: str | None, now: datetime
) -> bool:
    """Mark an open prompt answered; False when it was already answered (first answer wins)."""
    result = session.exec(
        update(Prompt)
        .where(col(Prompt.id) == prompt_id, col(Prompt.resolved_at).is_(None))
        .values(resolved_at=now, resolved_by=by, resolution=resolution)
    )
    return bool(result.rowcount == 1)


def posted_ref(prompt: Prompt) -> MessageRef | None:
    """Where a prompt was posted, or None before it was."""
    if prompt.channel_id and prompt.message_ts:
        return MessageRef(channel=prompt.channel_id, ts=prompt.message_ts)
    return None


def update_message(
    rt: Runtime, prompt: Prompt, text: str, blocks: Sequence[dict[str, Any]] = ()
) -> None:
    """Replace a posted prompt's message (buttons gone, decision shown); failures are logged."""
    ref = posted_ref(prompt)
    if ref is None:
        return
    try:
        rt.notifier.update(ref, text, blocks)
    except GpubotError as exc:
        log.warning("updating prompt %s failed: %s", prompt.id, exc)


def notify(rt: Runtime, recipient: str | None, text: str, blocks: Sequence[dict[str, Any]]) -> None:
    """Best-effort post of an informational message; failures are logged, not raised."""
    if not recipient:
        return
    try:
        rt.notifier.post(recipient, text, blocks)
    except GpubotError as exc:
        log.warning("posting to %s failed: %s", recipient, exc)


def audit(
    session: Session,
    *,
    at: datetime,
    actor: str,
    action: str,
    instance_id: int | None,
    **details: Any,
) -> None:
    """Append an audit log row in the caller's transaction."""
    session.add(
        AuditLog(
            at=at,
            actor=actor,
            action=action,
            instance_id=instance_id,
            details_json=json.dumps(details, default=str, sort_keys=True),
        )
    )
