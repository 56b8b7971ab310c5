"""People as they are typed in commands: ``<@U123|name>``, ``<@U123>``, ``U123`` or ``@name``.

One reading for every command that names a person (``/gpu allow``, ``/gpu deny``,
``/gpu budget``), so the same words mean the same person everywhere and an unknown name gets
the same answer.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING

from sqlalchemy import func
from sqlmodel import Session, col, select

from bot.errors import UsageError
from bot.i18n import LANGUAGE_NAMES, N_, Language, language_of, t
from bot.logging_setup import RepeatLimiter
from bot.services import access
from bot.services.access import Caller
from bot.store.models import Person

if TYPE_CHECKING:
    from bot.runtime import Runtime

log = logging.getLogger(__name__)
#: Failed reads of a person's language, logged at most once a minute.
LANGUAGE_READS = RepeatLimiter()
LANGUAGE_KEY = "language"

#: A display name after ``@``, as people type it.
_NAME = re.compile(r"@([\w.\-]{1,200})")
_HOW = N_(
    "Mention them with Slack's @ autocomplete, or give their Slack member ID "
    "(like U0123ABC, under ⋮ in their profile)."
)


def resolve_person(
    session: Session, text: str, *, caller: Caller | None = None
) -> tuple[str, str | None]:
    """The person ``text`` names, as (Slack ID, display name or None). ``@name`` is the one
    person the bot knows (owners, requesters, budget holders, anyone who has used it, and the
    caller) whose display name is ``name``, case ignored. Raises UsageError when the text names
    nobody, or more than one person."""
    raw = text.strip()
    mention = access.parse_mention(raw)
    if mention is not None:
        return mention
    bare = access.parse_member_id(raw)
    if bare is not None:
        return bare, None
    named = _NAME.fullmatch(raw)
    if named is None:
        raise UsageError(
            t(
                "I don't know who {text!r} is: it is not a Slack user's mention, ID or @name.",
                text=raw[:80],
            ),
            hint=t(_HOW),
        )
    return _by_name(session, named.group(1), caller)


def language_for(rt: Runtime, slack_id: str | None) -> Language:
    """The language to speak to ``slack_id`` in: the one they chose with `/gpu lang`, else the
    workspace's (GPUBOT_LANGUAGE). A store failure is logged and the workspace's is used."""
    default = language_of(rt.settings.language) or "en"
    if not slack_id:
        return default
    try:
        with rt.db.session() as session:
            person = session.get(Person, slack_id)
            chosen = None if person is None else person.language
    except Exception as exc:  # noqa: BLE001 - the language must never cost the message
        _language_unread(exc)
        return default
    LANGUAGE_READS.settle(LANGUAGE_KEY, time.monotonic())
    return language_of(chosen) or default


def _language_unread(exc: Exception) -> None:
    """Log that a language could not be read: in full when it starts, then at most once a
    minute with a count (the store down fails every message's read)."""
    shown = LANGUAGE_READS.admit(LANGUAGE_KEY, time.monotonic())
    if shown is None:
        return
    if shown.first:
        log.warning("could not read a person's language", exc_info=exc)
        return
    log.warning(
        "could not read a person's language %d times in the last %.0f s (latest: %s)",
        shown.count,
        shown.window_s,
        type(exc).__name__,
    )


def set_language(rt: Runtime, caller: Caller, text: str) -> Language:
    """Remember the language ``caller`` chose (``zh``, ``中文``, ``en``…) and return it.
    Raises UsageError, changing nothing, for a language gpubot does not speak."""
    language = language_of(text)
    if language is None:
        raise UsageError(
            t("gpubot does not speak {language!r}.", language=text[:40]),
            hint=t("Use `/gpu lang zh` for 简体中文 or `/gpu lang en` for English."),
        )
    with rt.db.session() as session:
        person = session.get(Person, caller.user_id)
        if person is None:
            person = Person(slack_id=caller.user_id, display_name=caller.user_name)
        person.language = language
        session.add(person)
    return language


def language_name(language: Language) -> str:
    """What ``language`` calls itself."""
    return LANGUAGE_NAMES[language]


def _by_name(session: Session, name: str, caller: Caller | None) -> tuple[str, str | None]:
    wanted = name.lower()
    found = {
        person.slack_id: person.display_name
        for person in session.exec(
            select(Person).where(func.lower(col(Person.display_name)) == wanted)
        )
    }
    if caller is not None and (caller.user_name or "").lower() == wanted:
        found.setdefault(caller.user_id, caller.user_name)
    if len(found) == 1:
        return next(iter(found.items()))
    if not found:
        raise UsageError(
            t("I don't know who @{name} is: I know nobody called @{name} yet.", name=name),
            hint=t(_HOW),
        )
    raise UsageError(
        t("I know {count} people called @{name}.", count=len(found), name=name), hint=t(_HOW)
    )
