"""`/gpu fit` as people type it: Chinese modes, several models joined with +, --context,
--batch, --headroom, and the flags it always had."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from bot.commands import build_registry
from bot.commands.money import FIT
from bot.commands.parser import parse
from bot.commands.registry import Reply
from bot.errors import UsageError
from bot.i18n import speaking
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.store.db import Database
from tests.bot.services.support import Clock, make_runtime
from tests.chinese import assert_chinese

REGISTRY = build_registry()
OWNER = Caller("UOWNER", "COPS")


@pytest.fixture
def rt(sqlite_db: Database) -> Runtime:
    return make_runtime(sqlite_db, Clock(datetime(2026, 12, 2, 12, 0)))


def run(rt: Runtime, text: str) -> Reply:
    spec, args = parse(text, REGISTRY)
    return spec.handler(rt, OWNER, args)


def shown(reply: Reply) -> str:
    return reply.text + json.dumps(reply.blocks, ensure_ascii=False)


def test_fit_7b_in_chinese_parses_and_answers_in_chinese(rt: Runtime) -> None:
    with speaking("zh"):
        reply = run(rt, "fit 7b 推理")
    text = shown(reply)
    assert "推理" in text
    assert "余量" in text
    assert_chinese(reply.text)
    assert shown(run(rt, "fit 7b inference")) != text


@pytest.mark.parametrize(
    ("typed", "mode"),
    [("fit 7b 微调", "lora"), ("fit 7b 全量", "full"), ("fit 7b", "inference")],
)
def test_chinese_and_missing_modes_read_as_the_english_ones(
    rt: Runtime, typed: str, mode: str
) -> None:
    assert shown(run(rt, typed)) == shown(run(rt, f"fit 7b {mode}"))


def test_several_models_on_one_card(rt: Runtime) -> None:
    text = shown(run(rt, "fit 7b:4bit+13b:4bit inference"))
    assert "together, inference" in text
    assert "*NVIDIA GeForce RTX 4090* (24 GB: 20.7 GiB usable, needs" in text
    both16 = shown(run(rt, "fit 7b:4bit+13b inference"))
    assert "2x *NVIDIA GeForce RTX 4090*" in both16


def test_context_batch_and_headroom_reach_the_answer(rt: Runtime) -> None:
    text = shown(run(rt, "fit 7b inference --context 8192 --batch 2 --headroom 30%"))
    assert "a context of 8192 tokens x batch 2" in text
    assert "with 30% headroom" in text
    # --seq, the flag `fit` always had, is the same as --context.
    assert shown(run(rt, "fit 7b lora --seq 2048")) == shown(run(rt, "fit 7b lora --context 2048"))
    assert "lora, 8-bit" in shown(run(rt, "fit 7b lora --bits 8"))


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("fit 7b lora --headroom lots", "not a percentage"),
        ("fit 7b lora --context 0", "--context"),
        ("fit 7b lora --bits 3", "--bits '3' is not supported."),
        ("fit 7b 训练", "not a mode"),
        ("fit 7b:4bit+ inference", "empty model"),
    ],
)
def test_mistakes_are_refused(rt: Runtime, typed: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        run(rt, typed)
    assert message in caught.value.message


def test_every_example_in_the_help_runs(rt: Runtime) -> None:
    for example in FIT.examples:
        reply = run(rt, example.removeprefix("/gpu "))
        assert "*Fits on*" in shown(reply), example


def test_prices_in_yuan_come_from_the_chinese_table(sqlite_db: Database) -> None:
    rt = make_runtime(sqlite_db, Clock(datetime(2026, 12, 2, 12, 0)), currency="CNY")
    with speaking("zh"):
        text = shown(run(rt, "fit 7b 推理 --bits 4"))
    assert "¥1.66/小时" in text
    assert "从容" in text
