"""What the fleet, the providers, spend and budgets tell a person is Chinese for a Chinese
reader, with the names and values they need left in."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from bot.errors import GpubotError
from bot.i18n import speaking
from bot.providers.registry import ProviderRegistry
from bot.services.money import budgets, spend
from bot.settings import Settings
from tests.chinese import assert_chinese

NOW = datetime(2026, 12, 3, 12, 0)
UTC = ZoneInfo("UTC")


def _raised(call: object) -> GpubotError:
    assert callable(call)
    with speaking("zh"), pytest.raises(GpubotError) as info:
        call()
    return info.value


@pytest.mark.parametrize(
    ("call", "kept"),
    [
        (lambda: spend.parse_month_arg("march", NOW, UTC), "'march'"),
        (lambda: spend.parse_month_arg("2027-01", NOW, UTC), "2026-12"),
        (lambda: spend.parse_group("colour"), "'colour'"),
        (lambda: budgets.parse_scope("team"), "'team'"),
    ],
)
def test_spend_and_budget_errors_are_chinese(call: object, kept: str) -> None:
    error = _raised(call)
    assert_chinese(error.user_text())
    assert kept in error.user_text()


def test_an_unknown_provider_is_named_in_chinese(tmp_path: object) -> None:
    registry = ProviderRegistry.from_settings(Settings(data_dir=tmp_path))  # type: ignore[arg-type]
    error = _raised(lambda: registry.get("nosuchcloud"))
    assert_chinese(error.user_text())
    assert "nosuchcloud" in error.user_text()


def test_the_same_errors_stay_english_by_default() -> None:
    with pytest.raises(GpubotError, match="is not a month"):
        spend.parse_month_arg("march", NOW, UTC)
