"""The outbox: everything the bot says on its own, queued as rows and posted at most once.

A service decides to say something (a job finished, a budget crossed 80 %, the month's digest
is due, an instance was released) and calls :func:`enqueue` in the same transaction as that
decision; the row's ``key`` names what it is about, so deciding twice queues it once. Posting
is separate: :func:`deliver_due` (a tick step) and :func:`deliver` (right after a command
queued something) claim a row with a conditional UPDATE, commit, post outside any transaction
and record the result. Prompts with buttons keep their own rows (their answers live there) and
post through the same rules in :mod:`bot.services.speaking.prompts`.

What can come of a post:

- **Posted**: the row records where (``channel_id``, ``message_ts``).
- **Outcome unknown** (Slack's answer was lost: a timeout, a reset): it may have been posted,
  so it is marked ``unconfirmed`` and never posted again; the audit log keeps it.
- **Refused for good** (``channel_not_found``, ``not_in_channel``, ``is_archived``,
  ``invalid_blocks``, ``msg_too_long`` ...): marked ``failed`` and escalated at once.
- **Anything else** (rate limits, 5xx, no connection): tried again after a back-off that
  doubles from ``RETRY_FIRST_S`` up to ``RETRY_MAX_S``. After ``ESCALATE_AFTER_ATTEMPTS``
  tries, or ``ESCALATE_AFTER_S`` since the first, the ops channel (``GPUBOT_CHANNEL``, else
  the admins) is told once; the message is still retried.

Every post carries its key (``outbox:<id>``) in Slack's message metadata. A row whose earlier
try may have landed (its claim lapsed after ``CLAIM_LEASE_S`` because the process died
mid-post) is first looked for in the conversation, and a post found there is recorded
instead of posting again. A duplicate therefore needs the process to die between Slack
storing the post and the bot recording it (a few milliseconds) *and* Slack's history to miss
the message (more than ``FIND_LIMIT`` newer messages in that conversation before the lease
ends). Files (the digest's chart) carry no metadata: an upload that may have landed is never
repeated.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, update
from sqlalchemy import exc as sa_exc
from sqlmodel import Session, col, select

from bot.errors import GpubotError, SlackError
from bot.i18n import speaking
from bot.notify import FileAttachment, MessageRef, Notice
from bot.runtime import Runtime
from bot.services.speaking import audit
from bot.store.models import OutboxMessage

log = logging.getLogger(__name__)

#: How long a claim to post holds before another process may take it over, in seconds.
CLAIM_LEASE_S = 120
#: Back-off after a failed try: doubles from the first to the most, in seconds.
RETRY_FIRST_S = 30
RETRY_MAX_S = 900
#: A message still unposted after this many tries, or this long after the first, is escalated.
ESCALATE_AFTER_ATTEMPTS = 5
ESCALATE_AFTER_S = 900
#: At most this many rows are posted in one call of :func:`deliver_due`.
DELIVER_BATCH = 50
#: ``OutboxMessage.delivery`` values.
POSTED = "posted"
UNCONFIRMED = "unconfirmed"
FAILED = "failed"
#: The kind of an escalation (never escalated itself).
KIND_ESCALATION = "escalation"
#: Slack errors that no retry can fix.
PERMANENT_ERRORS = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "invalid_blocks",
        "invalid_blocks_format",
        "msg_too_long",
        "no_text",
        "user_not_found",
        "cannot_dm_bot",
        "restricted_action",
        "account_inactive",
        "invalid_file_type",
    }
)


def enqueue(
    session: Session,
    *,
    key: str,
    kind: str,
    recipient: str,
    text: str,
    now: datetime,
    blocks: Sequence[dict[str, Any]] = (),
    instance_id: int | None = None,
    thread_ts: str | None = None,
    files: Sequence[FileAttachment] = (),
    due_at: datetime | None = None,
) -> int:
    """Queue a message in the caller's transaction unless one with ``key`` is queued already;
    returns the row id (the earlier row's when the key is taken). ``files`` go in the thread
    of the message once it is posted. Safe when two processes race on the same key."""
    existing = _id_of(session, key)
    if existing is not None:
        return existing
    message = OutboxMessage(
        key=key,
        kind=kind,
        instance_id=instance_id,
        recipient=recipient,
        thread_ts=thread_ts,
        text=text,
        blocks_json=json.dumps(list(blocks)),
        created_at=now,
        due_at=due_at or now,
    )
    try:
        with session.begin_nested():
            session.add(message)
            session.flush()
            assert message.id is not None
            for index, attachment in enumerate(files):
                session.add(
                    OutboxMessage(
                        key=f"{key}/file/{index}",
                        kind=f"{kind}_file",
                        instance_id=instance_id,
                        recipient=recipient,
                        thread_of=message.id,
                        text=attachment.title or attachment.name,
                        file_name=attachment.name,
                        file_bytes=attachment.content,
                        created_at=now,
                        due_at=due_at or now,
                    )
                )
    except sa_exc.IntegrityError:
        found = _id_of(session, key)
        if found is None:
            raise
        return found
    return message.id


def enqueue_notice(
    rt: Runtime,
    session: Session,
    notice: Notice,
    *,
    key: str,
    recipient: str,
    now: datetime,
    instance_id: int | None = None,
) -> int:
    """Render ``notice`` in the active language and queue it as :func:`enqueue` does (once per
    ``key``); returns the row id."""
    text, body = rt.message(notice)
    return enqueue(
        session,
        key=key,
        kind="notice",
        recipient=recipient,
        text=text,
        blocks=body,
        now=now,
        instance_id=instance_id,
    )


def send(
    rt: Runtime,
    *,
    key: str,
    kind: str,
    recipient: str | None,
    text: str,
    blocks: Sequence[dict[str, Any]] = (),
    instance_id: int | None = None,
    thread_ts: str | None = None,
    files: Sequence[FileAttachment] = (),
) -> MessageRef | None:
    """Queue a message in a transaction of its own and try to post it now; a failed try is
    left to the clock. Returns where it was posted, or None (nobody to tell, already queued or
    posted by someone else, or not posted yet)."""
    if not recipient:
        return None
    now = rt.now()
    with rt.db.session() as session:
        message_id = enqueue(
            session,
            key=key,
            kind=kind,
            recipient=recipient,
            text=text,
            now=now,
            blocks=blocks,
            instance_id=instance_id,
            thread_ts=thread_ts,
            files=files,
        )
    return deliver(rt, message_id)


def due_clause(now: datetime) -> Any:
    """The rows :func:`deliver_due` posts at ``now`` (naive UTC): not delivered, due, and not
    claimed by a poster within ``CLAIM_LEASE_S``."""
    stale = now - timedelta(seconds=CLAIM_LEASE_S)
    return and_(
        col(OutboxMessage.delivery).is_(None),
        col(OutboxMessage.due_at) <= now,
        or_(col(OutboxMessage.claimed_at).is_(None), col(OutboxMessage.claimed_at) < stale),
    )


def deliver_due(rt: Runtime, now: datetime, *, limit: int = DELIVER_BATCH) -> int:
    """Post up to ``limit`` due rows, oldest first (one indexed query to find them); returns
    how many were posted. Files wait for the message they belong to."""
    with rt.db.session() as session:
        ids = session.exec(
            select(OutboxMessage.id)
            .where(due_clause(now))
            .order_by(col(OutboxMessage.due_at), col(OutboxMessage.id))
            .limit(limit)
        ).all()
    posted = 0
    for message_id in ids:
        assert message_id is not None
        if deliver(rt, message_id, now=now) is not None:
            posted += 1
    return posted


def deliver(rt: Runtime, message_id: int, *, now: datetime | None = None) -> MessageRef | None:
    """Claim and post one row (and then the files in its thread). Returns where it was posted,
    or None when it is not ours to post (claimed, posted, unconfirmed, failed, not due, or a
    file whose message is not out yet) or this try failed (recorded; see the module notes)."""
    claimed_at = now or rt.now()
    claim = _claim(rt, message_id, claimed_at)
    if claim is None:
        return None
    try:
        ref = _post(rt, claim)
    except GpubotError as exc:
        _record_failure(rt, claim, claimed_at, exc)
        return None
    _record_posted(rt, claim, ref)
    if claim.file_name is None:
        _deliver_files(rt, message_id, claimed_at)
    return ref


def pending(session: Session, *, kind: str | None = None) -> list[OutboxMessage]:
    """Rows not yet posted, unconfirmed or failed (optionally of one kind), oldest first."""
    query = select(OutboxMessage).where(col(OutboxMessage.delivery).is_(None))
    if kind is not None:
        query = query.where(OutboxMessage.kind == kind)
    return list(session.exec(query.order_by(col(OutboxMessage.id))).all())


def find(session: Session, key: str) -> OutboxMessage | None:
    """The row queued under ``key``, or None."""
    return session.exec(select(OutboxMessage).where(OutboxMessage.key == key)).first()


def ops_recipient(rt: Runtime) -> str | None:
    """Where escalations go: the ops channel, else the first admin's DM; None when neither is
    configured."""
    if rt.settings.channel:
        return rt.settings.channel
    admins = sorted(rt.settings.admins)
    return admins[0] if admins else None


def post_marked(
    rt: Runtime,
    recipient: str,
    key: str,
    text: str,
    blocks: Sequence[dict[str, Any]] = (),
    *,
    thread_ts: str | None = None,
    look_since: datetime | None = None,
) -> MessageRef:
    """Post ``text`` marked with ``key`` in Slack's message metadata; when ``look_since`` is
    given (an earlier try may have landed), first look for a post marked ``key`` since then and
    return it instead of posting again. Raises GpubotError (see :func:`failure_kind`)."""
    if look_since is not None:
        found = rt.notifier.find(recipient, key, since=look_since)
        if found is not None:
            log.info("%s was posted by an earlier try; not posting it again", key)
            return found
    return rt.notifier.post(recipient, text, blocks, thread_ts=thread_ts, key=key)


def failure_kind(exc: GpubotError) -> str:
    """What a failed post means: ``unknown`` (it may have happened: never repeat it),
    ``permanent`` (no retry can fix it) or ``retry``."""
    if isinstance(exc, SlackError) and exc.outcome_unknown:
        return "unknown"
    if isinstance(exc, SlackError) and exc.error in PERMANENT_ERRORS:
        return "permanent"
    return "retry"


def failing_too_long(attempts: int, first_attempt_at: datetime | None, now: datetime) -> bool:
    """Whether a post that keeps failing should be escalated (tries or time since the first)."""
    if attempts >= ESCALATE_AFTER_ATTEMPTS:
        return True
    if first_attempt_at is None:
        return False
    return now - first_attempt_at >= timedelta(seconds=ESCALATE_AFTER_S)


@dataclass(frozen=True)
class PostFailed(Notice):
    """A message (``kind``, for ``recipient``: a user or channel ID) that could not be posted
    after ``attempts`` tries since ``since`` (naive UTC, shown in ``tz_name``); ``error`` and
    ``hint`` are Slack's failure as the bot reads it."""

    kind: str
    recipient: str
    attempts: int
    since: datetime
    error: str
    hint: str | None
    tz_name: str = "UTC"


def escalate(
    rt: Runtime,
    session: Session,
    *,
    about: str,
    kind: str,
    recipient: str,
    attempts: int,
    first_attempt_at: datetime | None,
    now: datetime,
    exc: GpubotError,
    instance_id: int | None,
) -> None:
    """Queue, in ``session``, one message to the ops channel (an admin when the ops channel is
    what fails) about the message ``about`` (its key) that cannot be posted; once per key,
    in the workspace's language."""
    to = _elsewhere(rt, recipient)
    if to is None:
        log.error("%s cannot be posted and there is no other place to say so", about)
        return
    notice = PostFailed(
        kind,
        recipient,
        attempts,
        first_attempt_at or now,
        exc.message,
        exc.hint,
        rt.settings.timezone,
    )
    with speaking(None):
        text, _ = rt.message(notice)
    enqueue(
        session,
        key=f"escalation:{about}",
        kind=KIND_ESCALATION,
        recipient=to,
        text=text,
        now=now,
        instance_id=instance_id,
    )


# --- claiming and posting ------------------------------------------------------------------


@dataclass(frozen=True)
class _Claim:
    id: int
    key: str
    kind: str
    instance_id: int | None
    recipient: str
    thread_ts: str | None
    text: str
    blocks: tuple[dict[str, Any], ...]
    file_name: str | None
    file_bytes: bytes | None
    #: When an earlier try may have landed, the time to look for it from.
    look_since: datetime | None


def _claim(rt: Runtime, message_id: int, claimed_at: datetime) -> _Claim | None:
    stale = claimed_at - timedelta(seconds=CLAIM_LEASE_S)
    with rt.db.session() as session:
        row = session.get(OutboxMessage, message_id)
        if row is None:
            return None
        recipient, thread_ts = row.recipient, row.thread_ts
        if row.thread_of is not None:
            parent = session.get(OutboxMessage, row.thread_of)
            if parent is None or parent.delivery != POSTED or not parent.message_ts:
                return None  # a file waits for its message
            recipient, thread_ts = parent.channel_id or parent.recipient, parent.message_ts
        taken_over = row.claimed_at is not None
        result = session.exec(
            update(OutboxMessage)
            .where(
                col(OutboxMessage.id) == message_id,
                col(OutboxMessage.delivery).is_(None),
                col(OutboxMessage.due_at) <= claimed_at,
                or_(col(OutboxMessage.claimed_at).is_(None), col(OutboxMessage.claimed_at) < stale),
            )
            .values(
                claimed_at=claimed_at,
                first_attempt_at=func.coalesce(col(OutboxMessage.first_attempt_at), claimed_at),
                attempts=col(OutboxMessage.attempts) + 1,
            )
        )
        if result.rowcount != 1:
            return None
        return _Claim(
            id=message_id,
            key=row.key,
            kind=row.kind,
            instance_id=row.instance_id,
            recipient=recipient,
            thread_ts=thread_ts,
            text=row.text,
            blocks=tuple(json.loads(row.blocks_json or "[]")),
            file_name=row.file_name,
            file_bytes=row.file_bytes,
            look_since=row.first_attempt_at if taken_over else None,
        )


def _post(rt: Runtime, claim: _Claim) -> MessageRef:
    """Post the claimed row (raises GpubotError), or return the post of an earlier try."""
    if claim.file_name is not None:
        rt.notifier.upload_file(
            claim.recipient,
            claim.file_name,
            claim.file_bytes or b"",
            title=claim.text,
            thread_ts=claim.thread_ts,
        )
        return MessageRef(channel=claim.recipient, ts=claim.thread_ts or "")
    return post_marked(
        rt,
        claim.recipient,
        f"outbox:{claim.id}",
        claim.text,
        claim.blocks,
        thread_ts=claim.thread_ts,
        look_since=claim.look_since,
    )


def _deliver_files(rt: Runtime, message_id: int, now: datetime) -> None:
    with rt.db.session() as session:
        files = session.exec(
            select(OutboxMessage.id)
            .where(OutboxMessage.thread_of == message_id)
            .order_by(col(OutboxMessage.id))
        ).all()
    for file_id in files:
        assert file_id is not None
        deliver(rt, file_id, now=now)


def _record_posted(rt: Runtime, claim: _Claim, ref: MessageRef) -> None:
    values: dict[str, Any] = {
        "delivery": POSTED,
        "sent_at": rt.now(),
        "channel_id": ref.channel,
        "message_ts": ref.ts,
        "last_error": None,
    }
    if claim.file_name is not None:
        values["file_bytes"] = None  # shared: the store need not keep the file
    with rt.db.session() as session:
        session.exec(
            update(OutboxMessage).where(col(OutboxMessage.id) == claim.id).values(**values)
        )


def _record_failure(rt: Runtime, claim: _Claim, claimed_at: datetime, exc: GpubotError) -> None:
    """Unknown outcome: ``unconfirmed`` for good. Refused for good: ``failed`` and escalated.
    Otherwise: the claim is given back with a back-off, and escalated once it has failed too
    often or too long."""
    kind = failure_kind(exc)
    log.warning(
        "posting %s (%s) to %s %s: %s",
        claim.key,
        claim.kind,
        claim.recipient,
        "may have happened (Slack's answer was lost)" if kind == "unknown" else "failed",
        exc,
    )
    mine = (col(OutboxMessage.id) == claim.id, col(OutboxMessage.claimed_at) == claimed_at)
    now = rt.now()
    with rt.db.session() as session:
        row = session.get(OutboxMessage, claim.id)
        if row is None:
            return
        values: dict[str, Any] = {"last_error": exc.message[:500]}
        if kind == "unknown":
            values["delivery"] = UNCONFIRMED
        elif kind == "permanent":
            values["delivery"] = FAILED
        else:
            values["claimed_at"] = None
            values["due_at"] = claimed_at + timedelta(seconds=_backoff_s(row.attempts))
        escalating = (
            claim.kind != KIND_ESCALATION
            and row.escalated_at is None
            and (kind == "permanent" or failing_too_long(row.attempts, row.first_attempt_at, now))
        )
        if escalating:
            values["escalated_at"] = now
        if session.exec(update(OutboxMessage).where(*mine).values(**values)).rowcount != 1:
            return  # another process took the row over meanwhile
        if kind != "retry" or escalating:
            _audit(session, claim, now, kind=kind, error=exc.message)
        if escalating:
            escalate(
                rt,
                session,
                about=claim.key,
                kind=claim.kind,
                recipient=claim.recipient,
                attempts=row.attempts,
                first_attempt_at=row.first_attempt_at,
                now=now,
                exc=exc,
                instance_id=claim.instance_id,
            )


def _backoff_s(attempts: int) -> int:
    return int(min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(attempts - 1, 0)))


def _elsewhere(rt: Runtime, failing: str) -> str | None:
    """The ops channel, or an admin's DM when the ops channel is what fails."""
    ops = ops_recipient(rt)
    if ops != failing:
        return ops
    admins = sorted(a for a in rt.settings.admins if a != failing)
    return admins[0] if admins else None


def _audit(session: Session, claim: _Claim, now: datetime, *, kind: str, error: str) -> None:
    action = {"unknown": "outbox_unconfirmed", "permanent": "outbox_failed"}.get(
        kind, "outbox_escalated"
    )
    audit.record(
        session,
        "gpubot",
        action,
        claim.instance_id,
        at=now,
        key=claim.key,
        kind=claim.kind,
        outbox=claim.id,
        error=error[:500],
    )


def _id_of(session: Session, key: str) -> int | None:
    return session.exec(select(OutboxMessage.id).where(OutboxMessage.key == key)).first()
