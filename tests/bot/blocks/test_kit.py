"""Shared Block Kit helpers: clipping, escaping, packing and fitting within Slack's limits."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from bot.blocks import kit as common
from tests.bot.blocks.slack_limits import check_block, check_message

NOW = datetime(2026, 12, 2, 12, 0, 0)


def test_clip_keeps_short_text_and_marks_cut_text() -> None:
    assert common.clip("abc", 3) == "abc"
    assert common.clip("abcd", 3) == "ab…"
    assert len(common.clip("x" * 10_000, 3000)) == 3000


def test_escape_and_code() -> None:
    assert common.escape("<@U1> & <!here>") == "&lt;@U1&gt; &amp; &lt;!here&gt;"
    assert common.code("a`b<c") == "`a'b&lt;c`"


@pytest.mark.parametrize("size", [1, 150, 151, 5000])
def test_builders_clip_to_slack_limits(size: int) -> None:
    text = "y" * size
    for block in (
        common.header(text),
        common.section(text),
        common.fields([text] * 12, text=text),
        common.context(*([text] * 12)),
        common.actions(
            [
                common.button(
                    text,
                    "act",
                    "1",
                    style="danger",
                    confirm=common.confirm_dialog(text, text, confirm=text, deny=text),
                )
            ]
            * 30
        ),
    ):
        check_block(block)


def test_button_value_over_the_limit_is_a_bug_not_a_clip() -> None:
    with pytest.raises(ValueError, match="button value"):
        common.button("ok", "act", "v" * 2001)


def test_pack_fills_texts_up_to_the_limit() -> None:
    lines = ["a" * 40] * 10
    packed = common.pack(lines, 100)
    assert all(len(t) <= 100 for t in packed)
    assert sum(t.count("a" * 40) for t in packed) == 10
    assert len(packed) == 5
    assert common.pack([], 100) == []
    assert common.pack(["z" * 500], 100) == ["z" * 99 + "…"]


def test_fit_cuts_to_fifty_blocks_and_says_how_many_were_left_out() -> None:
    blocks = [common.section(str(i)) for i in range(120)]
    fitted = common.fit(blocks, "{n} more")
    check_message(("text", fitted))
    assert len(fitted) == 50
    assert fitted[-1]["elements"][0]["text"] == "71 more"
    assert common.fit(blocks[:50]) == tuple(blocks[:50])


def test_times() -> None:
    assert common.time_left(None, NOW) == "no deadline"
    assert common.time_left(NOW + timedelta(hours=2, minutes=5), NOW) == "2h 5m left"
    assert common.time_left(NOW - timedelta(minutes=5), NOW) == "deadline passed 5m ago"
    assert common.ago(NOW, NOW) == "just now"
    assert common.ago(NOW - timedelta(days=1, hours=3), NOW) == "1d 3h ago"
    assert common.when(NOW, ZoneInfo("America/New_York")) == "Wed 02 Dec 07:00 EST"
    assert common.gib(None) == "?"
    assert common.gib(80 * 1024**3) == "80"


def test_fallback_text_is_clipped() -> None:
    assert len(common.fallback("t" * 50_000)) == common.FALLBACK_TEXT_MAX
