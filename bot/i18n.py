"""The languages gpubot speaks: English (the source text) and Simplified Chinese.

Every sentence a person can read is written in English in the code, marked for the catalogue,
and looked up in the active language when it is formatted::

    t("{name} was released.", name=name)        # a sentence, placeholders named
    nt("{n} instance", "{n} instances", n, n=n)  # a sentence that counts
    HELP = N_("Shows this help.")                # marked at import, translated by t(HELP)

The catalogue is gettext's: ``bot/locale/<language>/LC_MESSAGES/*.po``, read with Babel (each
file one area of the bot; all are merged). Which language is active is a context variable:
:func:`speaking` sets it for a block (a command of one person, a message to one person), and
outside any block the workspace default (:func:`set_default_language`) applies. A message
without a translation falls back to English (and the catalogue test fails).
"""

from __future__ import annotations

import contextvars
import string
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Final, Literal, cast

from babel.messages.pofile import read_po

Language = Literal["en", "zh"]

#: Languages, by their code as typed in `/gpu lang`, GPUBOT_LANGUAGE and the people table.
LANGUAGES: Final[tuple[Language, ...]] = ("en", "zh")
#: What each language calls itself.
LANGUAGE_NAMES: Final[Mapping[Language, str]] = {"en": "English", "zh": "简体中文"}
#: Babel's locale for each language (money, numbers and dates).
LOCALES: Final[Mapping[Language, str]] = {"en": "en_US", "zh": "zh_Hans_CN"}
#: Where the catalogues live.
LOCALE_DIR: Final = Path(__file__).with_name("locale")
#: Other ways people name a language.
_ALIASES: Final[Mapping[str, Language]] = {
    "en": "en",
    "english": "en",
    "en_us": "en",
    "en-us": "en",
    "英文": "en",
    "英语": "en",
    "zh": "zh",
    "cn": "zh",
    "zh_cn": "zh",
    "zh-cn": "zh",
    "zh_hans": "zh",
    "zh-hans": "zh",
    "chinese": "zh",
    "中文": "zh",
    "简体中文": "zh",
    "汉语": "zh",
}

_active: contextvars.ContextVar[Language | None] = contextvars.ContextVar(
    "gpubot_language", default=None
)
_default: list[Language] = ["en"]
_lock = threading.Lock()


def language_of(text: str | None) -> Language | None:
    """The language ``text`` names (``zh``, ``cn``, ``中文``, ``en``, ``English``…), or None."""
    if text is None:
        return None
    return _ALIASES.get(text.strip().lower())


def set_default_language(language: Language) -> None:
    """The workspace's language (GPUBOT_LANGUAGE): used where no :func:`speaking` block is."""
    with _lock:
        _default[0] = language


def default_language() -> Language:
    """The workspace's language."""
    return _default[0]


def active_language() -> Language:
    """The language sentences are formatted in here and now."""
    return _active.get() or _default[0]


@contextmanager
def speaking(language: Language | None) -> Iterator[Language]:
    """Format sentences in ``language`` within the block (None: the workspace default)."""
    chosen = language or _default[0]
    token = _active.set(chosen)
    try:
        yield chosen
    finally:
        _active.reset(token)


def N_(message: str) -> str:
    """Mark ``message`` for the catalogue without translating it (module-level constants);
    pass it to :func:`t` where it is shown."""
    return message


def t(message: str, /, **values: object) -> str:
    """``message`` in the active language, its ``{placeholders}`` filled from ``values``.

    Without values the text is returned as translated (braces left alone)."""
    text = _lookup(active_language(), message)
    return text.format(**values) if values else text


def nt(singular: str, plural: str, count: int, /, **values: object) -> str:
    """The form of a counting sentence for ``count`` (Chinese has one form: the singular's
    entry holds it), placeholders filled from ``values``."""
    language = active_language()
    plural_forms = _plural_catalogue(language).get(singular)
    if plural_forms is not None:
        text = plural_forms[0] if language == "zh" else plural_forms[0 if count == 1 else 1]
    else:
        text = singular if count == 1 else plural
    return text.format(**values) if values else text


def placeholders(message: str) -> frozenset[str]:
    """The named ``{placeholders}`` in ``message`` (for the catalogue test)."""
    names = set()
    for _, field, _, _ in string.Formatter().parse(message):
        if field is not None:
            names.add(field)
    return frozenset(names)


def catalogue(language: Language) -> Mapping[str, str]:
    """Every singular message of ``language`` and its translation (empty ones left out)."""
    return _catalogue(language)[0]


def plural_catalogue(language: Language) -> Mapping[str, tuple[str, ...]]:
    """Every counting message of ``language`` (by its singular) and its forms."""
    return _plural_catalogue(language)


def _lookup(language: Language, message: str) -> str:
    if language == "en":
        return message
    return _catalogue(language)[0].get(message, message)


def _plural_catalogue(language: Language) -> Mapping[str, tuple[str, ...]]:
    if language == "en":
        return {}
    return _catalogue(language)[1]


@cache
def _catalogue(language: Language) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """Every .po file of ``language`` merged: (singular messages, counting messages)."""
    singular: dict[str, str] = {}
    counting: dict[str, tuple[str, ...]] = {}
    for path in sorted((LOCALE_DIR / language / "LC_MESSAGES").glob("*.po")):
        with path.open("rb") as handle:
            messages = read_po(handle, locale=LOCALES[language])
        for message in messages:
            if not message.id or message.fuzzy:
                continue
            if isinstance(message.id, tuple):
                forms = tuple(str(form) for form in cast(tuple[str, ...], message.string))
                if all(forms):
                    counting[str(message.id[0])] = forms
            elif message.string:
                singular[str(message.id)] = str(message.string)
    return singular, counting
