"""The message catalogue: every sentence marked in the code has its Chinese, with the same
placeholders, and nothing marked is built from an f-string (which the catalogue cannot hold)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from babel.messages.extract import extract_from_dir

from bot import i18n
from bot.i18n import N_, nt, placeholders, speaking, t

ROOT = Path(__file__).resolve().parents[2]
KEYWORDS = {"t": None, "nt": (1, 2), "N_": None}
#: Where marked messages are: the bot, and the agent's health checks, whose findings carry
#: their English template (marked with the agent's own ``N_``) for the bot to translate.
MARKED_DIRS = ("bot", "agents/checks")


def marked_messages() -> dict[str, str | tuple[str, str]]:
    """Every message marked in bot/, by its singular text, with where it is."""
    found: dict[str, str | tuple[str, str]] = {}
    for directory in MARKED_DIRS:
        for filename, lineno, message, _comments, _context in extract_from_dir(
            str(ROOT / directory),
            method_map=[("**.py", "python")],
            keywords=KEYWORDS,
            comment_tags=(),
            strip_comment_tags=True,
        ):
            key = message[0] if isinstance(message, tuple) else message
            if key:
                where = f"{directory}/{filename}:{lineno}"
                found[key] = message if isinstance(message, tuple) else where
    return found


def test_every_marked_message_has_its_chinese_with_the_same_placeholders() -> None:
    zh = i18n.catalogue("zh")
    zh_counting = i18n.plural_catalogue("zh")
    missing: list[str] = []
    broken: list[str] = []
    for key, message in marked_messages().items():
        if isinstance(message, tuple):
            forms = zh_counting.get(key)
            if forms is None:
                missing.append(key)
                continue
            wanted = placeholders(message[0]) | placeholders(message[1])
            if any(placeholders(form) - wanted for form in forms):
                broken.append(key)
            continue
        text = zh.get(key)
        if text is None:
            missing.append(f"{key!r} ({message})")
        elif placeholders(text) != placeholders(key):
            broken.append(f"{key!r} -> {text!r}")
    assert not missing, f"{len(missing)} messages without Chinese:\n" + "\n".join(missing[:50])
    assert not broken, "placeholders changed:\n" + "\n".join(broken[:50])


def test_no_marked_message_is_an_fstring_or_a_concatenation() -> None:
    bad: list[str] = []
    for path in sorted(p for d in MARKED_DIRS for p in (ROOT / d).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id not in KEYWORDS or not node.args:
                continue
            first = node.args[0]
            if isinstance(first, ast.JoinedStr | ast.BinOp):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "t()/nt()/N_() take a literal with {placeholders}:\n" + "\n".join(bad)


def test_the_active_language_follows_the_block_and_falls_back_to_the_default() -> None:
    message = "That button is out of date or malformed; run the command again for a new one."
    assert t(message) == message
    with speaking("zh"):
        assert t(message) != message
        assert i18n.active_language() == "zh"
    assert i18n.active_language() == "en"
    i18n.set_default_language("zh")
    try:
        assert t(message) != message
        with speaking("en"):
            assert t(message) == message
    finally:
        i18n.set_default_language("en")


def test_placeholders_are_filled_and_counting_chooses_a_form() -> None:
    assert placeholders("{name} has {n} GPUs, {n} idle") == {"name", "n"}
    assert t("{a} and {b}", a=1, b=2) == "1 and 2"  # not in the catalogue: English
    assert nt("{n} apple", "{n} apples", 1, n=1) == "1 apple"
    assert nt("{n} apple", "{n} apples", 3, n=3) == "3 apples"
    assert N_("left as it is") == "left as it is"


@pytest.mark.parametrize(
    ("typed", "language"),
    [("zh", "zh"), ("中文", "zh"), (" CN ", "zh"), ("en", "en"), ("English", "en"), ("fr", None)],
)
def test_languages_are_named_as_people_type_them(typed: str, language: str | None) -> None:
    assert i18n.language_of(typed) == language


def test_a_message_in_two_catalogue_files_reads_the_same_in_both() -> None:
    """The files are merged: one message with two translations would depend on file order."""
    from babel.messages.pofile import read_po

    seen: dict[str, tuple[str, object]] = {}
    clashes: list[str] = []
    for path in sorted((i18n.LOCALE_DIR / "zh" / "LC_MESSAGES").glob("*.po")):
        with path.open("rb") as handle:
            for message in read_po(handle):
                if not message.id:
                    continue
                key = message.id if isinstance(message.id, str) else message.id[0]
                text = message.string if isinstance(message.string, str) else tuple(message.string)
                first = seen.setdefault(key, (path.name, text))
                if first[1] != text:
                    clashes.append(f"{key!r}: {first[0]} and {path.name}")
    assert not clashes, "\n".join(clashes)
