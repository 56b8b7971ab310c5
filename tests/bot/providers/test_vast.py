"""Vast.ai beyond the shared contract: the paged instance list (against its stand-in)."""

from __future__ import annotations

import pytest

from bot.errors import ProviderError
from bot.providers.registry import ProviderRegistry
from bot.providers.vast import PAGE_LIMIT, VastProvider
from bot.settings import Settings
from tests.fixtures.providers import Answer, VastStandIn

pytestmark = pytest.mark.integration


@pytest.fixture
def provider(vast_cloud: VastStandIn) -> VastProvider:
    found = ProviderRegistry.from_settings(
        Settings(vast_api_url=vast_cloud.url, vast_api_key=vast_cloud.api_key)
    ).get("vast")
    assert isinstance(found, VastProvider)
    return found


def test_every_page_is_read(provider, vast_cloud: VastStandIn):
    ids = {vast_cloud.add() for _ in range(2 * PAGE_LIMIT + 3)}
    assert {i.provider_id for i in provider.list_instances()} == ids
    pages = vast_cloud.calls_to("GET", "/api/v1/instances/")
    assert len(pages) == 3
    assert "next_token" not in pages[0][1]
    assert "next_token" in pages[2][1]


def test_a_list_whose_pages_never_end_is_refused(provider, vast_cloud: VastStandIn):
    vast_cloud.add()

    def same_page_again(query):
        return Answer(200, {"success": True, "instances": [], "next_token": "eyJsb29wIjogMX0="})

    vast_cloud._page = same_page_again  # type: ignore[method-assign]
    with pytest.raises(ProviderError, match="repeats a page token") as caught:
        provider.list_instances()
    assert caught.value.retryable
    assert len(vast_cloud.calls_to("GET", "/api/v1/instances/")) == 2
