"""Vast.ai beyond the shared contract: the paged instance list (against its stand-in)."""

from __future__ import annotations

import pytest

from bot.errors import ProviderError
from bot.providers import vast
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


def test_the_disk_and_its_price_come_from_the_instance_document():
    # Vast's show-instance example: 10 GB, storage_total_cost 0.002074 $/h, dph_total 1.002074.
    seen = vast._instance(
        {
            "id": 883,
            "actual_status": "running",
            "dph_base": 1,
            "dph_total": 1.0020740740740741,
            "disk_space": 10,
            "storage_cost": 0.14933333333333335,
            "storage_total_cost": 0.002074074074074074,
        }
    )
    assert seen.disk_gb == 10
    assert seen.price_micros_per_hour == 1_000_000
    # Per 730-hour GB-month, so the bot's hourly storage is Vast's 0.002074 $/h.
    assert seen.storage_micros_per_gb_month == 151_407
    assert abs(seen.storage_micros_per_gb_month * 10 / 730 - 2074.07) < 1


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"disk_space": 10},
        {"storage_total_cost": 0.002},
        {"disk_space": 0, "storage_total_cost": 0.002},
        {"disk_space": True, "storage_total_cost": 0.002},
        {"disk_space": 10, "storage_total_cost": -1},
        {"disk_space": 10, "storage_total_cost": "0.002"},
    ],
)
def test_without_a_disk_price_the_price_stays_the_total(fields):
    seen = vast._instance({"id": 1, "actual_status": "running", "dph_total": 0.5, **fields})
    assert seen.storage_micros_per_gb_month is None
    assert seen.price_micros_per_hour == 500_000


def test_a_stopped_instance_carries_its_stopped_disk_price(provider, vast_cloud: VastStandIn):
    vid = vast_cloud.add()
    vast_cloud.stop_outside(vid, storage_cost=0.2)
    seen = provider.get(vid)
    assert seen.state == "stopped"
    assert seen.storage_micros_per_gb_month == round(86.4 * 0.2 / 720 / 86.4 * 730 * 1_000_000)
