"""Vast.ai beyond the shared contract: the paged instance list (against its stand-in)."""

from __future__ import annotations

from datetime import datetime

import pytest

from bot.errors import ProviderError, ProviderRateLimited, ProviderUnknownOutcome
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
    assert "after_token" not in pages[0][1]
    assert "after_token" in pages[2][1]  # the official client's name for the cursor
    assert "next_token" not in pages[2][1]


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


def test_plain_text_429s_are_waited_out_not_hammered(vast_cloud: VastStandIn):
    waits: list[float] = []
    provider = VastProvider(
        ProviderRegistry.from_settings(
            Settings(vast_api_url=vast_cloud.url, vast_api_key=vast_cloud.api_key)
        )
        .get("vast")
        .api,  # type: ignore[attr-defined]
        sleep=waits.append,
    )
    vid = vast_cloud.add()
    vast_cloud.plain_429(times=2)

    outcome = provider.release(vid, "terminate")

    assert outcome.confirmed
    assert waits == [vast.RATE_LIMIT_WAITS_S[0], vast.RATE_LIMIT_WAITS_S[1], vast.CONFIRM_PAUSE_S]
    assert vast_cloud.answered_to("GET", vid)[:2] == [429, 429]


def test_a_rate_limit_that_does_not_end_is_raised(vast_cloud: VastStandIn):
    waits: list[float] = []
    provider = VastProvider(
        ProviderRegistry.from_settings(
            Settings(vast_api_url=vast_cloud.url, vast_api_key=vast_cloud.api_key)
        )
        .get("vast")
        .api,  # type: ignore[attr-defined]
        sleep=waits.append,
    )
    vast_cloud.plain_429(times=10)

    with pytest.raises(ProviderRateLimited):
        provider.list_instances()

    assert waits == list(vast.RATE_LIMIT_WAITS_S)
    assert len(vast_cloud.answered_to("GET", "/api/v1/instances/")) == 4


def test_a_catch_all_html_404_does_not_make_an_instance_gone(provider, vast_cloud: VastStandIn):
    vid = vast_cloud.add()
    vast_cloud.catch_all(404)

    with pytest.raises(ProviderUnknownOutcome):
        provider.release(vid, "terminate")

    vast_cloud.catch_all(None)
    assert provider.get(vid).state == "running"
    assert vid in vast_cloud.instances


def test_vasts_own_not_found_answer_confirms_the_release(provider, vast_cloud: VastStandIn):
    vid = vast_cloud.add()
    vast_cloud.terminate_outside(vid)

    outcome = provider.release(vid, "terminate")

    assert (outcome.confirmed, outcome.already_gone) == (True, True)
    assert vast_cloud.calls_to("DELETE") == []


def test_only_vasts_instances_null_document_is_not_found():
    assert vast.is_not_found({"instances": None})
    assert not vast.is_not_found({"success": False, "error": "server_error"})
    assert not vast.is_not_found({"instances": []})
    assert not vast.is_not_found("<html>404 page not found</html>")


def test_charges_are_read_per_instance_in_micros_across_pages(provider, vast_cloud: VastStandIn):
    day = 1796169600  # 2026-12-02 00:00 UTC
    for n in range(vast.CHARGES_PAGE_LIMIT + 5):
        vast_cloud.charge(str(1000 + n), amount=1.25, day=day)
    vast_cloud.charge("77", amount=3.0, day=day, kind="volume")
    vast_cloud.charge("1000", amount=9.0, day=day - 30 * 86400)  # outside the window

    found = provider.instance_charges(datetime(2026, 12, 1), datetime(2026, 12, 3))

    assert len(found) == vast.CHARGES_PAGE_LIMIT + 5
    assert found[0] == vast.VastCharge(
        instance_id="1000",
        amount_micros=1_250_000,
        start=datetime(2026, 12, 2),
        end=datetime(2026, 12, 2, 23, 59, 59),
        description="GPU and storage for instance 1000",
    )
    pages = vast_cloud.calls_to("GET", "/api/v0/charges/")
    assert len(pages) == 2
    assert "after_token" in pages[1][1]


def test_the_charges_of_days_end_where_the_period_ends(provider, vast_cloud: VastStandIn):
    """Vast's ``day`` filter takes a row whose day equals ``lte``, as the official client's
    ``--end-date`` does: a period that ends at midnight must not take the next day's row. The
    month before and this month to today, as `/gpu bills` reads them, each get their own days."""
    vast_cloud.bills_runs = True
    vast_cloud.now = datetime(2026, 11, 30, 0, 0)
    vid = vast_cloud.add(dph_base=1.0, disk_space=0.0)
    vast_cloud.now = datetime(2026, 12, 2, 12, 0)
    november = provider.charges(datetime(2026, 11, 1), datetime(2026, 12, 1))
    december = provider.charges(datetime(2026, 12, 1), datetime(2026, 12, 2))
    assert [(c.provider_id, c.total_micros) for c in november] == [(vid, 24_000_000)]
    assert [(c.provider_id, c.total_micros) for c in december] == [(vid, 24_000_000)]
