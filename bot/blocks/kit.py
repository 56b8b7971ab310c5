"""Block Kit building blocks shared by the renderers: pure functions that keep Slack's limits.

Every builder clips its text to the limit Slack enforces (an over-long block makes Slack reject
the whole message), and :func:`fit` keeps a message under 50 blocks. Text that came from people
or machines goes through :func:`escape` before it is put into mrkdwn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot.values import format_duration

Block = dict[str, Any]
Message = tuple[str, tuple[Block, ...]]

MAX_BLOCKS = 50
SECTION_TEXT_MAX = 3000
FIELDS_MAX = 10
FIELD_TEXT_MAX = 2000
HEADER_TEXT_MAX = 150
BUTTON_TEXT_MAX = 75
BUTTON_VALUE_MAX = 2000
ACTION_ID_MAX = 255
BLOCK_ID_MAX = 255
ACTIONS_ELEMENTS_MAX = 25
CONTEXT_ELEMENTS_MAX = 10
CONTEXT_TEXT_MAX = 3000
CONFIRM_TITLE_MAX = 100
CONFIRM_TEXT_MAX = 300
CONFIRM_BUTTON_MAX = 30
#: The top-level fallback text Slack keeps (it truncates longer text).
FALLBACK_TEXT_MAX = 4000
ELLIPSIS = "…"


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in an ellipsis when cut."""
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + ELLIPSIS


