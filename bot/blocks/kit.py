"""Block Kit building blocks shared by the renderers: pure functions that keep Slack's limits.

Every builder clips its text to the limit Slack enforces (an over-long block makes Slack reject
the whole message), and :func:`fit` keeps a message under 50 blocks. Text that came from people
or machines goes through :func:`escape` before it is put into mrkdwn. Modals (:func:`modal`) are
built from input blocks (:func:`input_block`) holding a text input, a select or checkboxes.
The kit's own words (``Cancel``, time left, ``ago``) are in the active language (bot.i18n).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot.i18n import N_, t
from bot.providers.http import mask_credentials
from bot.text import is_hidden
from bot.values import format_duration, format_when

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
VIEW_BLOCKS_MAX = 100
VIEW_TITLE_MAX = 24
VIEW_BUTTON_MAX = 24
CALLBACK_ID_MAX = 255
PRIVATE_METADATA_MAX = 3000
LABEL_MAX = 2000
HINT_MAX = 2000
PLACEHOLDER_MAX = 150
TEXT_INPUT_MAX = 3000
OPTIONS_MAX = 100
OPTION_GROUPS_MAX = 100
CHECKBOX_OPTIONS_MAX = 10
OPTION_TEXT_MAX = 75
OPTION_VALUE_MAX = 150
OPTION_GROUP_LABEL_MAX = 75
ELLIPSIS = "…"


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in an ellipsis when cut. The cut
    never falls inside an entity (``&amp;``, ``&lt;``, ``&gt;``, or a Slack one such as
    ``<@U123>``, ``<#C1|name>``, ``<https://x|y>``): one it would split is left out whole."""
    if len(text) <= limit:
        return text
    cut = max(limit - 1, 0)
    for match in _ENTITY.finditer(text):
        if match.start() >= cut:
            break
        if match.end() > cut:
            cut = match.start()
            break
    return text[:cut] + ELLIPSIS


#: What a cut must not split: Slack's three character entities, and ``<...>`` (mentions,
#: channels, links, ``<!here>``, dates), which hold no ``<`` or ``>`` inside.
_ENTITY = re.compile(r"&(?:amp|lt|gt);|<[^<>]*>")


def escape(text: str) -> str:
    """Text from people, agents or platforms made safe for mrkdwn, in one place.

    ``&``, ``<`` and ``>`` become Slack's entities, so no mention, ``<!channel>`` or link
    survives (api.slack.com/reference/surfaces/formatting, "Escaping text"); pairs of ``*``,
    ``_`` and ``~`` become look-alikes that mrkdwn does not read as bold, italics or
    strikethrough (mrkdwn has no escape character; code spans are left, see
    :func:`_unformat`); control and format characters other than newline and tab (bidi
    overrides and isolates, zero-width spaces, line and paragraph separators) become U+FFFD,
    so no text reads backwards; credentials in the text (``PublicKey=...``,
    ``Authorization: Bearer ...``, tokens) are masked (bot.providers.http.mask_credentials)."""
    return _unformat(_entities(mask_credentials(text)))


def code(text: str) -> str:
    """Inline code (backticks in the text become quotes so the span stays closed; mrkdwn reads
    no formatting inside it)."""
    return "`" + _visible(_entities(mask_credentials(text))).replace("`", "'") + "`"


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
        "elements": [mrkdwn(clip(text, CONTEXT_TEXT_MAX)) for text in texts[:CONTEXT_ELEMENTS_MAX]],
    }


def divider() -> Block:
    """A divider."""
    return {"type": "divider"}


def mrkdwn(text: str) -> Block:
    """A mrkdwn text object."""
    return {"type": "mrkdwn", "text": text}


def plain_text(text: str, limit: int) -> Block:
    """A plain_text object of at most ``limit`` characters."""
    return {"type": "plain_text", "text": clip(text, limit), "emoji": True}


