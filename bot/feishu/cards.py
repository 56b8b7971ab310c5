"""Slack messages (fallback text and the Block Kit that bot.blocks.kit builds) as Feishu cards.

Commands, clicks and the bot's own notices all end in a :data:`bot.notify.Message`; this module
turns one into a Feishu card in the card JSON 2.0 schema, so the Feishu front end shares every
word and button with Slack. Only the blocks bot.blocks.kit makes exist, so the mapping is small:

============================  ====================================================
Block Kit                     card JSON 2.0
============================  ====================================================
first ``header``              the card's ``header`` (a later one: a bold line)
``section`` text              ``markdown``
``section`` fields            a two-column ``column_set`` of ``markdown``
``section`` accessory         the section, then the accessory
``context``                   ``markdown`` in notation size
``divider``                   ``hr``
``actions`` buttons           a ``column_set`` of ``button`` columns, side by side
button ``style``/``confirm``  button ``type`` / ``confirm`` {title, text}
``image``                     a link to the image (a card shows only uploaded images)
============================  ====================================================

A button's callback carries ``{"action_id", "value"}`` (:func:`action_of` reads it back), so a
click reaches the same action handlers as on Slack. Feishu's confirm dialog has fixed buttons
(confirm and cancel in the reader's language), so Slack's button words in a confirm are not shown.

Slack mrkdwn becomes Feishu card markdown (:func:`markdown_of`): ``*bold*`` ``**bold**``,
``_it_`` ``*it*``, ``~s~`` ``~~s~~``, ``<url|text>`` ``[text](url)``, a mention of a Feishu
person ``<@feishu:ou_x>`` ``<at id=ou_x></at>`` (a Slack user ``<@U1>`` stays text: ``@U1``),
the emoji shortcodes the bot uses as emoji; every other character Feishu's markdown would read
(``*``, ``_``, ``~``, ``[``, ``]``, a backtick, a heading's ``#``) is written as an HTML
character reference, and Slack's ``&amp;`` ``&lt;`` ``&gt;`` stay as they are (in code too), so
no text from a person or an agent becomes formatting, a link or a mention.

Modals (the register and rent forms, :func:`bot.blocks.kit.modal`) become a card holding a
``form`` (:func:`form_of`): a text input ``input``, a select ``select_static`` (option groups
flattened, each option's text prefixed with its group's label), checkboxes
``multi_select_static``, each field named by its block id and preceded by its label (and
followed by its hint); the submit button's callback carries the modal's ``callback_id``,
``private_metadata`` and each field's action id and element type, so :func:`submission_of`
turns Feishu's ``form_value`` back into Slack's ``view.state.values`` for the same handler.
A form sent back to be put right holds what was submitted and shows each mistake, in red,
under its field (Slack shows them so on a modal's fields).

Limits (Feishu's message API and card documentation): a card message's request is at most
30 KB (:data:`CARD_BYTES_MAX`, measured as the card travels: JSON inside the request's JSON,
UTF-8) and a card holds at most 200 components, containers included
(:data:`CARD_ELEMENTS_MAX`). A card past either keeps its first elements and ends with a note
of how many were left out, as :func:`bot.blocks.kit.fit` does for Slack's 50 blocks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.i18n import t

Card = dict[str, Any]
Element = dict[str, Any]

#: A card message's request body, at most (bytes of UTF-8), less room for the request's own
#: fields (receive_id, msg_type, uuid).
CARD_BYTES_MAX = 30 * 1024
REQUEST_FIELDS_BYTES = 512
#: Components and containers in one card, at most.
CARD_ELEMENTS_MAX = 200
#: The chat list's preview of a card (``config.summary``), in characters.
SUMMARY_MAX = 120
#: The header's title, in characters (Feishu shows at most four lines).
HEADER_MAX = 150
#: The callback value's keys (see :func:`action_of`, :func:`submission_of`).
ACTION_ID = "action_id"
VALUE = "value"
CALLBACK_ID = "callback_id"
PRIVATE_METADATA = "private_metadata"
FIELDS = "fields"
#: The name of a modal's form and of its submit button.
FORM = "gpubot_form"
SUBMIT = "submit"

#: Slack's button styles as Feishu's button types.
_BUTTON_TYPES = {"primary": "primary", "danger": "danger"}
#: The emoji shortcodes the bot writes, as the emoji themselves.
EMOJI = {
    "alarm_clock": "\u23f0",
    "arrow_forward": "\u25b6\ufe0f",
    "bulb": "\U0001f4a1",
    "chart_with_upwards_trend": "\U0001f4c8",
    "checkered_flag": "\U0001f3c1",
    "gear": "\u2699\ufe0f",
    "grey_question": "\u2754",
    "heavy_check_mark": "\u2714\ufe0f",
    "hourglass": "\u231b",
    "hourglass_flowing_sand": "\u23f3",
    "information_source": "\u2139\ufe0f",
    "large_green_circle": "\U0001f7e2",
    "large_yellow_circle": "\U0001f7e1",
    "moneybag": "\U0001f4b0",
    "no_entry": "\u26d4",
    "no_entry_sign": "\U0001f6ab",
    "red_circle": "\U0001f534",
    "rotating_light": "\U0001f6a8",
    "runner": "\U0001f3c3",
    "warning": "\u26a0\ufe0f",
    "white_check_mark": "\u2705",
    "white_circle": "\u26aa",
    "x": "\u274c",
    "zzz": "\U0001f4a4",
}
#: The prefix of a Feishu person's id among the bot's user ids (``feishu:ou_...``).
FEISHU_USER_PREFIX = "feishu:"


def card_of(text: str, blocks: Sequence[Mapping[str, Any]]) -> Card:
    """The card for a message: ``text`` (the fallback, Slack mrkdwn) becomes the chat list's
    preview, and the body when there are no ``blocks``. Raises ValueError for a block or
    element type that bot.blocks.kit does not make. Within Feishu's limits (see the module)."""
    header: Element | None = None
    elements: list[Element] = []
    for block in blocks:
        if block.get("type") == "header" and header is None and not elements:
            header = _header(block)
            continue
        elements.extend(_elements(block))
    if not elements and text.strip():
        elements = [_markdown(text)]
    card: Card = {"schema": "2.0", "config": {"update_multi": True}, "body": {"elements": elements}}
    preview = summary_of(text)
    if preview:
        card["config"]["summary"] = {"content": preview}
    if header is not None:
        card["header"] = header
    return _fit(card)


