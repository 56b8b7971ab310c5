"""People as they are typed in commands: ``<@U123|name>``, ``<@U123>``, ``U123`` or ``@name``.

One reading for every command that names a person (``/gpu allow``, ``/gpu deny``,
``/gpu budget``), so the same words mean the same person everywhere and an unknown name gets
the same answer.
"""

from __future__ import annotations

import re

from sqlalchemy import func
from sqlmodel import Session, col, select

from bot.errors import UsageError
from bot.services import access
from bot.services.access import Caller
from bot.store.models import Person

#: A bare Slack member ID ``U123``/``W123`` (an ``@`` before it is fine).
_SLACK_ID = re.compile(r"@?([UW][A-Z0-9]{2,})")
#: A display name after ``@``, as people type it.
_NAME = re.compile(r"@([\w.\-]{1,200})")
_HOW = (
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
    bare = _SLACK_ID.fullmatch(raw)
    if bare:
        return bare.group(1), None
    named = _NAME.fullmatch(raw)
    if named is None:
        raise UsageError(
            f"I don't know who {raw[:80]!r} is: it is not a Slack user's mention, ID or @name.",
            hint=_HOW,
        )
    return _by_name(session, named.group(1), caller)


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
            f"I don't know who @{name} is: I know nobody called @{name} yet.", hint=_HOW
        )
    raise UsageError(f"I know {len(found)} people called @{name}.", hint=_HOW)
