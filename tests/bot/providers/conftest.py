"""Fixtures the provider tests share."""

from __future__ import annotations

import pytest

from bot.providers import compshare
from bot.providers.compshare import CompshareProvider
from bot.providers.registry import ProviderRegistry
from bot.settings import Settings
from tests.fixtures.providers import COMPSHARE_PRIVATE_KEY, CompshareStandIn


@pytest.fixture(autouse=True)
def _compshare_looks_without_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in's instances move on at each look, so the bot's looks after a Stop need no
    real pause between them here."""
    monkeypatch.setattr(compshare, "STOP_LOOK_S", 0.0)


@pytest.fixture
def compshare_provider(compshare_cloud: CompshareStandIn) -> CompshareProvider:
    """The bot's Compshare client as its settings build it, pointed at the stand-in."""
    found = ProviderRegistry.from_settings(
        Settings(
            compshare_api_url=compshare_cloud.url,
            compshare_public_key=compshare_cloud.api_key,
            compshare_private_key=COMPSHARE_PRIVATE_KEY,
        )
    ).get("compshare")
    assert isinstance(found, CompshareProvider)
    return found