def action_of(value: Mapping[str, Any]) -> tuple[str, str]:
    """``(action_id, value)`` from a button's callback value (as :func:`card_of` wrote it).
    Raises ValueError when either is missing or not text (a value the bot did not write)."""
    action_id, payload = value.get(ACTION_ID), value.get(VALUE)
    if not isinstance(action_id, str) or not action_id or not isinstance(payload, str):
        raise ValueError("a card callback without the bot's action_id and value")
    return action_id, payload


@dataclass(frozen=True)
class Submission:
    """A card form's submission in Slack's terms: the modal's ``callback_id`` and
    ``private_metadata``, and ``values`` as Slack's ``view["state"]["values"]`` (by block id,
    then action id: ``{"type", "value"}``, ``{"type", "selected_option"}`` or
    ``{"type", "selected_options"}``)."""

    callback_id: str
    private_metadata: str
    values: dict[str, dict[str, dict[str, Any]]]


def form_of(
    view: Mapping[str, Any],
    *,
    values: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    errors: Mapping[str, str] | None = None,
) -> Card:
    """A modal view (bot.blocks.kit.modal) as a card with a form: its title the header, its
    blocks inside the form, its submit label on the submit button (see the module). A form
    sent back to be put right keeps what was submitted (``values``, as Slack's view state) and
    shows each mistake (``errors``, by block id, Slack mrkdwn) under its field. Raises
    ValueError for an input element the kit does not make."""
    fields: dict[str, list[str]] = {}
    elements: list[Element] = []
    for block in view.get("blocks", ()):
        if block.get("type") != "input":
            elements.extend(_elements(block))
            continue
        element = block["element"]
        fields[block["block_id"]] = [element.get("action_id", ""), element.get("type", "")]
        state = (values or {}).get(block["block_id"], {}).get(element.get("action_id", ""))
        filled = _filled(block, state) if state is not None else block
        elements.extend(_field(filled))
        mistake = (errors or {}).get(block["block_id"])
        if mistake:
            elements.append(_mistake(mistake))
    submit = {
        "tag": "button",
        "name": SUBMIT,
        "text": {"tag": "plain_text", "content": view["submit"]["text"]},
        "type": "primary",
        "form_action_type": "submit",
        "behaviors": [
            {
                "type": "callback",
                "value": {
                    CALLBACK_ID: view.get("callback_id", ""),
                    PRIVATE_METADATA: view.get("private_metadata", ""),
                    FIELDS: fields,
                },
            }
        ],
    }
    title = view["title"]["text"]
    card: Card = {
        "schema": "2.0",
        "config": {"update_multi": True, "summary": {"content": title}},
        "header": {"title": {"tag": "plain_text", "content": title}, "template": "blue"},
        "body": {"elements": [{"tag": "form", "name": FORM, "elements": [*elements, submit]}]},
    }
    return _fit_form(card)


