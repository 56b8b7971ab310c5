"""Checks that a text shown to a Chinese reader is Chinese: no English sentence left in it.

Code spans, links, mentions, emoji codes, commands (``/gpu …``), options (``--x``), names and
numbers are what they are in any language; a run of three or more English words outside them
is a sentence nobody translated (a list of choices, `user, gpu, project`, is not)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from bot.errors import GpubotError
from bot.i18n import speaking

_KEEP = re.compile(
    r"`[^`]*`"  # code
    r"|<[^>]*>"  # links and mentions
    r"|:[a-z0-9_+\-]+:"  # emoji
    r"|/gpu(?:\s+[\w\-./=@:]+)*"  # commands as typed
    r"|(?<!\S)--?[\w\-]+"  # options
)
_ENGLISH_RUN = re.compile(r"\b[A-Za-z][a-z']+(?: +[A-Za-z][a-z']+){2,}\b")


def english_left(text: str) -> list[str]:
    """The English word runs in ``text`` (three words or more), outside code and commands."""
    return _ENGLISH_RUN.findall(_KEEP.sub(" ", text))


def texts_of(payload: Any) -> list[str]:
    """Every ``text`` a person can read in a Block Kit payload (or a list of blocks)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in (
                    "text",
                    "title",
                    "placeholder",
                    "label",
                    "confirm",
                    "deny",
                ) and isinstance(value, str):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list | tuple):
            for item in node:
                walk(item)

    walk(payload)
    return found


def assert_chinese(*parts: Any) -> None:
    """Fail naming every English run left in ``parts`` (strings or Block Kit payloads)."""
    texts: list[str] = []
    for part in parts:
        texts.extend([part] if isinstance(part, str) else texts_of(part))
    left = [run for text in texts for run in english_left(text)]
    assert not left, "English left in a Chinese message: " + json.dumps(left, ensure_ascii=False)


#: A Chinese (Han) character.
#: A Chinese (Han) character.
HAN = re.compile(r"[\u4e00-\u9fff]")


def assert_said_in_chinese(*texts: str) -> None:
    """Each text is Chinese: no English sentence left, and Chinese words in it (a short English
    phrase slips past the check for sentences)."""
    assert_chinese(*texts)
    for text in texts:
        assert HAN.search(text), text


def _raised_in_chinese(action: Callable[[], object]) -> GpubotError:
    """The error ``action`` raises, raised while speaking Chinese."""
    with speaking("zh"), pytest.raises(GpubotError) as caught:
        action()
    return caught.value


def chinese_error(action: Callable[[], object], *kept: str) -> str:
    """The Chinese text of the error ``action`` raises; ``kept`` must appear in it as given."""
    text = _raised_in_chinese(action).user_text()
    assert_said_in_chinese(text)
    for value in kept:
        assert value in text, (value, text)
    return text
