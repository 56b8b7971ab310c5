"""Shared Block Kit helpers: clipping, escaping, packing and fitting within Slack's limits."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from slack_sdk.models.views import View

from bot.blocks import kit as common
from bot.i18n import speaking
from tests.bot.blocks.slack_limits import check_block, check_message
from tests.chinese import assert_chinese

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


def _view(blocks: list[dict[str, Any]], **texts: str) -> dict[str, Any]:
    return common.modal(
        texts.get("title", "Title"),
        blocks,
        callback_id="cb",
        submit=texts.get("submit", "Go"),
        close=texts.get("close", "Back"),
    )


def check_view(view: dict[str, Any]) -> None:
    """Assert slack_sdk reads ``view`` as a valid modal, exactly as built."""
    model = View(**view)
    model.validate_json()
    assert model.to_dict() == view


@pytest.mark.parametrize("size", [1, 24, 25, 160, 5000])
def test_modal_pieces_clip_to_slack_limits(size: int) -> None:
    text = "z" * size
    options = [common.option(text, f"v{i}", description=text) for i in range(120)]
    view = _view(
        [
            common.input_block(
                text,
                common.plain_text_input("a", placeholder=text, initial_value=text),
                block_id="b" * (size + 250),
                hint=text,
            ),
            common.input_block(
                text, common.static_select("a", options, placeholder=text), block_id="s"
            ),
            common.input_block(
                text,
                common.static_select("a", groups=[common.option_group(text, options)] * 120),
                block_id="g",
                optional=True,
            ),
            common.input_block(
                text, common.checkboxes("a", options, initial=options[:1]), block_id="c"
            ),
        ],
        title=text,
        submit=text,
        close=text,
    )
    check_view(view)
    assert len(view["title"]["text"]) <= 24
    assert len(view["blocks"][0]["block_id"]) <= 255
    assert len(view["blocks"][1]["element"]["options"]) == 100
    assert len(view["blocks"][2]["element"]["option_groups"]) == 100
    assert len(view["blocks"][3]["element"]["options"]) == 10


def test_modal_limits_that_would_lose_something_are_bugs_not_clips() -> None:
    field = common.input_block("x", common.plain_text_input("a"), block_id="x")
    with pytest.raises(ValueError, match="101 blocks"):
        _view([field] * 101)
    with pytest.raises(ValueError, match="0 blocks"):
        _view([])
    with pytest.raises(ValueError, match="option value"):
        common.option("ok", "v" * 151)
    with pytest.raises(ValueError, match="options or option groups"):
        common.static_select("a")
    with pytest.raises(ValueError, match="private metadata"):
        common.modal(
            "t", [field], callback_id="c", submit="s", close="c", private_metadata="m" * 3001
        )
    check_view(_view([field] * 100))


def test_a_button_takes_a_confirm_dialog_whose_deny_defaults_to_cancel() -> None:
    element = common.button(
        "Release", "act", "1", confirm=common.confirm_dialog("Sure?", "It goes.", confirm="Yes")
    )
    check_block(common.actions([element]))
    assert element["confirm"]["deny"]["text"] == "Cancel"
    with speaking("zh"):
        assert common.confirm_dialog("t", "x", confirm="y")["deny"]["text"] == "取消"


def test_the_kits_own_words_in_chinese() -> None:
    blocks = [common.section(str(i)) for i in range(60)]
    with speaking("zh"):
        left = common.time_left(NOW + timedelta(hours=2, minutes=5), NOW)
        passed = common.time_left(NOW - timedelta(minutes=5), NOW)
        words = [
            common.time_left(None, NOW),
            left,
            passed,
            common.ago(NOW, NOW),
            common.ago(NOW - timedelta(minutes=5), NOW),
            common.when(NOW, ZoneInfo("Asia/Shanghai")),
        ]
        note = common.fit(blocks)[-1]["elements"][0]["text"]
    assert_chinese(*words, note)
    assert all(re.search("[\u4e00-\u9fff]", text) for text in [*words, note]), words
    assert passed == "已过截止时间 5 分钟"
    assert words[4] == "5 分钟前"
    assert "11" in note
    assert left == "剩余 2 小时 5 分"
    assert words[-1] == "12月02日 周三 20:00 CST"
    assert common.when(NOW, ZoneInfo("Asia/Shanghai")) == "Wed 02 Dec 20:00 CST"
    assert common.fit(blocks)[-1]["elements"][0]["text"] == "11 more not shown."