def submission_of(value: Mapping[str, Any], form_value: Mapping[str, Any]) -> Submission:
    """Slack's view of a form's submission from the submit button's callback ``value`` (as
    :func:`form_of` wrote it) and Feishu's ``form_value`` (field name to what was typed or
    chosen). A field left empty is in ``values`` with no value, as in Slack. Raises
    ValueError for a value the bot did not write."""
    fields = value.get(FIELDS)
    callback_id = value.get(CALLBACK_ID)
    if not isinstance(fields, Mapping) or not isinstance(callback_id, str) or not callback_id:
        raise ValueError("a form callback without the bot's callback_id and fields")
    values: dict[str, dict[str, dict[str, Any]]] = {}
    for block_id, described in fields.items():
        if not isinstance(described, list) or len(described) != 2:
            raise ValueError("a form callback whose fields the bot did not write")
        action_id, kind = described
        values[str(block_id)] = {str(action_id): _state(str(kind), form_value.get(block_id))}
    return Submission(callback_id, str(value.get(PRIVATE_METADATA) or ""), values)


def card_bytes(card: Mapping[str, Any]) -> int:
    """The card's size as it travels: its JSON as a string inside the request's JSON, UTF-8."""
    content = json.dumps(card, ensure_ascii=False)
    return len(json.dumps(content, ensure_ascii=False).encode("utf-8"))


def count_elements(card: Mapping[str, Any]) -> int:
    """Components and containers in the card's body (every object with a ``tag``, nested)."""
    return sum(1 for _ in _tagged(card.get("body", {}).get("elements", [])))


def summary_of(text: str) -> str:
    """The fallback text as plain words for the chat list's preview (first line, clipped)."""
    line = plain_of(text).strip().split("\n", 1)[0]
    return line if len(line) <= SUMMARY_MAX else line[: SUMMARY_MAX - 1] + "\u2026"


def markdown_of(mrkdwn: str) -> str:
    """Slack mrkdwn as Feishu card markdown (see the module for what becomes what)."""
    return _convert(mrkdwn, plain=False)


def plain_of(mrkdwn: str) -> str:
    """Slack mrkdwn as plain text: formatting marks dropped, links as their text, a mention of
    a Feishu person as its open_id, entities as the characters they stand for."""
    return _convert(mrkdwn, plain=True)


# --- blocks ---------------------------------------------------------------------------------


def _elements(block: Mapping[str, Any]) -> list[Element]:
    kind = block.get("type")
    if kind == "section":
        return _section(block)
    if kind == "header":
        return [{"tag": "markdown", "content": f"**{_literal(block['text']['text'])}**"}]
    if kind == "context":
        texts = [_text_of(item) for item in block.get("elements", ())]
        return [{**_markdown("  ".join(texts)), "text_size": "notation"}]
    if kind == "divider":
        return [{"tag": "hr"}]
    if kind == "actions":
        return [_row([_element(item) for item in block.get("elements", ())])]
    if kind == "image":
        return [_markdown(_image_link(block))]
    raise ValueError(f"no card form for the block type {kind!r}")


def _section(block: Mapping[str, Any]) -> list[Element]:
    out: list[Element] = []
    if "text" in block:
        out.append(_markdown(_text_of(block["text"])))
    items = [_text_of(item) for item in block.get("fields", ())]
    if items:
        columns = [items[0::2], items[1::2]] if len(items) > 1 else [items]
        out.append(
            {
                "tag": "column_set",
                "columns": [
                    {
                        "tag": "column",
                        "width": "weighted",
                        "weight": 1,
                        "elements": [_markdown(item) for item in column],
                    }
                    for column in columns
                ],
            }
        )
    if "accessory" in block:
        out.append(_element(block["accessory"]))
    return out


