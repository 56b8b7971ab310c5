"""bot.values: counts, amounts, prices and durations people type, checked with a clear
message."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.errors import UsageError
from bot.values import parse_duration, parse_money, parse_price, whole_number


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("7", 7), (" 12 ", 12), ("0100", 100)])
def test_whole_numbers_are_read(text: str, value: int) -> None:
    assert whole_number("--retries")(text) == value


@pytest.mark.parametrize("text", ["x", "", "-1", "1.5", "2e3", "٣", "²", "1_000"])
def test_anything_else_says_what_is_wanted(text: str) -> None:
    with pytest.raises(UsageError) as err:
        whole_number("--count", 1)(text)
    assert err.value.message == f"--count {text!r} is not a whole number."
    assert err.value.hint == "Give --count a number such as 1."


def test_below_the_least_value_is_refused() -> None:
    with pytest.raises(UsageError, match=r"^--tail must be 1 or more, not 0\.$"):
        whole_number("--tail", 1)("0")


# --- money and prices: commas, Chinese forms, the configured currency -------------------------


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("2,10/h", 2_100_000),
        ("1,5", 1_500_000),
        ("1,200", 1_200_000_000),
        ("12,345,678.5", 12_345_678_500_000),
        ("2.10/h", 2_100_000),
        ("$0.035/min", 2_100_000),
        ("48/day", 2_000_000),
    ],
)
def test_commas_and_units_in_usd(text: str, micros: int) -> None:
    assert parse_price(text, "USD") == micros


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("1.98元/小时", 1_980_000),
        ("¥1.98/h", 1_980_000),
        ("￥2", 2_000_000),
        ("2元/时", 2_000_000),
        ("3/小时", 3_000_000),
        ("0.03元/分钟", 1_800_000),
        ("0.03/分", 1_800_000),
        ("48元/天", 2_000_000),
        ("48/日", 2_000_000),
        ("\u30001.98\u3000元/小时", 1_980_000),
        ("\uff11.\uff19\uff18元\uff0f小时", 1_980_000),
        ("2,5元/小时", 2_500_000),
    ],
)
def test_what_a_chinese_user_types(text: str, micros: int) -> None:
    assert parse_price(text, "CNY") == micros


@pytest.mark.parametrize("text", ["2,1000", "1,2,3", "1,234,56"])
def test_an_ambiguous_comma_is_refused_showing_the_forms(text: str) -> None:
    with pytest.raises(UsageError, match="ambiguous") as err:
        parse_money(text, "USD")
    assert "1,200" in err.value.message
    assert "2,10" in err.value.message


@pytest.mark.parametrize(
    ("text", "currency", "named"),
    [
        ("$1.98/h", "CNY", "dollars"),
        ("¥2/h", "USD", "CNY or JPY"),
        ("2元/小时", "USD", "CNY"),
        ("2.10 EUR/h", "USD", "EUR"),
    ],
)
def test_a_price_in_another_currency_is_refused(text: str, currency: str, named: str) -> None:
    with pytest.raises(UsageError, match=f"is in {named}") as err:
        parse_price(text, currency)
    assert f"amounts here are in {currency}" in err.value.message
    assert (err.value.hint or "").startswith(f"Give it in {currency}")


def test_money_in_another_currency_is_refused() -> None:
    with pytest.raises(UsageError, match="is in CNY"):
        parse_money("500元", "USD")
    assert parse_money("500元", "CNY") == 500_000_000
    assert parse_money("$500", "USD") == 500_000_000


@pytest.mark.parametrize(
    ("text", "delta"),
    [
        ("2小时", timedelta(hours=2)),
        ("30分钟", timedelta(minutes=30)),
        ("1天", timedelta(days=1)),
        ("1小时30分钟", timedelta(hours=1, minutes=30)),
        ("1.5小时", timedelta(hours=1, minutes=30)),
        ("1小时\u300030分钟", timedelta(hours=1, minutes=30)),
        ("90m", timedelta(minutes=90)),
        ("2天3小时", timedelta(days=2, hours=3)),
        ("2天 3小时", timedelta(days=2, hours=3)),
        ("1天2小时30分钟15秒", timedelta(days=1, hours=2, minutes=30, seconds=15)),
        ("2时", timedelta(hours=2)),
        ("3个小时", timedelta(hours=3)),
        ("45分", timedelta(minutes=45)),
        ("90秒", timedelta(seconds=90)),
        ("30秒钟", timedelta(seconds=30)),
        ("1日", timedelta(days=1)),
        ("2h30分钟", timedelta(hours=2, minutes=30)),
        ("\uff11.\uff15小时", timedelta(hours=1, minutes=30)),
    ],
)
def test_durations_in_chinese(text: str, delta: timedelta) -> None:
    assert parse_duration(text) == delta


@pytest.mark.parametrize("text", ["小时", "2周", "-2小时", "半", "个半小时", "2小时半半"])
def test_a_chinese_duration_it_cannot_read_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="is not a duration"):
        parse_duration(text)


def test_a_bad_duration_shows_the_chinese_forms_too() -> None:
    with pytest.raises(UsageError) as err:
        parse_duration("两周")
    assert "2小时" in (err.value.hint or "")
