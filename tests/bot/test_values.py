"""bot.values.whole_number: counts people type, checked with a clear message."""

from __future__ import annotations

import pytest

from bot.errors import UsageError
from bot.values import whole_number


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