def confirm_dialog(title: str, text: str, *, confirm: str, deny: str | None = None) -> Block:
    """A confirmation dialog for a button (title 100, text 300, buttons 30 characters);
    ``deny`` defaults to Cancel in the active language."""
    return {
        "title": {"type": "plain_text", "text": clip(title, CONFIRM_TITLE_MAX)},
        "text": {"type": "mrkdwn", "text": clip(text, CONFIRM_TEXT_MAX)},
        "confirm": {"type": "plain_text", "text": clip(confirm, CONFIRM_BUTTON_MAX)},
        "deny": {
            "type": "plain_text",
            "text": clip(t("Cancel") if deny is None else deny, CONFIRM_BUTTON_MAX),
        },
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


# --- views: the Home tab and modals -----------------------------------------------------------


def home(blocks: Sequence[Block]) -> Block:
    """A Home tab view of at most 100 blocks (those past Slack's 100 are left out)."""
    return {"type": "home", "blocks": list(blocks[:VIEW_BLOCKS_MAX])}


def modal(
    title: str,
    blocks: Sequence[Block],
    *,
    callback_id: str,
    submit: str,
    close: str,
    private_metadata: str | None = None,
) -> Block:
    """A modal view (title, submit and close at most 24 characters). Raises ValueError for
    more than 100 blocks or private metadata over 3000 characters (both are the code's, never
    people's, so a cut would lose something silently)."""
    if not 0 < len(blocks) <= VIEW_BLOCKS_MAX:
        raise ValueError(f"a modal of {len(blocks)} blocks")
    view: Block = {
        "type": "modal",
        "callback_id": clip(callback_id, CALLBACK_ID_MAX),
        "title": plain_text(title, VIEW_TITLE_MAX),
        "submit": plain_text(submit, VIEW_BUTTON_MAX),
        "close": plain_text(close, VIEW_BUTTON_MAX),
        "blocks": list(blocks),
    }
    if private_metadata is not None:
        if len(private_metadata) > PRIVATE_METADATA_MAX:
            raise ValueError(f"private metadata of {len(private_metadata)} characters")
        view["private_metadata"] = private_metadata
    return view


def input_block(
    label: str,
    element: Block,
    *,
    block_id: str,
    optional: bool = False,
    hint: str | None = None,
) -> Block:
    """An input block of a modal (label and hint at most 2000 characters); ``block_id`` is
    where the submission's value and any error on it are keyed."""
    block: Block = {
        "type": "input",
        "block_id": clip(block_id, BLOCK_ID_MAX),
        "label": plain_text(label, LABEL_MAX),
        "element": element,
        "optional": optional,
    }
    if hint is not None:
        block["hint"] = plain_text(hint, HINT_MAX)
    return block


def plain_text_input(
    action_id: str,
    *,
    placeholder: str | None = None,
    initial_value: str | None = None,
    multiline: bool = False,
) -> Block:
    """A one-line (or ``multiline``) text input; placeholder at most 150 characters, initial
    value at most 3000."""
    element: Block = {
        "type": "plain_text_input",
        "action_id": clip(action_id, ACTION_ID_MAX),
        "multiline": multiline,
    }
    if placeholder is not None:
        element["placeholder"] = plain_text(placeholder, PLACEHOLDER_MAX)
    if initial_value is not None:
        element["initial_value"] = clip(initial_value, TEXT_INPUT_MAX)
    return element


def option(text: str, value: str, *, description: str | None = None) -> Block:
    """A choice of a select or of checkboxes (text and description at most 75 characters).
    Raises ValueError for a value over Slack's 150 characters (values are ids, not text)."""
    if len(value) > OPTION_VALUE_MAX:
        raise ValueError(f"option value of {len(value)} characters")
    choice: Block = {"text": plain_text(text, OPTION_TEXT_MAX), "value": value}
    if description is not None:
        choice["description"] = plain_text(description, OPTION_TEXT_MAX)
    return choice


def option_group(label: str, options: Sequence[Block]) -> Block:
    """A labelled group of a select's options (label 75 characters, at most 100 options)."""
    return {
        "label": plain_text(label, OPTION_GROUP_LABEL_MAX),
        "options": list(options[:OPTIONS_MAX]),
    }


def static_select(
    action_id: str,
    options: Sequence[Block] = (),
    *,
    groups: Sequence[Block] = (),
    placeholder: str | None = None,
    initial: Block | None = None,
) -> Block:
    """A select of ``options`` (at most 100), or of option ``groups`` (at most 100) instead;
    ``initial`` is the option chosen at first. Raises ValueError with neither or both."""
    if bool(options) == bool(groups):
        raise ValueError("a select needs options or option groups, not both or neither")
    element: Block = {"type": "static_select", "action_id": clip(action_id, ACTION_ID_MAX)}
    if options:
        element["options"] = list(options[:OPTIONS_MAX])
    else:
        element["option_groups"] = list(groups[:OPTION_GROUPS_MAX])
    if placeholder is not None:
        element["placeholder"] = plain_text(placeholder, PLACEHOLDER_MAX)
    if initial is not None:
        element["initial_option"] = initial
    return element


def checkboxes(action_id: str, options: Sequence[Block], *, initial: Sequence[Block] = ()) -> Block:
    """Checkboxes (at most 10 options); ``initial`` are those ticked at first."""
    element: Block = {
        "type": "checkboxes",
        "action_id": clip(action_id, ACTION_ID_MAX),
        "options": list(options[:CHECKBOX_OPTIONS_MAX]),
    }
    if initial:
        element["initial_options"] = list(initial)
    return element


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


def fit(blocks: Sequence[Block], note: str | None = None) -> tuple[Block, ...]:
    """The blocks, cut to Slack's 50 with a closing context that says how many were left out
    (``note`` may use ``{n}``; by default "{n} more not shown." in the active language)."""
    if len(blocks) <= MAX_BLOCKS:
        return tuple(blocks)
    kept = list(blocks[: MAX_BLOCKS - 1])
    left_out = len(blocks) - len(kept)
    said = t("{n} more not shown.", n=left_out) if note is None else note.format(n=left_out)
    return (*kept, context(said))


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
    """A naive-UTC time in ``tz`` with weekday, date, time and zone: ``Wed 03 Dec 18:00 CET``
    (:func:`bot.values.format_when`)."""
    return format_when(at, tz)


def ago(at: datetime, now: datetime) -> str:
    """``5m ago`` (``5 分钟前``), or ``just now``: :func:`bot.values.format_duration`'s units."""
    delta = now - at
    if delta < timedelta(seconds=1):
        return t("just now")
    return t("{duration} ago", duration=format_duration(delta))


def time_left(deadline_at: datetime | None, now: datetime) -> str:
    """``2h 10m left`` (``剩余 2 小时 10 分``), ``deadline passed 5m ago`` or ``no deadline``."""
    if deadline_at is None:
        return t("no deadline")
    if deadline_at > now:
        return t("{duration} left", duration=format_duration(deadline_at - now))
    return t("deadline passed {duration} ago", duration=format_duration(now - deadline_at))


def gib(n_bytes: int | None) -> str:
    """Bytes as GiB with no decimals (``?`` when unknown)."""
    if n_bytes is None:
        return "?"
    return f"{n_bytes / 1024**3:.0f}"


#: mrkdwn's formatting marks and the look-alikes that show them without formatting.
_UNFORMAT = str.maketrans({"*": "\u2217", "_": "\u02cd", "~": "\u223c", "`": "\u02cb"})
#: Characters shown as U+FFFD (bot.text.hidden_characters), newline and tab kept.
_KEPT_CONTROLS = frozenset("\n\t")
#: A span mrkdwn formats: a mark at a word's edge, text that neither begins nor ends with a
#: space, the same mark at a word's edge, on one line; or a code span.
_FORMATTED = re.compile(r"(?<![^\W_])([*_~])(\S(?:[^\n]*?\S)?)\1(?![^\W_])|(`)([^`\n]+)`")


def _entities(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _visible(text: str) -> str:
    if text.isascii() and text.isprintable():
        return text
    return "".join(
        "\ufffd" if char not in _KEPT_CONTROLS and is_hidden(char) else char for char in text
    )


def _unformat(text: str) -> str:
    """Each pair of marks mrkdwn would read as formatting (``*bold*``, ``_italics_``,
    ``~strike~``) shown with look-alikes; lone marks, marks inside a word (``gpu_8x_a100``,
    ``/dev/nvidia*``) and code spans (which show their text as typed: the services quote a
    driver's words that way) stay as they are."""
    return _FORMATTED.sub(_look_alike, _visible(text))


def _look_alike(match: re.Match[str]) -> str:
    if match.group(3):
        return match.group(0)  # a code span shows its text as typed, formatting none of it
    mark = match.group(1).translate(_UNFORMAT)
    return mark + _FORMATTED.sub(_look_alike, match.group(2)) + mark


#: Month names in full, January first (`month_name`).
_MONTH_NAMES = (
    N_("January"),
    N_("February"),
    N_("March"),
    N_("April"),
    N_("May"),
    N_("June"),
    N_("July"),
    N_("August"),
    N_("September"),
    N_("October"),
    N_("November"),
    N_("December"),
)


def month_name(month: str) -> str:
    """``2026-03`` as ``March 2026`` (``2026年3月`` in Chinese)."""
    year, number = month.split("-")
    return t("{month} {year}", month=t(_MONTH_NAMES[int(number) - 1]), year=year)
