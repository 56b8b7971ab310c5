"""Prompt rows: create once, post at most once per claim, record where they were posted.

A prompt is unique per (instance, kind, key). Posting claims the row first with a conditional
UPDATE (``sent_at`` set while ``message_ts`` is empty; ``first_attempt_at`` set once, on the first
try), commits, posts outside any transaction and records the message after. A claim left behind
by a crash expires after ``CLAIM_LEASE_S``, so a prompt is never lost; two processes never both
post it. What a prompt says is decided when it is posted, from the current rows, by the
``notice_for`` of its kind in the table the caller passes (the bot's:
bot.services.prompt_kinds.PROMPT_NOTICES); it returns a :class:`bot.notify.Notice` and the
runtime puts it into words (Block Kit is rendered only by the presentation floor, bot.blocks).

Prompts carry buttons and answers, so their state stays on their own rows, but they are posted
and judged by the outbox's rules (:mod:`bot.services.speaking.outbox`): an unknown outcome (Slack's
answer lost) marks the prompt ``unconfirmed`` and it is never posted again; a refusal for good
marks it ``failed`` and tells the ops channel; any other failure is tried again on the next tick
and told to the ops channel once it has failed for ``outbox.ESCALATE_AFTER_S`` or
``outbox.ESCALATE_AFTER_ATTEMPTS`` tries. Every post carries its key (``prompt:<id>``) in
Slack's message metadata; a claim taken over from a process that died mid-post first looks for
that key in the conversation and records the post it finds instead of posting again. A
duplicate needs the process to die mid-post and Slack's history to miss the message (more than
``FIND_LIMIT`` newer messages in that conversation).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, update
from sqlalchemy import exc as sa_exc
from sqlmodel import Session, col, select

from bot.errors import GpubotError
from bot.i18n import Language, speaking
from bot.notify import MessageRef, Notice
from bot.runtime import Runtime
from bot.services.speaking import audit, outbox
from bot.services.speaking.people import language_for
from bot.store.models import Instance, Prompt

log = logging.getLogger(__name__)

#: How long a claim to post a prompt holds before another tick may take it over.
CLAIM_LEASE_S = 120
#: ``Prompt.delivery``: posted, sent with its answer lost (it may have been posted), or
#: refused by Slack for good (an archived channel, a bot not invited).
POSTED = "posted"
UNCONFIRMED = "unconfirmed"
FAILED = "failed"

#: Says what a prompt of some kind says at posting time, from the current rows; None means the
#: prompt no longer applies (it is then closed as "skipped" without being posted).
PromptNotice = Callable[[Runtime, Session, Prompt, Instance], Notice | None]
#: What prompts say, by prompt kind (the whole bot's: bot.services.prompt_kinds.PROMPT_NOTICES).
PromptNotices = Mapping[str, PromptNotice]


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
    """Post the prompt to its recipient (or ``channel``) unless it was posted, is being posted
    or may have been posted.

    Returns where it was posted, or None when another claim holds it, it was already posted,
    its outcome is unknown (it is then marked ``unconfirmed``), or posting failed (the claim is
    then released so the next tick tries again)."""
    claimed_at = rt.now()
    stale = claimed_at - timedelta(seconds=CLAIM_LEASE_S)
    with rt.db.session() as session:
        result = session.exec(
            update(Prompt)
            .where(
                col(Prompt.id) == prompt_id,
                col(Prompt.message_ts).is_(None),
                col(Prompt.delivery).is_(None),
                col(Prompt.resolved_at).is_(None),
                or_(col(Prompt.sent_at).is_(None), col(Prompt.sent_at) < stale),
            )
            .values(
                sent_at=claimed_at,
                first_attempt_at=func.coalesce(col(Prompt.first_attempt_at), claimed_at),
                attempts=col(Prompt.attempts) + 1,
            )
        )
        if result.rowcount != 1:
            return None
        prompt = session.get(Prompt, prompt_id)
        assert prompt is not None
        recipient = channel or prompt.recipient
        # A claim taken over from a process that died mid-post: its post may have landed.
        earlier = prompt.first_attempt_at if prompt.attempts > 1 else None
    try:
        ref = outbox.post_marked(
            rt, recipient, f"prompt:{prompt_id}", text, blocks, look_since=earlier
        )
    except GpubotError as exc:
        _record_failure(rt, prompt_id, claimed_at, recipient, exc)
        return None
    with rt.db.session() as session:
        session.exec(
            update(Prompt)
            .where(col(Prompt.id) == prompt_id)
            .values(sent_at=rt.now(), channel_id=ref.channel, message_ts=ref.ts, delivery=POSTED)
        )
    return ref


def _record_failure(
    rt: Runtime, prompt_id: int, claimed_at: datetime, recipient: str, exc: GpubotError
) -> None:
    """A post that failed, read as the outbox reads it: an unknown outcome keeps the claim for
    good (``unconfirmed``); a refusal for good closes it (``failed``) and escalates; anything
    else gives the claim back for the next tick and escalates once it has failed too long."""
    kind = outbox.failure_kind(exc)
    log.warning(
        "posting prompt %s to %s %s: %s",
        prompt_id,
        recipient,
        "may have happened (Slack's answer was lost)" if kind == "unknown" else "failed",
        exc,
    )
    mine = (
        col(Prompt.id) == prompt_id,
        col(Prompt.sent_at) == claimed_at,
        col(Prompt.message_ts).is_(None),
    )
    now = rt.now()
    with rt.db.session() as session:
        values: dict[str, Any] = {"sent_at": None}
        if kind != "retry":
            values = {"delivery": UNCONFIRMED if kind == "unknown" else FAILED}
        if session.exec(update(Prompt).where(*mine).values(**values)).rowcount != 1:
            return
        prompt = session.get(Prompt, prompt_id)
        assert prompt is not None
        if kind != "retry":
            audit.record(
                session,
                at=now,
                actor="gpubot",
                action="prompt_unconfirmed" if kind == "unknown" else "prompt_failed",
                instance_id=prompt.instance_id,
                prompt=prompt_id,
                error=exc.message[:500],
            )
        if kind == "permanent" or (
            kind == "retry"
            and outbox.failing_too_long(prompt.attempts, prompt.first_attempt_at, now)
        ):
            outbox.escalate(
                rt,
                session,
                about=f"prompt:{prompt_id}",
                kind=prompt.kind,
                recipient=recipient,
                attempts=prompt.attempts,
                first_attempt_at=prompt.first_attempt_at,
                now=now,
                exc=exc,
                instance_id=prompt.instance_id,
            )


def due_clause(now: datetime, kinds: Iterable[str]) -> Any:
    """The prompts :func:`deliver_pending` posts at ``now`` (naive UTC): unposted, unanswered,
    due, of a kind in ``kinds``, and not claimed by a poster within ``CLAIM_LEASE_S``."""
    stale = now - timedelta(seconds=CLAIM_LEASE_S)
    return and_(
        col(Prompt.message_ts).is_(None),
        col(Prompt.delivery).is_(None),
        col(Prompt.resolved_at).is_(None),
        col(Prompt.due_at) <= now,
        col(Prompt.kind).in_(list(kinds)),
        or_(col(Prompt.sent_at).is_(None), col(Prompt.sent_at) < stale),
    )


def deliver_pending(
    rt: Runtime, now: datetime, kinds: PromptNotices, *, instance_id: int | None = None
) -> int:
    """Post every due, unposted, unanswered prompt of a kind in ``kinds`` (optionally of one
    instance), each saying what the notice of its kind returns, in the runtime's words and in its
    recipient's language. Returns how many were posted."""
    todo: list[tuple[int, str, Notice]] = []
    with rt.db.session() as session:
        query = select(Prompt).where(due_clause(now, kinds))
        if instance_id is not None:
            query = query.where(Prompt.instance_id == instance_id)
        for prompt in session.exec(query.order_by(col(Prompt.id))).all():
            assert prompt.id is not None
            inst = session.get(Instance, prompt.instance_id)
            notice = None if inst is None else kinds[prompt.kind](rt, session, prompt, inst)
            if notice is None:
                resolve(session, prompt.id, resolution="skipped", by=None, now=now)
                continue
            todo.append((prompt.id, prompt.recipient, notice))
    posted = 0
    languages: dict[str, Language] = {}
    for prompt_id, recipient, notice in todo:
        with speaking(recipient_language(rt, recipient, languages)):
            text, blocks = rt.message(notice)
        if deliver(rt, prompt_id, text, blocks) is not None:
            posted += 1
    return posted


