"""Values in Chinese: durations and hourly prices in Chinese units, small amounts as a Chinese
reader expects them, and what people type in Chinese (durations with Chinese numerals and
halves, amounts in 万 and 千, storage prices per GB-month, instance names in CJK), with English
output left as it was."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from bot.blocks import kit
from bot.errors import UsageError
from bot.i18n import speaking
from bot.text import instance_name
from bot.values import (
    duration_code,
    format_duration,
    format_money,
    format_rate,
    parse_duration,
    parse_money,
    parse_price,
    parse_storage_price,
    spoken_duration,
)
from tests.chinese import assert_chinese

NOW = datetime(2026, 12, 2, 12, 0)
YUAN = 1_000_000


def seconds(n: int) -> timedelta:
    return timedelta(seconds=n)


# --- durations shown ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "english", "chinese"),
    [
        (seconds(4 * 3600 + 32 * 60 + 9), "4h 32m", "4 小时 32 分"),
        (seconds(2), "2s", "2 秒"),
        (seconds(30 * 60 + 5), "30m 5s", "30 分 5 秒"),
        (seconds(45 * 60), "45m", "45 分钟"),
        (seconds(3 * 3600), "3h", "3 小时"),
        (timedelta(days=2, hours=3, minutes=59), "2d 3h", "2 天 3 小时"),
        (timedelta(days=1, seconds=30), "1d 30s", "1 天 30 秒"),
        (seconds(0), "0s", "0 秒"),
        (seconds(-300), "-5m", "-5 分钟"),
    ],
)
def test_a_duration_in_each_language(delta: timedelta, english: str, chinese: str) -> None:
    assert format_duration(delta) == english
    with speaking("zh"):
        assert format_duration(delta) == chinese


@pytest.mark.parametrize(
    ("n", "english", "chinese"),
    [
        (3 * 3600, "3 h", "3 小时"),
        (60, "1 min", "1 分钟"),
        (3600 + 600, "1h10m", "1 小时 10 分"),
        (90, "1m30s", "1 分 30 秒"),
        (0, "0s", "0 秒"),
    ],
)
def test_a_billed_span_in_each_language(n: int, english: str, chinese: str) -> None:
    assert format_duration(seconds(n), compact=True) == english
    with speaking("zh"):
        assert format_duration(seconds(n), compact=True) == chinese


def test_the_kit_says_ago_and_left_in_chinese_units() -> None:
    with speaking("zh"):
        assert kit.ago(NOW - seconds(2), NOW) == "2 秒前"
        assert kit.time_left(NOW + seconds(4 * 3600 + 32 * 60), NOW) == "剩余 4 小时 32 分"
        assert kit.time_left(NOW - seconds(300), NOW) == "已过截止时间 5 分钟"
    assert kit.ago(NOW - seconds(2), NOW) == "2s ago"
    assert kit.time_left(NOW + seconds(4 * 3600 + 32 * 60), NOW) == "4h 32m left"


def test_a_stored_duration_is_english_whatever_the_language_and_is_read_back() -> None:
    delta = seconds(3600 + 1800)
    with speaking("zh"):
        code = duration_code(delta)
        assert code == "1h 30m"
        assert spoken_duration(code) == "1 小时 30 分"
        assert spoken_duration("forever") == "forever"
    assert spoken_duration(code) == "1h 30m"


# --- rates and small amounts ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("micros", "currency", "english", "chinese"),
    [
        (1_660_000, "CNY", "1.66 CNY/h", "¥1.66/小时"),
        (24_920_000, "CNY", "24.92 CNY/h", "¥24.92/小时"),
        (2_100_000, "USD", "$2.10/h", "US$2.10/小时"),
    ],
)
def test_a_rate_in_each_language(micros: int, currency: str, english: str, chinese: str) -> None:
    assert format_rate(micros, currency) == english
    with speaking("zh"):
        assert format_rate(micros, currency) == chinese


@pytest.mark.parametrize(
    ("micros", "shown"),
    [
        (50_000, "¥0.05"),
        (52_300, "¥0.05"),
        (35_000, "¥0.04"),  # half up, as 四舍五入
        (12_345_000, "¥12.35"),
        (10_000, "¥0.01"),
        (9_999, "不到 ¥0.01"),
        (1, "不到 ¥0.01"),
        (-4_000, "-不到 ¥0.01"),
        (0, "¥0.00"),
        (990_000, "¥0.99"),
    ],
)
def test_small_yuan_show_two_decimals_at_most(micros: int, shown: str) -> None:
    with speaking("zh"):
        assert format_money(micros, "CNY") == shown


def test_english_amounts_keep_their_forms() -> None:
    assert format_money(35_000, "USD") == "$0.0350"
    assert format_money(5_000, "USD") == "$0.0050"
    assert format_money(12_345_000, "USD") == "$12.34"  # Babel's half to even, as before
    assert format_money(35_000, "CNY") == "0.0350 CNY"


def test_yen_under_one_and_fixed_digits_in_chinese() -> None:
    with speaking("zh"):
        assert format_money(400_000, "JPY") == "不到 JP¥1"
        assert format_money(35_000, "CNY", digits=4) == "¥0.0350"  # a chart's axis


def test_a_small_rate_in_chinese() -> None:
    with speaking("zh"):
        shown = format_rate(4_000, "CNY")
    assert shown == "不到 ¥0.01/小时"
    assert_chinese(shown)


# --- durations typed ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "delta"),
    [
        ("半小时", timedelta(minutes=30)),
        ("半个小时", timedelta(minutes=30)),
        ("一个半小时", timedelta(hours=1, minutes=30)),
        ("1个半小时", timedelta(hours=1, minutes=30)),
        ("两个半小时", timedelta(hours=2, minutes=30)),
        ("2小时", timedelta(hours=2)),
        ("30分钟", timedelta(minutes=30)),
        ("1.5小时", timedelta(hours=1, minutes=30)),
        ("两小时", timedelta(hours=2)),
        ("两个钟头", timedelta(hours=2)),
        ("1天", timedelta(days=1)),
        ("一天", timedelta(days=1)),
        ("半天", timedelta(hours=12)),
        ("一天半", timedelta(days=1, hours=12)),
        ("两小时半", timedelta(hours=2, minutes=30)),
        ("2分半", timedelta(minutes=2, seconds=30)),
        ("三十分钟", timedelta(minutes=30)),
        ("十五分钟", timedelta(minutes=15)),
        ("一百二十分钟", timedelta(hours=2)),
        ("一小时三十分", timedelta(hours=1, minutes=30)),
        ("1天半小时", timedelta(days=1, minutes=30)),
        ("\uff12小时", timedelta(hours=2)),
        ("1h30m", timedelta(hours=1, minutes=30)),
    ],
)
def test_durations_as_chinese_readers_type_them(text: str, delta: timedelta) -> None:
    assert parse_duration(text) == delta


@pytest.mark.parametrize("text", ["半", "个半小时", "两周", "小时半", "半半小时", "零分钟"])
def test_a_chinese_duration_it_cannot_read_is_refused_in_chinese(text: str) -> None:
    with speaking("zh"), pytest.raises(UsageError) as caught:
        parse_duration(text)
    assert repr(text) in caught.value.message
    assert_chinese(caught.value.user_text())


# --- amounts typed --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("1.5万", 15_000 * YUAN),
        ("3千", 3_000 * YUAN),
        ("2百", 200 * YUAN),
        ("200元", 200 * YUAN),
        ("¥200", 200 * YUAN),
        ("1.5万元", 15_000 * YUAN),
        ("¥1.5万", 15_000 * YUAN),
        ("\uffe5\uff13千", 3_000 * YUAN),
        ("1亿", 100_000_000 * YUAN),
    ],
)
def test_amounts_as_chinese_readers_type_them(text: str, micros: int) -> None:
    assert parse_money(text, "CNY") == micros


def test_a_price_per_day_in_thousands() -> None:
    assert parse_price("2.4千元/天", "CNY") == 100 * YUAN


@pytest.mark.parametrize("text", ["万", "1.5万万", "万1", "-1万", "1.5万$"])
def test_an_amount_it_cannot_read_is_refused_in_chinese(text: str) -> None:
    with speaking("zh"), pytest.raises(UsageError) as caught:
        parse_money(text, "CNY")
    assert_chinese(caught.value.user_text())


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("0.35元/GB/月", 350_000),
        ("¥0.35/GB/月", 350_000),
        ("0.35/gb/月", 350_000),
        ("0.35元/GB/个月", 350_000),
        ("0.35元每GB每月", 350_000),
        ("0.35元/GB每月", 350_000),
        ("\uff10.35元\uff0fGB\uff0f月", 350_000),
        ("0.35", 350_000),
        ("0.10/GB-month", 100_000),
        ("0.10/GB/month", 100_000),
    ],
)
def test_storage_prices_in_chinese(text: str, micros: int) -> None:
    assert parse_storage_price(text, "CNY") == micros


def test_a_storage_price_it_cannot_read_is_refused_in_chinese() -> None:
    with speaking("zh"), pytest.raises(UsageError) as caught:
        parse_storage_price("0.35元/TB/月", "CNY")
    assert "'0.35元/TB/月'" in caught.value.message
    assert "0.35元/GB/月" in (caught.value.hint or "")
    assert_chinese(caught.value.user_text())
    with pytest.raises(UsageError, match="is in CNY"):
        parse_storage_price("0.35元/GB/月", "USD")


# --- instance names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "name"),
    [("卡4090", "卡4090"), ("训练-a100", "训练-a100"), ("\uff42\uff4f\uff58\uff11", "box1")],
)
def test_instance_names_may_hold_cjk(typed: str, name: str) -> None:
    assert instance_name(typed) == name


@pytest.mark.parametrize(
    ("typed", "code"),
    [("卡\u200b4090", "U+200B"), ("卡\u202e4090", "U+202E"), ("卡\n4090", "U+000A")],
)
def test_a_cjk_name_with_hidden_characters_is_refused_in_chinese(typed: str, code: str) -> None:
    with speaking("zh"), pytest.raises(UsageError) as caught:
        instance_name(typed)
    assert code in caught.value.message
    assert_chinese(caught.value.user_text())