def escape(text: str) -> str:
    """Text made safe for mrkdwn: ``&``, ``<`` and ``>`` as Slack's entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def code(text: str) -> str:
    """Inline code (backticks in the text become quotes so the span stays closed)."""
    return "`" + escape(text).replace("`", "'") + "`"


def mention(user_id: str) -> str:
    """A Slack mention of a user."""
    return f"<@{user_id}>"


def header(text: str) -> Block:
    """A header block (plain text, at most 150 characters)."""
    return {
        "type": "header",
        "text": {"type": "plain_text", "text": clip(text, HEADER_TEXT_MAX), "emoji": True},
    }


def section(text: str, *, accessory: Block | None = None, block_id: str | None = None) -> Block:
    """A mrkdwn section (at most 3000 characters)."""
    block: Block = {"type": "section", "text": mrkdwn(clip(text, SECTION_TEXT_MAX))}
    if accessory is not None:
        block["accessory"] = accessory
    if block_id is not None:
        block["block_id"] = clip(block_id, BLOCK_ID_MAX)
    return block


def fields(items: Sequence[str], *, text: str | None = None) -> Block:
    """A section of at most 10 mrkdwn fields (each at most 2000 characters)."""
    block: Block = {
        "type": "section",
        "fields": [mrkdwn(clip(item, FIELD_TEXT_MAX)) for item in items[:FIELDS_MAX]],
    }
    if text is not None:
        block["text"] = mrkdwn(clip(text, SECTION_TEXT_MAX))
    return block


def context(*texts: str) -> Block:
    """A context block of up to 10 mrkdwn elements."""
    return {
        "type": "context",
        "elements": [mrkdwn(clip(t, CONTEXT_TEXT_MAX)) for t in texts[:CONTEXT_ELEMENTS_MAX]],
    }


def divider() -> Block:
    """A divider."""
    return {"type": "divider"}


def mrkdwn(text: str) -> Block:
    """A mrkdwn text object."""
    return {"type": "mrkdwn", "text": text}


def confirm_dialog(title: str, text: str, *, confirm: str, deny: str = "Cancel") -> Block:
    """A confirmation dialog for a button (title 100, text 300, buttons 30 characters)."""
    return {
        "title": {"type": "plain_text", "text": clip(title, CONFIRM_TITLE_MAX)},
        "text": {"type": "mrkdwn", "text": clip(text, CONFIRM_TEXT_MAX)},
        "confirm": {"type": "plain_text", "text": clip(confirm, CONFIRM_BUTTON_MAX)},
        "deny": {"type": "plain_text", "text": clip(deny, CONFIRM_BUTTON_MAX)},
    }


def button(
    text: str,
    action_id: str,
    value: str,
    *,
    style: str | None = None,
    confirm: Block | None = None,
) -> Block:
    """A button; ``style`` is primary or danger. Raises ValueError for a value over Slack's
    2000 characters (values carry ids, never free text)."""
    if len(value) > BUTTON_VALUE_MAX:
        raise ValueError(f"button value of {len(value)} characters")
    element: Block = {
        "type": "button",
        "text": {"type": "plain_text", "text": clip(text, BUTTON_TEXT_MAX), "emoji": True},
        "action_id": clip(action_id, ACTION_ID_MAX),
        "value": value,
    }
    if style is not None:
        element["style"] = style
    if confirm is not None:
        element["confirm"] = confirm
    return element


def actions(elements: Sequence[Block], *, block_id: str | None = None) -> Block:
    """An actions block of at most 25 elements."""
    block: Block = {"type": "actions", "elements": list(elements[:ACTIONS_ELEMENTS_MAX])}
    if block_id is not None:
        block["block_id"] = clip(block_id, BLOCK_ID_MAX)
    return block


def pack(lines: Iterable[str], limit: int = SECTION_TEXT_MAX, sep: str = "\n") -> list[str]:
    """Join lines into as few texts of at most ``limit`` characters as possible (a line longer
    than ``limit`` is clipped)."""
    texts: list[str] = []
    current = ""
    for raw in lines:
        line = clip(raw, limit)
        candidate = f"{current}{sep}{line}" if current else line
        if len(candidate) <= limit:
            current = candidate
            continue
        texts.append(current)
        current = line
    if current:
        texts.append(current)
    return texts


def fit(blocks: Sequence[Block], note: str = "{n} more not shown.") -> tuple[Block, ...]:
    """The blocks, cut to Slack's 50 with a closing context that says how many were left out
    (``note`` may use ``{n}``)."""
    if len(blocks) <= MAX_BLOCKS:
        return tuple(blocks)
    kept = list(blocks[: MAX_BLOCKS - 1])
    return (*kept, context(note.format(n=len(blocks) - len(kept))))


def fallback(text: str) -> str:
    """A message's top-level text, clipped to what Slack keeps (never inside an entity).

    Slack reads this text as mrkdwn just like a section's (mentions, ``<!channel>``, links),
    so the renderers put people's and machines' words into it through :func:`escape` too."""
    clipped = clip(text, FALLBACK_TEXT_MAX)
    if clipped == text:
        return text
    body = clipped[: -len(ELLIPSIS)]
    amp = body.rfind("&", -len("&amp;") + 1)
    if amp >= 0 and ";" not in body[amp:]:
        body = body[:amp]
    return body + ELLIPSIS


def when(at: datetime, tz: ZoneInfo) -> str:
    """A naive-UTC time as ``Wed 18:00 CET`` in ``tz`` (with the date when not within a week)."""
    local = at.replace(tzinfo=UTC).astimezone(tz)
    return local.strftime("%a %d %b %H:%M %Z")


def ago(at: datetime, now: datetime) -> str:
    """``5m ago``, or ``just now``."""
    delta = now - at
    if delta < timedelta(seconds=1):
        return "just now"
    return f"{format_duration(delta)} ago"


def time_left(deadline_at: datetime | None, now: datetime) -> str:
    """``2h 10m left``, ``deadline passed 5m ago`` or ``no deadline``."""
    if deadline_at is None:
        return "no deadline"
    if deadline_at > now:
        return f"{format_duration(deadline_at - now)} left"
    return f"deadline passed {format_duration(now - deadline_at)} ago"


def gib(n_bytes: int | None) -> str:
    """Bytes as GiB with no decimals (``?`` when unknown)."""
    if n_bytes is None:
        return "?"
    return f"{n_bytes / 1024**3:.0f}"