def recipient_language(
    rt: Runtime, recipient: str | None, known: dict[str, Language] | None = None
) -> Language:
    """The language to say something to ``recipient`` in: a person's own (`/gpu lang`), the
    workspace's for a channel. ``known`` caches the answers of one round (one store read per
    person); call it outside any store session."""
    person = recipient if recipient and recipient[:1] in ("U", "W") else None
    if person is None:
        return language_for(rt, None)
    if known is None:
        return language_for(rt, person)
    if person not in known:
        known[person] = language_for(rt, person)
    return known[person]


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


def resolve_group(
    session: Session, prompt_id: int, *, resolution: str, by: str | None, now: datetime
) -> list[Prompt]:
    """Answer a prompt and the open prompts of its group (same instance and kind, same key up to
    its last ``:``, such as the 30- and 10-minute warnings of one deadline) in ``session``.
    Returns them, the clicked one first; empty when the clicked one was already answered (the
    first answer wins, and nothing is changed)."""
    clicked = session.get(Prompt, prompt_id)
    if clicked is None or not resolve(session, prompt_id, resolution=resolution, by=by, now=now):
        return []
    prefix = clicked.key.rsplit(":", 1)[0] + ":"
    closed = [clicked]
    for other in session.exec(
        select(Prompt)
        .where(
            Prompt.instance_id == clicked.instance_id,
            Prompt.kind == clicked.kind,
            col(Prompt.key).startswith(prefix),
            col(Prompt.resolved_at).is_(None),
        )
        .order_by(col(Prompt.id))
    ).all():
        assert other.id is not None
        if resolve(session, other.id, resolution=resolution, by=by, now=now):
            closed.append(other)
    return closed


