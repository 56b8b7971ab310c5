"""Every message of the Chinese catalogue, rendered as a reader sees it, is Chinese.

Each entry of every ``bot/locale/zh/LC_MESSAGES/*.po`` file, singular and counting forms, is
formatted with plausible values for its placeholders (instance names like ``gpu-a``, numbers,
amounts, times, a Chinese reason) and checked with :func:`tests.chinese.english_left`: an
English sentence left in a translation fails, naming the file and the message. An entry with no
translation, or one marked fuzzy (which the bot skips), fails too: the reader would get English.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from babel.messages.pofile import read_po

from bot import i18n
from tests.chinese import HAN, english_left

CATALOGUE_DIR: Final = i18n.LOCALE_DIR / "zh" / "LC_MESSAGES"

#: Sample values by placeholder name: what the bot puts there when it speaks Chinese.
SAMPLES: Final[dict[str, object]] = {
    "name": "gpu-a",
    "name2": "gpu-b",
    "instance": "gpu-a",
    "names": "gpu-a、gpu-b",
    "host": "203.0.113.7",
    "address": "root@203.0.113.7:22",
    "user": "root",
    "owner": "<@U0ALICE>",
    "person": "<@U0BOB>",
    "who": "<@U0ALICE>",
    "admin": "<@U0ADMIN>",
    "admins": "<@U0ADMIN>",
    "caller": "<@U0BOB>",
    "provider": "优云智算",
    "platform": "¥24.92",
    "provider_id": "uhost-1a2b3c",
    "id": "uhost-1a2b3c",
    "gpu": "A800 80GB",
    "gpus": "0,1",
    "model": "A800 80GB",
    "cost": "¥24.92",
    "amount": "¥3.50",
    "spent": "¥1,200.00",
    "limit": "¥3,000.00",
    "price": "¥3.50/小时",
    "total": "¥24.92",
    "budget": "¥3,000.00",
    "difference": "¥0.42",
    "bot": "¥24.50",
    "saving": "¥8.00",
    "rate": "¥3.50/小时",
    "pace": "¥3.50/小时",
    "burn": "¥7.00/小时",
    "at": "18:00",
    "until": "18:00",
    "since": "12-03 09:00",
    "deadline": "18:00",
    "date": "2026-12-03",
    "month": "2026-11",
    "duration": "1 小时 10 分",
    "age": "5 分钟前",
    "ago": "5 分钟前",
    "waited": "2 小时",
    "lasted": "3 小时",
    "left": "4 小时 32 分",
    "grace": "2 小时",
    "command": "/gpu extend gpu-a 2h",
    "option": "--price",
    "path": "/dev/shm",
    "size": "64 MB",
    "unit": "小时",
    "currency": "CNY",
    "language": "简体中文",
    "reason": "到期时间已到",
    "error": "连接超时",
    "detail": "连接超时",
    "details": "连接超时",
    "problem": "连接超时",
    "why": "没有空闲的 GPU",
    "what": "显存不足",
    "text": "示例",
    "message": "显存不足",
    "hint": "请稍后再试。",
    "summary": "显存不足",
    "state": "运行中",
    "status": "运行中",
    "title": "示例",
    "label": "示例",
    "exc": "连接超时",
    "cause": "计费粒度不同",
    "note": "示例",
}


@dataclass(frozen=True)
class Sample:
    """A placeholder's value: its text, and a number for placeholders formatted as numbers
    (``{n:,}``, ``{value:.0f}``)."""

    text: str
    number: float = 3

    def __format__(self, spec: str) -> str:
        if spec and spec[-1] in "deEfFgGn%,":
            value = int(self.number) if spec[-1] in "d," else self.number
            return format(value, spec)
        return format(self.text, spec)

    def __repr__(self) -> str:
        return repr(self.text)


class Samples(dict[str, Sample]):
    """Every placeholder a message may name, with its sample (3 where no sample is known)."""

    def __missing__(self, key: str) -> Sample:
        value = SAMPLES.get(key)
        return Sample("3") if value is None else Sample(str(value))


@dataclass(frozen=True)
class Entry:
    """One message of a catalogue file: where it is, its English and its Chinese forms."""

    file: str
    english: str
    forms: tuple[str, ...]
    fuzzy: bool

    def __str__(self) -> str:
        return f"{self.file}: {self.english!r}"


def entries() -> Iterator[Entry]:
    for path in sorted(CATALOGUE_DIR.glob("*.po")):
        with path.open("rb") as handle:
            catalogue = read_po(handle, locale=i18n.LOCALES["zh"])
        for message in catalogue:
            if not message.id:
                continue
            english = message.id if isinstance(message.id, str) else str(message.id[0])
            string = message.string or ""
            forms = (string,) if isinstance(string, str) else tuple(str(form) for form in string)
            yield Entry(path.name, english, forms, bool(message.fuzzy))


ENTRIES: Final = tuple(entries())


def render(form: str) -> str:
    """A translation as a reader sees it: its placeholders filled with samples."""
    return form.format_map(Samples())


def test_the_catalogue_is_read() -> None:
    assert len(ENTRIES) > 1000
    assert any(len(entry.forms) == 1 and "{n}" in entry.english for entry in ENTRIES)


def test_every_entry_is_translated_and_not_fuzzy() -> None:
    bad = [str(entry) for entry in ENTRIES if entry.fuzzy or not all(entry.forms)]
    assert not bad, "untranslated or fuzzy:\n" + "\n".join(bad)


def test_every_message_renders_in_chinese_without_an_english_sentence() -> None:
    left: list[str] = []
    for entry in ENTRIES:
        for form in entry.forms:
            runs = english_left(render(form))
            if runs:
                left.append(f"{entry} -> {runs}")
    assert not left, f"{len(left)} messages keep English:\n" + "\n".join(left)


_WORDS = re.compile(r"[A-Za-z]{2,}")


def test_a_message_with_english_words_is_written_in_chinese() -> None:
    """English prose (outside placeholders, code and commands) comes back with Chinese in it:
    a message copied unchanged, or a short phrase left in English, would slip past the check
    for sentences."""
    bare = re.compile(r"\{[^{}]*\}|`[^`]*`|<[^>]*>|:[a-z0-9_+\-]+:|/gpu(?:\s+\S+)*|--?[\w\-]+")
    wordy = [entry for entry in ENTRIES if len(_WORDS.findall(bare.sub(" ", entry.english))) > 1]
    assert len(wordy) > 1000
    english = [str(entry) for entry in wordy if not any(HAN.search(f) for f in entry.forms)]
    assert not english, "\n".join(english)


@pytest.mark.parametrize(
    ("form", "rendered"),
    [
        ("{name} 已释放，花费 {cost}。", "gpu-a 已释放，花费 ¥24.92。"),
        ("{n:,} 行", "3 行"),
        ("{value:.0f}%", "3%"),
        ("{name!r} 不是实例名", "'gpu-a' 不是实例名"),
    ],
)
def test_placeholders_get_plausible_values(form: str, rendered: str) -> None:
    assert render(form) == rendered


def test_an_english_translation_is_caught() -> None:
    assert english_left(render("{name} was released at {at}.")) == ["was released at"]


def test_the_samples_are_not_english_themselves() -> None:
    assert not [value for value in SAMPLES.values() if english_left(str(value))]


def test_catalogue_files_live_where_the_bot_reads_them() -> None:
    assert Path(CATALOGUE_DIR).is_dir()
    assert {entry.file for entry in ENTRIES} == {p.name for p in CATALOGUE_DIR.glob("*.po")}