def _element(element: Mapping[str, Any]) -> Element:
    kind = element.get("type")
    if kind == "button":
        return _button(element)
    if kind == "image":
        return _markdown(_image_link(element))
    raise ValueError(f"no card form for the element type {kind!r}")


def _button(element: Mapping[str, Any]) -> Element:
    button: Element = {
        "tag": "button",
        "text": {"tag": "plain_text", "content": element["text"]["text"]},
        "type": _BUTTON_TYPES.get(str(element.get("style")), "default"),
        "behaviors": [
            {
                "type": "callback",
                "value": {ACTION_ID: element["action_id"], VALUE: element.get("value", "")},
            }
        ],
    }
    confirm = element.get("confirm")
    if confirm is not None:
        button["confirm"] = {
            "title": {"tag": "plain_text", "content": plain_of(confirm["title"]["text"])},
            "text": {"tag": "plain_text", "content": plain_of(confirm["text"]["text"])},
        }
    return button


def _row(elements: Sequence[Element]) -> Element:
    """Elements side by side, wrapping on a narrow screen."""
    return {
        "tag": "column_set",
        "flex_mode": "flow",
        "horizontal_spacing": "small",
        "columns": [
            {"tag": "column", "width": "auto", "elements": [element]} for element in elements
        ],
    }


def _header(block: Mapping[str, Any]) -> Element:
    title = block["text"]["text"]
    if len(title) > HEADER_MAX:
        title = title[: HEADER_MAX - 1] + "\u2026"
    return {"title": {"tag": "plain_text", "content": title}, "template": "blue"}


def _markdown(mrkdwn: str) -> Element:
    return {"tag": "markdown", "content": markdown_of(mrkdwn)}


def _text_of(item: Mapping[str, Any]) -> str:
    """A text object's text as mrkdwn (plain text escaped so that it stays plain)."""
    if item.get("type") == "image":
        return _image_link(item)
    text = str(item.get("text", ""))
    if item.get("type") == "plain_text":
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text


def _image_link(item: Mapping[str, Any]) -> str:
    alt = str(item.get("alt_text") or item.get("image_url", ""))
    return f"<{item.get('image_url', '')}|{alt}>"


# --- forms ----------------------------------------------------------------------------------


def _field(block: Mapping[str, Any]) -> list[Element]:
    """An input block: its label, its form component, its hint."""
    element = block["element"]
    kind = element.get("type")
    name = block["block_id"]
    required = not block.get("optional", False)
    label = _literal(block["label"]["text"])
    out: list[Element] = [{"tag": "markdown", "content": f"**{label}**"}]
    component: Element
    if kind == "plain_text_input":
        component = {
            "tag": "input",
            "name": name,
            "required": required,
            "input_type": "multiline_text" if element.get("multiline") else "text",
        }
        if "initial_value" in element:
            component["default_value"] = element["initial_value"]
    elif kind == "static_select":
        options = _options(element)
        component = {"tag": "select_static", "name": name, "required": required}
        component["options"] = options
        initial = element.get("initial_option")
        if initial is not None and initial["value"] in {o["value"] for o in options}:
            component["initial_option"] = initial["value"]
    elif kind == "checkboxes":
        options = _options(element)
        component = {
            "tag": "multi_select_static",
            "name": name,
            "required": required,
            "options": options,
        }
        known = {option["value"] for option in options}
        initial_options = [o["value"] for o in element.get("initial_options") or ()]
        if any(value in known for value in initial_options):
            component["selected_values"] = [value for value in initial_options if value in known]
    else:
        raise ValueError(f"no card form for the input element {kind!r}")
    if "placeholder" in element:
        component["placeholder"] = {"tag": "plain_text", "content": element["placeholder"]["text"]}
    out.append(component)
    if "hint" in block:
        hint = {"tag": "markdown", "content": _literal(block["hint"]["text"])}
        out.append({**hint, "text_size": "notation"})
    return out


