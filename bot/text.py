"""Text that cannot lie: names and projects people type, and cells of the exported spreadsheets.

A name or a project is read in Unicode NFKC form (full-width letters and digits become the
plain ones: full-width ``abc`` and ``abc`` are one name) and is refused, changing nothing, when it
holds a control or format character: Unicode general categories Cc, Cf, Zl and Zp, which take
in the bidirectional overrides and isolates (U+202A..U+202E, U+2066..U+2069), zero-width spaces
and joiners (U+200B..U+200D) and newlines. Letters of any script (``卡4090``) stay allowed.
Source: Unicode Standard Annex #15 (normalization forms) and #9 (the bidirectional algorithm,
explicit formatting characters); the categories from ``unicodedata.category``.

A spreadsheet cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is
read by Excel, LibreOffice and Google Sheets as a formula; :func:`csv_cell` puts a ``'`` in front
of such text (OWASP, "CSV Injection").
"""

from __future__ import annotations

import re
import unicodedata

from bot.errors import UsageError
from bot.i18n import N_, t

#: The Unicode general categories refused in names and projects.
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
#: Bidirectional embeddings, overrides and isolates (all Cf, listed for the docstring's sake).
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")
#: How a spreadsheet cell may begin when it is to be read as a formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: An instance name: lowercase ASCII letters, digits and dashes, or CJK characters (``卡4090``:
#: Han ideographs, kana, Hangul; other scripts' letters are left out, so no Cyrillic ``\u0430``
#: passes for a Latin ``a``), 1-31 characters, starting with a letter, digit or CJK character.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f"
_NAME_RE = re.compile(rf"[a-z0-9{_CJK}][a-z0-9{_CJK}-]{{0,30}}")
NAME_HINT = N_(
    "Use 1-31 lowercase letters, digits and dashes (or letters such as 卡), "
    "starting with a letter or digit."
)
PROJECT_MAX = 80
PROJECT_HINT = N_(
    "A project is 1-80 letters, digits, spaces and punctuation, without control characters."
)


def normal(text: str) -> str:
    """``text`` in NFKC form."""
    return unicodedata.normalize("NFKC", text)


def is_hidden(char: str) -> bool:
    """Whether ``char`` is a control or format character (see the module docstring)."""
    return char in BIDI_CONTROLS or unicodedata.category(char) in REFUSED_CATEGORIES


def hidden_characters(text: str) -> list[str]:
    """The control and format characters in ``text`` as ``U+XXXX`` (in order, each once)."""
    found: list[str] = []
    for char in text:
        if is_hidden(char):
            code = f"U+{ord(char):04X}"
            if code not in found:
                found.append(code)
    return found


def instance_name(text: str) -> str:
    """An instance name as typed, in NFKC form. Raises UsageError (naming the hidden characters
    by code point) for control or format characters, or a name that does not fit the pattern."""
    _refuse_hidden(normal(text), what=t("An instance name"))
    name = normal(text).strip()
    if not _NAME_RE.fullmatch(name):
        raise UsageError(
            t("{name!r} is not a valid instance name.", name=_echo(name)), hint=t(NAME_HINT)
        )
    return name


def project(text: str | None) -> str | None:
    """A project as typed, in NFKC form (None stays None). Raises UsageError for control or
    format characters, or more than 80 characters."""
    if text is None:
        return None
    _refuse_hidden(normal(text), what=t("A project"))
    value = normal(text).strip()
    if not value or len(value) > PROJECT_MAX:
        raise UsageError(t("{project!r} is not a valid project.", project=_echo(value)))
    return value


def csv_cell(value: str) -> str:
    """``value`` as a spreadsheet reads it as text: control and format characters (a carriage
    return would end the row, an override turn it around) as U+FFFD, and a ``'`` in front when
    it would begin a formula (see the module docstring); other text unchanged."""
    if not value.isascii() or not value.isprintable():
        value = "".join("\ufffd" if is_hidden(char) else char for char in value)
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def _refuse_hidden(text: str, *, what: str) -> None:
    hidden = hidden_characters(text)
    if hidden:
        raise UsageError(
            t(
                "{what} cannot hold invisible or direction-changing characters ({codes}).",
                what=what,
                codes=", ".join(hidden[:5]),
            ),
            hint=t(PROJECT_HINT) if what == t("A project") else t(NAME_HINT),
        )


#: The most characters of what a person typed that a refusal echoes (then "…").
ECHO_MAX = 40


def _echo(text: str) -> str:
    return text if len(text) <= ECHO_MAX else text[:ECHO_MAX] + "…"