def posted_ref(prompt: Prompt) -> MessageRef | None:
    """Where a prompt was posted, or None before it was."""
    if prompt.channel_id and prompt.message_ts:
        return MessageRef(channel=prompt.channel_id, ts=prompt.message_ts)
    return None


def update_message(
    rt: Runtime, prompt: Prompt, notice: Notice, known: dict[str, Language] | None = None
) -> None:
    """Replace a posted prompt's message with what ``notice`` says (buttons gone, decision
    shown), in the language of the prompt's recipient (``known``: see
    :func:`recipient_language`); failures are logged. Call it outside any store session."""
    ref = posted_ref(prompt)
    if ref is None:
        return
    with speaking(recipient_language(rt, prompt.recipient, known)):
        text, blocks = rt.message(notice)
    try:
        rt.notifier.update(ref, text, blocks)
    except GpubotError as exc:
        log.warning("updating prompt %s failed: %s", prompt.id, exc)


def notify(
    rt: Runtime,
    recipient: str | None,
    text: str,
    blocks: Sequence[dict[str, Any]],
    *,
    key: str,
    instance_id: int | None = None,
) -> None:
    """Queue an informational message in the outbox under ``key`` (what it is about, so that
    saying it twice posts it once) and try to post it now; a failed try is retried by the clock
    and escalated if it keeps failing."""
    outbox.send(
        rt,
        key=f"notice:{key}",
        kind="notice",
        recipient=recipient,
        text=text,
        blocks=blocks,
        instance_id=instance_id,
    )
