"""Contract with Compshare's official SDK (``ucloud-sdk-python3``, client ``ucompshare``): the
stand-in accepts the SDK's own signed, form-encoded requests and the SDK accepts its answers,
and gpubot, against the same stand-in, agrees with what the SDK sees."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from bot.errors import ProviderError
from bot.providers.compshare import CompshareProvider
from tests.fixtures.providers import COMPSHARE_PRIVATE_KEY, CompshareStandIn

ucloud_client = pytest.importorskip("ucloud.client")
ucloud_exc = pytest.importorskip("ucloud.core.exc")

pytestmark = pytest.mark.integration


def _sdk(cloud: CompshareStandIn, region: str = "cn-wlcb", private_key: str = "") -> Any:
    client = ucloud_client.Client(
        {
            "region": region,
            "base_url": cloud.url,
            "public_key": cloud.api_key,
            "private_key": private_key or COMPSHARE_PRIVATE_KEY,
            "max_retries": 0,
        },
        logger=logging.getLogger("tests.ucloud"),
    )
    return client.ucompshare()


@pytest.fixture
def provider(compshare_provider: CompshareProvider) -> CompshareProvider:
    return compshare_provider


def test_the_sdk_and_gpubot_list_the_same_instances(provider, compshare_cloud: CompshareStandIn):
    here = compshare_cloud.add()
    there = compshare_cloud.add(region="cn-sh2", zone="cn-sh2-02", lists_region=False)
    sdk = _sdk(compshare_cloud).describe_comp_share_instance({"Limit": 100})
    assert [item["UHostId"] for item in sdk["UHostSet"]] == [here]  # the SDK sends its Region
    sdk_there = _sdk(compshare_cloud, "cn-sh2").describe_comp_share_instance({"UHostIds": [there]})
    assert sdk_there["UHostSet"][0]["Zone"] == "cn-sh2-02"
    listed = {i.provider_id: i for i in provider.list_instances()}  # every region
    assert set(listed) == {here, there}
    assert listed[here].price_micros_per_hour == round(sdk["UHostSet"][0]["InstancePrice"] * 1e6)


def test_gpubot_sends_what_the_sdk_sends(provider, compshare_cloud: CompshareStandIn):
    uid = compshare_cloud.add()
    _sdk(compshare_cloud).describe_comp_share_instance({"UHostIds": [uid], "Limit": 1})
    provider.get(uid)
    sdk_body, ours = (body for _, _, body in compshare_cloud.calls_to("POST"))
    assert set(sdk_body) - {"Region"} == set(ours)
    assert "Region" not in ours  # every region


def test_the_sdk_stops_starts_and_terminates_and_gpubot_agrees(
    provider, compshare_cloud: CompshareStandIn
):
    uid = compshare_cloud.add(region="cn-sh2", zone="cn-sh2-02")
    sdk = _sdk(compshare_cloud, "cn-sh2")
    assert sdk.stop_comp_share_instance({"UHostId": uid, "Zone": "cn-sh2-02"})["UHostId"] == uid
    assert provider.get(uid).state == "stopping"
    assert provider.get(uid).state == "stopped"  # Stopped at the next look
    sdk.start_comp_share_instance({"UHostId": uid, "Zone": "cn-sh2-02"})
    assert [provider.get(uid).state, provider.get(uid).state] == ["pending", "running"]
    with pytest.raises(ucloud_exc.RetCodeException):  # only a Stopped instance terminates
        sdk.terminate_comp_share_instance({"UHostId": uid, "Zone": "cn-sh2-02"})
    compshare_cloud.stop_outside(uid)
    answer = sdk.terminate_comp_share_instance({"UHostId": uid, "Zone": "cn-sh2-02"})
    assert answer["UHostId"] == uid
    assert provider.release(uid, "terminate").already_gone


def test_gpubot_acts_in_the_instance_s_own_region(provider, compshare_cloud: CompshareStandIn):
    uid = compshare_cloud.add(region="cn-sh2", zone="cn-sh2-02", lists_region=False)
    assert (provider.release(uid, "stop").state, provider.release(uid, "stop").confirmed) == (
        "stopped",
        True,
    )
    stop = [b for _, _, b in compshare_cloud.calls_to("POST") if b["Action"].startswith("Stop")]
    assert (stop[0]["Region"], stop[0]["Zone"]) == ("cn-sh2", "cn-sh2-02")
    outcome = provider.release(uid, "terminate")
    assert (outcome.confirmed, outcome.state) == (True, "terminated")
    assert compshare_cloud.released_disks == {uid: True}
    assert _sdk(compshare_cloud, "cn-sh2").describe_comp_share_instance({})["UHostSet"] == []


@pytest.mark.parametrize("code", [226601, 226606, 153])
def test_retcode_refusals_reach_both_alike(provider, compshare_cloud: CompshareStandIn, code):
    compshare_cloud.retcode_next(code, "refused")
    with pytest.raises(ucloud_exc.RetCodeException) as sdk_error:
        _sdk(compshare_cloud).describe_comp_share_instance({})
    assert sdk_error.value.code == code
    compshare_cloud.retcode_next(code, "refused")
    with pytest.raises(ProviderError, match=f"RetCode {code}") as ours:
        provider.list_instances()
    assert ours.value.retryable is (code == 153)


def test_a_wrong_signature_is_refused_to_the_sdk(compshare_cloud: CompshareStandIn):
    with pytest.raises(ucloud_exc.RetCodeException) as caught:
        _sdk(compshare_cloud, private_key="not-the-key").describe_comp_share_instance({})
    assert caught.value.code == 171
