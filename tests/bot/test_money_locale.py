"""Money as the active language writes it (Babel): the currency's symbol or code, its decimals,
the locale's grouping, and (in English) 4 decimals for amounts under 0.10."""

from __future__ import annotations

import pytest

from bot import values
from bot.i18n import set_default_language, speaking
from bot.values import format_money

UNIT = 1_000_000


@pytest.mark.parametrize(
    ("micros", "currency", "shown"),
    [
        (2_100_000, "USD", "$2.10"),
        (2_100_000, "EUR", "€2.10"),
        (2_100_000, "GBP", "£2.10"),
        (2_100_000, "CHF", "2.10 CHF"),
        (1_980_000, "CNY", "1.98 CNY"),
        (1_200 * UNIT, "JPY", "1,200 JPY"),
        (1_234_567_890_000, "USD", "$1,234,567.89"),
        (35_000, "USD", "$0.0350"),
        (-2_100_000, "USD", "-$2.10"),
        (0, "USD", "$0.00"),
        (100_000, "USD", "$0.10"),
        (99_999, "EUR", "€0.1000"),
    ],
)
def test_english_keeps_its_forms(micros: int, currency: str, shown: str) -> None:
    assert format_money(micros, currency) == shown


@pytest.mark.parametrize(
    ("micros", "currency", "shown"),
    [
        (12_500_000, "CNY", "¥12.50"),
        (1_234_567_890_000, "CNY", "¥1,234,567.89"),
        (35_000, "CNY", "¥0.04"),
        (-3_960_000, "CNY", "-¥3.96"),
        (2_100_000, "USD", "US$2.10"),
        (2_100_000, "EUR", "€2.10"),
        (1_200 * UNIT, "JPY", "JP¥1,200"),
        (2_100_000, "CHF", "2.10 CHF"),
    ],
)
def test_chinese_writes_money_as_chinese_readers_do(micros: int, currency: str, shown: str) -> None:
    with speaking("zh"):
        assert format_money(micros, currency) == shown


def test_yen_have_no_decimals_and_a_half_rounds_to_even() -> None:
    assert format_money(1_234_500_000, "JPY") == "1,234 JPY"
    assert format_money(1_235_500_000, "JPY") == "1,236 JPY"
    with speaking("zh"):
        assert format_money(500 * UNIT, "JPY") == "JP¥500"


def test_outside_a_block_the_workspace_language_writes_it() -> None:
    set_default_language("zh")
    try:
        assert format_money(12_500_000, "CNY") == "¥12.50"
        with speaking("en"):
            assert format_money(12_500_000, "CNY") == "12.50 CNY"
    finally:
        set_default_language("en")
    assert format_money(12_500_000, "CNY") == "12.50 CNY"


def test_the_locale_is_read_once_per_currency_language_and_decimals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Money is written in every line of a message and of the Home tab: the currency's symbol
    and the locale's pattern are looked up in Babel once, not for each amount."""
    calls: list[str] = []
    real = values.get_currency_symbol

    def counted(code: str, locale: str) -> str:
        calls.append(code)
        return real(code, locale)

    monkeypatch.setattr(values, "get_currency_symbol", counted)
    values._money_pattern.cache_clear()
    shown = [format_money(n * UNIT, "EUR") for n in range(1, 50)]
    with speaking("zh"):
        shown_zh = [format_money(n * UNIT, "EUR") for n in range(1, 50)]
    assert shown[1] == "€2.00"
    assert shown_zh[1] == "€2.00"
    assert calls == ["EUR", "EUR"]  # once in English, once in Chinese