def _filled(block: Mapping[str, Any], state: Mapping[str, Any]) -> Mapping[str, Any]:
    """An input block holding what was submitted (``state``: Slack's view state of its
    element) as its initial value."""
    element = dict(block["element"])
    for key in ("initial_value", "initial_option", "initial_options"):
        element.pop(key, None)
    if isinstance(state.get("value"), str):
        element["initial_value"] = state["value"]
    chosen = state.get("selected_option")
    if isinstance(chosen, Mapping) and chosen.get("value"):
        element["initial_option"] = {"value": str(chosen["value"])}
    many = state.get("selected_options")
    if isinstance(many, list) and many:
        element["initial_options"] = [{"value": str(one.get("value"))} for one in many]
    return {**block, "element": element}


def _mistake(mrkdwn: str) -> Element:
    """A mistake shown under its field, in red."""
    return {"tag": "markdown", "content": f"<font color='red'>{markdown_of(mrkdwn)}</font>"}


def _options(element: Mapping[str, Any]) -> list[Element]:
    """A select's options as Feishu's (option groups flattened, labelled with the group)."""
    found: list[Element] = []
    for option in element.get("options") or ():
        found.append(_option(option, ""))
    for group in element.get("option_groups") or ():
        for option in group.get("options") or ():
            found.append(_option(option, group["label"]["text"]))
    return found


def _option(option: Mapping[str, Any], group: str) -> Element:
    text = option["text"]["text"]
    if "description" in option:
        text = f"{text} \u00b7 {option['description']['text']}"
    return {
        "text": {"tag": "plain_text", "content": f"{group}: {text}" if group else text},
        "value": option["value"],
    }


def _state(kind: str, given: Any) -> dict[str, Any]:
    """What Slack's view state holds for an element of ``kind`` given ``given``."""
    if kind in ("static_select", "radio_buttons"):
        chosen = {"value": str(given)} if isinstance(given, str) and given else None
        return {"type": kind, "selected_option": chosen}
    if kind in ("checkboxes", "multi_static_select"):
        items = given if isinstance(given, list) else []
        return {"type": kind, "selected_options": [{"value": str(v)} for v in items]}
    typed = given if isinstance(given, str) and given != "" else None
    return {"type": kind, "value": typed}


# --- limits ---------------------------------------------------------------------------------


def _fit(card: Card) -> Card:
    """The card within Feishu's limits: trailing elements left out, with a note, until both
    the count and the size fit."""
    elements: list[Element] = card["body"]["elements"]
    if _fits(card):
        return card
    kept = list(elements)
    while kept:
        kept.pop()
        note = _markdown(t("{n} more not shown.", n=len(elements) - len(kept)))
        note["text_size"] = "notation"
        trial = {**card, "body": {"elements": [*kept, note]}}
        if _fits(trial):
            return trial
    raise ValueError("a card header and preview alone exceed Feishu's limits")


