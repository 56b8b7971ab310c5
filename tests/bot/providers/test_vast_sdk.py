"""The Vast.ai stand-in judged by Vast's official SDK (``vastai`` on PyPI, installed without its
pinned dependencies by `make`): the SDK and gpubot read the same account from it alike. A
stand-in only gpubot could talk to would prove nothing."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from bot.providers.registry import ProviderRegistry
from bot.providers.vast import PAGE_LIMIT, VastProvider
from bot.settings import Settings
from tests.fixtures.providers import VastStandIn

vastai = pytest.importorskip("vastai", reason="the official Vast.ai SDK (make installs it)")

pytestmark = pytest.mark.integration


@pytest.fixture
def sdk(vast_cloud: VastStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("VAST_LOG_LEVEL", "error")
    return vastai.VastAI(api_key=vast_cloud.api_key, server_url=vast_cloud.url, retry=1)


@pytest.fixture
def provider(vast_cloud: VastStandIn) -> VastProvider:
    found = ProviderRegistry.from_settings(
        Settings(vast_api_url=vast_cloud.url, vast_api_key=vast_cloud.api_key)
    ).get("vast")
    assert isinstance(found, VastProvider)
    return found


def test_sixty_instances_list_alike_through_the_sdk_and_gpubot(sdk, provider, vast_cloud):
    ids = {vast_cloud.add() for _ in range(60)}

    through_sdk = sdk.show_instances()
    pages = len(vast_cloud.calls_to("GET", "/api/v1/instances/"))
    through_gpubot = provider.list_instances()

    assert {str(row["id"]) for row in through_sdk} == ids
    assert {i.provider_id for i in through_gpubot} == ids
    assert pages == -(-60 // PAGE_LIMIT)  # the SDK paged through with after_token
    by_id = {str(row["id"]): row for row in through_sdk}
    for seen in through_gpubot:
        assert by_id[seen.provider_id]["actual_status"] == seen.raw_state


def test_a_token_sent_under_another_name_gets_the_first_page_again(vast_cloud):
    for _ in range(PAGE_LIMIT + 1):
        vast_cloud.add()
    first = vast_cloud.handle("GET", "/api/v1/instances/?limit=25", _headers(vast_cloud), None)
    token = first.body["next_token"]
    again = vast_cloud.handle(
        "GET", f"/api/v1/instances/?limit=25&next_token={token}", _headers(vast_cloud), None
    )
    assert again.body["instances"] == first.body["instances"]


def test_what_the_sdk_stops_and_destroys_gpubot_sees(sdk, provider, vast_cloud):
    stopped, destroyed = vast_cloud.add(), vast_cloud.add()

    sdk.stop_instance(int(stopped))
    sdk.destroy_instance(int(destroyed))

    assert provider.get(stopped).state == "stopped"
    assert sdk.show_instance(int(destroyed)) is None
    outcome = provider.release(destroyed, "terminate")
    assert (outcome.confirmed, outcome.already_gone) == (True, True)


def test_what_gpubot_destroys_the_sdk_no_longer_shows(sdk, provider, vast_cloud):
    vid = vast_cloud.add()
    assert sdk.show_instance(int(vid))["id"] == int(vid)

    provider.release(vid, "terminate")

    assert sdk.show_instance(int(vid)) is None


def _headers(standin: VastStandIn) -> dict[str, str]:
    return {"authorization": f"Bearer {standin.api_key}", "user-agent": "test"}


def test_the_sdks_charges_call_reads_what_gpubot_reads(sdk, provider, vast_cloud):
    day = 1796169600  # 2026-12-02 00:00 UTC
    vid = vast_cloud.add()
    vast_cloud.charge(vid, amount=2.5, day=day)

    through_sdk = sdk.show_invoices_v1(
        charges=True, start_date=day - 86400, end_date=day + 86400, charge_type=["instance"]
    )
    through_gpubot = provider.instance_charges(datetime(2026, 12, 1), datetime(2026, 12, 3))

    assert [(row["source"], row["amount"]) for row in through_sdk["results"]] == [
        (f"instance-{vid}", 2.5)
    ]
    assert [(c.instance_id, c.amount_micros) for c in through_gpubot] == [(vid, 2_500_000)]
