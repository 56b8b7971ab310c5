"""The check the Chinese tests rely on finds English sentences and leaves code alone."""

from __future__ import annotations

import pytest

from tests.chinese import assert_chinese, english_left


def test_code_commands_mentions_and_names_are_not_english_sentences() -> None:
    text = "实例 `gpu-a` 已释放。用 /gpu extend gpu-a 2h 延长 <@U1> :warning: H100 80GB"
    assert english_left(text) == []


def test_an_english_sentence_is_found_in_text_and_in_blocks() -> None:
    assert english_left("gpu-a was released at 18:00") == ["was released at"]
    block = {"type": "section", "text": {"type": "mrkdwn", "text": "It was released today"}}
    with pytest.raises(AssertionError, match="was released"):
        assert_chinese({"blocks": [block]})
    assert_chinese({"type": "section", "text": {"type": "mrkdwn", "text": "已释放 `gpu-a`"}})
