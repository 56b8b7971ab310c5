"""Fixtures the provider tests share."""

from __future__ import annotations

import pytest

from bot.providers.compshare import CompshareProvider
from bot.providers.registry import ProviderRegistry
from bot.settings import Settings
from tests.fixtures.providers import COMPSHARE_PRIVATE_KEY, CompshareStandIn


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