def _fit_form(card: Card) -> Card:
    """A form within Feishu's limits: the longest select's options cut (its chosen one kept)
    until it fits, as Slack's selects are cut at 100. Raises ValueError when even that does
    not do."""
    selects: list[Element] = [
        e
        for e in _tagged(card["body"]["elements"])
        if isinstance(e, dict) and e.get("tag") in ("select_static", "multi_select_static")
    ]
    while not _fits(card):
        longest = max(selects, key=lambda e: len(e["options"]), default=None)
        if longest is None or len(longest["options"]) <= 1:
            raise ValueError("a form over Feishu's card limits")
        chosen = {longest.get("initial_option"), *longest.get("selected_values", ())}
        options = longest["options"]
        keep = max(1, len(options) * 4 // 5)
        kept = options[:keep] + [o for o in options[keep:] if o["value"] in chosen]
        longest["options"] = kept
    return card


def _fits(card: Card) -> bool:
    return (
        count_elements(card) <= CARD_ELEMENTS_MAX
        and card_bytes(card) <= CARD_BYTES_MAX - REQUEST_FIELDS_BYTES
    )


def _tagged(node: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        if "tag" in node and node["tag"] not in ("plain_text", "lark_md"):
            yield node
        for key in ("elements", "columns"):
            yield from _tagged(node.get(key, ()))
    elif isinstance(node, list):
        for item in node:
            yield from _tagged(item)


# --- mrkdwn ---------------------------------------------------------------------------------

#: One token of mrkdwn: a code block, a code span, a ``<...>`` entity, a formatted span (a
#: mark at a word's edge, the same rule as bot.blocks.kit), an emoji shortcode, a character.
_TOKEN = re.compile(
    r"(?P<block>```(?P<block_body>.*?)```)"
    r"|(?P<code>`(?P<code_body>[^`\n]+)`)"
    r"|(?P<angle><(?P<angle_body>[^<>]*)>)"
    r"|(?P<entity>&(?:amp|lt|gt);)"
    r"|(?P<span>(?<![^\W_])(?P<mark>[*_~])(?P<inner>\S(?:[^\n]*?\S)?)(?P=mark)(?![^\W_]))"
    r"|(?P<emoji>:(?P<emoji_name>" + "|".join(sorted(EMOJI, key=len, reverse=True)) + r"):)"
    r"|(?P<char>.)",
    re.DOTALL,
)
#: Characters Feishu's markdown reads as formatting, written as character references.
_MARKDOWN_SPECIALS = {
    "*": "&#42;",
    "_": "&#95;",
    "~": "&#126;",
    "[": "&#91;",
    "]": "&#93;",
    "`": "&#96;",
    "\\": "&#92;",
}
_FEISHU_MARKS = {"*": "**", "_": "*", "~": "~~"}
_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&"))
_LINK_SCHEMES = ("http://", "https://")


def _convert(mrkdwn: str, *, plain: bool) -> str:
    out: list[str] = []
    for match in _TOKEN.finditer(mrkdwn):
        out.append(_token(match, plain=plain, at_line_start=not out or out[-1].endswith("\n")))
    return "".join(out)


def _token(match: re.Match[str], *, plain: bool, at_line_start: bool) -> str:
    if match.group("block") is not None:
        body = match.group("block_body")
        return _unescape(body) if plain else f"```\n{body.strip(chr(10))}\n```"
    if match.group("code") is not None:
        body = match.group("code_body")
        return _unescape(body) if plain else f"`{body}`"
    if match.group("angle") is not None:
        return _angle(match.group("angle_body"), plain=plain)
    if match.group("entity") is not None:
        return _unescape(match.group("entity")) if plain else match.group("entity")
    if match.group("span") is not None:
        inner = _convert(match.group("inner"), plain=plain)
        mark = "" if plain else _FEISHU_MARKS[match.group("mark")]
        return f"{mark}{inner}{mark}"
    if match.group("emoji") is not None:
        return EMOJI[match.group("emoji_name")]
    char = match.group("char")
    if plain:
        return char
    if char == "#" and at_line_start:
        return "&#35;"
    return _MARKDOWN_SPECIALS.get(char, char)


def _angle(body: str, *, plain: bool) -> str:
    """A Slack entity: a mention, a channel, a special mention, a date or a link."""
    target, _, label = body.partition("|")
    if target.startswith("@"):
        user = target[1:]
        if user.startswith(FEISHU_USER_PREFIX):
            open_id = user[len(FEISHU_USER_PREFIX) :]
            if plain:
                return f"@{label or open_id}"
            if re.fullmatch(r"[A-Za-z0-9_-]+", open_id):
                return f"<at id={open_id}></at>"
        return _words(f"@{label or user}", plain=plain)
    if target.startswith("#"):
        return _words(f"#{label or target[1:]}", plain=plain)
    if target.startswith("!"):
        special = target[1:].split("^", 1)[0]
        return _words(label or f"@{special}", plain=plain)
    if target.startswith(_LINK_SCHEMES) and not plain:
        url = _unescape(target).replace(")", "%29").replace(" ", "%20")
        return f"[{_words(label or target, plain=False)}]({url})"
    return _words(label or target, plain=plain)


def _words(text: str, *, plain: bool) -> str:
    """Text out of an entity, shown as it reads (Slack's character entities kept)."""
    return _unescape(text) if plain else _escape(text)


def _escape(text: str) -> str:
    return "".join(_MARKDOWN_SPECIALS.get(char, char) for char in text)


def _literal(text: str) -> str:
    """Plain text as card markdown that shows it as it is."""
    return _escape(text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))


def _unescape(text: str) -> str:
    for entity, char in _ENTITIES:
        text = text.replace(entity, char)
    return text
