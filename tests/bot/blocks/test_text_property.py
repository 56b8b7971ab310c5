"""Random names, projects and agent-reported strings, through the real renderers and the real
CSV writer: nothing renders as a mention, a link, bold text, a reversed string or a spreadsheet
formula.

The renderers (bot.blocks) put every word that came from a person, an agent or a platform
through bot.blocks.kit.escape; names and projects are read by bot.text before anything is
stored; the spend CSV (bot.services.money.spend.spend_csv) writes text cells through
bot.text.csv_cell.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.blocks import instances, jobs, money
from bot.blocks.kit import escape
from bot.errors import UsageError
from bot.services.instances.views import CheckView, HealthView, ProblemView
from bot.services.jobs.views import JobListView, LogView
from bot.services.money.spend import spend_csv
from bot.text import FORMULA_STARTS, csv_cell, instance_name, is_hidden, project
from tests.bot.blocks.test_instances import gpus, inst, overview, row
from tests.bot.blocks.test_jobs import job
from tests.bot.blocks.test_money import report, spend_item

#: Characters that make trouble in Slack, in spreadsheets or in a reader's eye.
TRICKY = [
    *"<>&*_~`@!|=+-#:/.\t\r\n ",
    "\u202e",  # right-to-left override
    "\u202d",
    "\u2066",  # isolates
    "\u2067",
    "\u2068",
    "\u2069",
    "\u200b",  # zero-width space
    "\u200d",
    "\u2028",  # line separator
    "\u2029",
    "\ufeff",
    "\u0000",
    "卡",
]
WORDS = st.text(st.one_of(st.sampled_from(TRICKY), st.characters()), max_size=40)
#: The mentions the renderers themselves make (owners, requesters).
BOT_MENTION = re.compile(r"<@U[A-Z0-9]+>")
CODE_SPAN = re.compile(r"`[^`\n]*`")
ENTITY = re.compile(r"&(?:amp|lt|gt);")
#: What mrkdwn reads as bold, italics or strikethrough.
FORMATTED = re.compile(r"(?<![^\W_])([*_~])\S(?:[^\n]*?\S)?\1(?![^\W_])")
Message = tuple[str, tuple[dict[str, Any], ...]]


def renderings(words: str) -> dict[str, Callable[[], Message]]:
    """Every renderer under test, fed ``words`` where an agent or a platform speaks."""
    shown = inst(project=words, gpu_model=words, delivered_gpu_name=words)
    checks = (CheckView(words, "fail", words, words),)
    return {
        "fleet_overview": lambda: instances.fleet_overview(
            overview([row(shown, gpus=gpus(2, name=words), problem=ProblemView("X", words, words))])
        ),
        "health_report": lambda: instances.health_report(HealthView(shown, "fail", checks, False)),
        "job_list": lambda: jobs.job_list(
            JobListView(None, (job(command=("echo", words), note=words),), problem=words)
        ),
        "log_message": lambda: jobs.log_message(LogView(job(), words, 50)),
        "spend_message": lambda: money.spend_message(
            report([spend_item(0, project=words, gpu_model=words)], by="project")
        ),
    }


def mrkdwn_texts(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if node.get("type") == "mrkdwn":
            yield node["text"]
        for value in node.values():
            yield from mrkdwn_texts(value)
    elif isinstance(node, list | tuple):
        for item in node:
            yield from mrkdwn_texts(item)


def assert_inert(text: str, where: str) -> None:
    """No mention or link but the bot's own, no bare ``&``, nothing that turns text around."""
    rest = BOT_MENTION.sub("", text)
    assert "<" not in rest, (where, text)
    assert ">" not in rest, (where, text)
    assert "&" not in ENTITY.sub("", rest), (where, text)
    assert not [c for c in text if c not in "\n\t" and is_hidden(c)], (where, text)


@settings(max_examples=60, deadline=None)
@given(words=WORDS)
def test_no_renderer_lets_agent_or_platform_words_mention_link_or_turn_around(words: str) -> None:
    for name, render in renderings(words).items():
        text, body = render()
        assert_inert(text, name)
        for part in mrkdwn_texts(list(body)):
            assert_inert(part, name)


@settings(max_examples=60, deadline=None)
@given(inner=st.text(st.characters(whitelist_categories=("L", "N")), min_size=1, max_size=12))
def test_no_renderer_shows_agent_words_in_bold_italics_or_strikethrough(inner: str) -> None:
    for mark in "*_~":
        words = f"{mark}{inner}{mark}"
        for name, render in renderings(words).items():
            text, body = render()
            for part in [text, *mrkdwn_texts(list(body))]:
                assert words not in CODE_SPAN.sub("", part), (name, part)


@settings(max_examples=200, deadline=None)
@given(words=WORDS)
def test_escaped_words_hold_no_formatting_mention_or_hidden_character(words: str) -> None:
    shown = escape(words)
    assert "<" not in shown
    assert ">" not in shown
    assert not FORMATTED.search(CODE_SPAN.sub("", shown))
    assert not [c for c in shown if c not in "\n\t" and is_hidden(c)]


@settings(max_examples=200, deadline=None)
@given(words=WORDS)
def test_names_and_projects_are_taken_only_without_hidden_characters(words: str) -> None:
    for read in (instance_name, project):
        if [c for c in words if is_hidden(c)]:
            with pytest.raises(UsageError, match="invisible or direction-changing"):
                read(words)
            continue
        try:
            value = read(words)
        except UsageError:
            continue  # refused for its pattern or length
        assert value is not None
        assert not [c for c in value if is_hidden(c)]


@settings(max_examples=100, deadline=None)
@given(words=WORDS, name=WORDS)
def test_no_csv_cell_is_a_formula_and_the_amounts_stay_exact(words: str, name: str) -> None:
    item = spend_item(0, name=name, project=words, gpu_model=words, provider=words)
    raw = spend_csv(report([item], by="project"))
    assert raw.startswith("\ufeff".encode())
    [line] = list(csv.DictReader(io.StringIO(raw.decode("utf-8-sig"), newline="")))
    for column in ("instance", "owner", "owner_name", "project", "provider", "gpu_model"):
        assert not line[column].startswith(FORMULA_STARTS), (column, line[column])
    assert line["project"] == csv_cell(words)
    assert Decimal(line["compute_USD"]) == Decimal(item.compute_micros) / 1_000_000
    assert Decimal(line["total_USD"]) == Decimal(item.total_micros) / 1_000_000
