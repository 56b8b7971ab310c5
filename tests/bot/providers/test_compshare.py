"""Compshare beyond the shared contract: UCloud's signature, paging, the two-step terminate
(in one call, or two when the stop is slow),
refusals by RetCode, and prices in CNY (against the stand-in written from its documents)."""

from __future__ import annotations

from datetime import datetime

import pytest

from bot.errors import (
    ConfigError,
    ProviderAuthError,
    ProviderError,
    ProviderNotFound,
    ProviderRateLimited,
)
from bot.providers import compshare
from bot.providers.compshare import (
    STOP_LOOKS,
    CompshareAccountError,
    CompshareProvider,
    flatten,
    signature,
)
from bot.providers.registry import ProviderRegistry, platform_billing
from bot.settings import Settings
from tests.fixtures.providers import COMPSHARE_PRIVATE_KEY, CompshareStandIn

pytestmark = pytest.mark.integration


@pytest.fixture
def provider(compshare_provider: CompshareProvider) -> CompshareProvider:
    return compshare_provider


def test_the_signature_matches_ucloud_s_worked_example():
    # UCloud's signature document: these parameters and keys sign to this digest.
    params = {
        "Action": "DescribeUHostInstance",
        "Region": "cn-bj2",
        "Limit": 10,
        "PublicKey": "ucloudsomeone@example.com1296235120854146120",
    }
    private_key = "46f09bb9fab4f12dfc160dae12273d5332b5debe"
    assert signature(params, private_key) == "cba5cf5ec4d4233d206b1b54951e3787350a642f"
    assert signature({**params, "Signature": "ignored"}, private_key) == signature(
        params, private_key
    )


def test_lists_become_numbered_parameters():
    assert flatten({"UHostIds": ["a", "b"], "Limit": 1, "Zone": None}) == {
        "UHostIds.0": "a",
        "UHostIds.1": "b",
        "Limit": 1,
    }


def test_a_wrong_private_key_is_an_auth_error(compshare_cloud: CompshareStandIn):
    wrong = ProviderRegistry.from_settings(
        Settings(
            compshare_api_url=compshare_cloud.url,
            compshare_public_key=compshare_cloud.api_key,
            compshare_private_key="not-the-key",
        )
    ).get("compshare")
    with pytest.raises(ProviderAuthError, match="RetCode 171") as caught:
        wrong.list_instances()
    assert "GPUBOT_COMPSHARE_PRIVATE_KEY" in caught.value.hint
    assert "not-the-key" not in caught.value.user_text()


def test_the_list_is_read_page_by_page(provider, compshare_cloud: CompshareStandIn):
    ids = {compshare_cloud.add() for _ in range(230)}
    listed = provider.list_instances()
    assert {i.provider_id for i in listed} == ids
    assert len(listed) == 230
    assert len(compshare_cloud.answered_to("POST", "DescribeCompShareInstance")) == 3


def test_an_empty_account_lists_nothing(provider):
    assert provider.list_instances() == []


def test_what_an_instance_says(provider, compshare_cloud: CompshareStandIn):
    uid = compshare_cloud.add()
    monthly = compshare_cloud.add(charge_type="Month")
    got = provider.get(uid)
    assert (got.host, got.ssh_port) == (compshare_cloud.ssh_host, compshare_cloud.ssh_port)
    assert (got.gpu_model, got.gpu_count) == ("4090", 2)
    assert (got.price_micros_per_hour, got.currency) == (3_960_000, "CNY")
    assert got.launched_at is not None
    assert got.launched_at.isoformat() == "2026-12-02T11:00:00"
    assert dict(got.tags) == {"name": "trainer", "tag": "Default", "remark": "lab-a"}
    # A monthly instance's InstancePrice is not an hourly price.
    assert provider.get(monthly).price_micros_per_hour is None


def test_terminate_stops_first_and_deletes_the_disks(provider, compshare_cloud: CompshareStandIn):
    uid = compshare_cloud.add()
    outcome = provider.release(uid, "terminate")
    # Stopped, looked at until Stopped, and terminated in the one call.
    assert (outcome.confirmed, outcome.state) == (True, "terminated")
    assert not outcome.already_gone
    assert uid not in compshare_cloud.instances
    assert compshare_cloud.released_disks == {uid: True}
    actions = [p.rsplit("/", 1)[-1] for m, p, s in compshare_cloud.answered]
    assert actions == [
        "DescribeCompShareInstance",
        "StopCompShareInstance",
        "DescribeCompShareInstance",  # Stopping
        "DescribeCompShareInstance",  # Stopped
        "TerminateCompShareInstance",
    ]


def test_a_slow_stop_is_waited_for_boundedly_then_left_for_the_next_call(
    compshare_cloud: CompshareStandIn, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(compshare, "STOP_LOOK_S", 2.0)  # as deployed
    pauses: list[float] = []

    def slow_stop(seconds: float) -> None:  # the instance is still Stopping at every look
        pauses.append(seconds)
        with compshare_cloud.lock:
            compshare_cloud.instances[uid]["State"] = "Stopping"

    settings = Settings(
        compshare_api_url=compshare_cloud.url,
        compshare_public_key=compshare_cloud.api_key,
        compshare_private_key=COMPSHARE_PRIVATE_KEY,
    )
    provider = CompshareProvider(CompshareProvider.from_settings(settings).api, pause=slow_stop)
    uid = compshare_cloud.add()
    first = provider.release(uid, "terminate")
    assert (first.confirmed, first.state) == (False, "terminating")
    assert "only once it is stopped" in first.detail
    assert pauses == [2.0] * (STOP_LOOKS - 1)  # at most 6 s of waiting in the call
    assert uid in compshare_cloud.instances
    # The release engine's next attempt finds it Stopped and terminates it.
    second = provider.release(uid, "terminate")
    assert (second.confirmed, second.state) == (True, "terminated")
    actions = [p.rsplit("/", 1)[-1] for m, p, s in compshare_cloud.answered]
    assert actions.count("StopCompShareInstance") == 1
    assert actions.count("TerminateCompShareInstance") == 1


def test_an_operation_under_way_is_not_an_error(provider, compshare_cloud: CompshareStandIn):
    uid = compshare_cloud.add()
    with compshare_cloud.lock:
        compshare_cloud.instances[uid]["State"] = "Starting"  # someone started it meanwhile
    # The start ends as the bot looks; the stop follows and is looked at until it is done.
    outcome = provider.release(uid, "stop")
    assert (outcome.confirmed, outcome.state) == (True, "stopped")


def test_a_terminate_refused_while_the_instance_is_locked_changes_nothing(
    provider, compshare_cloud: CompshareStandIn
):
    uid = compshare_cloud.add()
    assert provider.release(uid, "stop").confirmed
    compshare_cloud.lock_instance(uid, True)
    with pytest.raises(ProviderError, match="InstanceOperationInProgress") as caught:
        provider.release(uid, "terminate")
    assert caught.value.retryable
    assert compshare_cloud.instances[uid]["State"] == "Stopped"
    compshare_cloud.lock_instance(uid, False)
    assert provider.release(uid, "terminate").confirmed


def test_a_refusal_that_changed_nothing_is_raised(provider, compshare_cloud: CompshareStandIn):
    uid = compshare_cloud.add(state="Install Fail")
    with pytest.raises(ProviderError, match="Running") as caught:
        provider.release(uid, "stop")
    assert caught.value.retryable  # a service's own refusal may pass: UCloud's SDK retries those
    assert compshare_cloud.instances[uid]["State"] == "Install Fail"


@pytest.mark.parametrize(
    ("code", "error", "retryable"),
    [(153, ProviderRateLimited, True), (150, ProviderError, True), (292, ProviderError, False)],
)
def test_refusals_by_retcode(provider, compshare_cloud: CompshareStandIn, code, error, retryable):
    compshare_cloud.retcode_next(code, "no")
    with pytest.raises(error, match=f"RetCode {code}") as caught:
        provider.list_instances()
    assert caught.value.retryable is retryable
    assert provider.list_instances() == []  # the next call goes through


@pytest.mark.parametrize("code", [226601, 226606])
def test_account_refusals_are_never_retried(provider, compshare_cloud: CompshareStandIn, code):
    uid = compshare_cloud.add()
    compshare_cloud.retcode_next(code, "账户异常", times=5)
    with pytest.raises(CompshareAccountError, match=f"RetCode {code}") as caught:
        provider.release(uid, "terminate")
    assert caught.value.retryable is False
    assert "Retrying will not help" in caught.value.user_text()
    assert compshare_cloud.instances[uid]["State"] == "Running"


def test_an_account_refusal_reads_in_chinese():
    from bot.i18n import language_of, speaking

    with speaking(language_of("zh")):
        error = _refusal(226606)
    assert "实名认证" in error.user_text()
    assert "RetCode 226606" in error.user_text()


def _refusal(code: int) -> ProviderError:
    from bot.providers.compshare import _checked

    try:
        _checked("DescribeCompShareInstance", {"RetCode": code, "Message": "no"})
    except ProviderError as exc:
        return exc
    raise AssertionError("not refused")


@pytest.mark.integration
def test_through_the_release_service_arrears_escalate_at_once(db, provider, compshare_cloud):
    from bot.services.instances import releases
    from tests.bot.services.support import Clock, add_instance, make_runtime

    rt = make_runtime(db, Clock(), providers=[provider])
    uid = compshare_cloud.add()
    iid = add_instance(rt.db, provider="compshare", provider_instance_id=uid)
    rel = releases.request_release(rt, iid, reason="deadline", requested_by="gpubot")
    compshare_cloud.retcode_next(226601, "欠费", times=10)
    after = releases.process_release(rt, rel.id)
    assert (after.state, after.attempts) == ("escalated", 1)
    assert "226601" in (after.last_error or "")
    assert len(rt.notifier.containing("failed 1 times")) == 2  # the owner and the ops channel
    assert uid in compshare_cloud.instances


def test_every_region_is_listed_and_acted_on_in_its_own(provider, compshare_cloud):
    here = compshare_cloud.add()
    there = compshare_cloud.add(region="cn-sh2", zone="cn-sh2-02", lists_region=False)
    assert {i.provider_id for i in provider.list_instances()} == {here, there}
    describes = [b for _, _, b in compshare_cloud.calls_to("POST")]
    assert all("Region" not in b for b in describes)
    provider.release(there, "stop")
    assert compshare_cloud.instances[there]["State"] == "Stopped"
    assert compshare_cloud.instances[here]["State"] == "Running"


def test_a_stopped_instance_reports_the_disk_still_billed_its_price_and_release_time(
    provider, compshare_cloud
):
    uid = compshare_cloud.add(state="Stopped")
    seen = provider.get(uid)
    # Only the system disk is listed as billed powered off: 100 of the 300 GB.
    assert seen.disk_gb == 100.0
    # 0.05 CNY an hour for 100 GB: 0.05 * 730 / 100 = 0.365 CNY per GB-month.
    assert seen.storage_micros_per_gb_month == 365_000
    assert seen.currency == "CNY"
    assert seen.platform_release_at == datetime(2026, 12, 9, 11, 0)
    running = provider.get(compshare_cloud.add())
    assert (running.disk_gb, running.storage_micros_per_gb_month) == (None, None)
    assert running.platform_release_at is None


def test_both_disks_billed_powered_off_are_summed(provider, compshare_cloud):
    compshare_cloud.powered_off_billing = [
        {"ChargeType": "Postpay", "IsBoot": True, "Price": 0.05},
        {"ChargeType": "Postpay", "IsBoot": False, "Price": 0.1},
    ]
    seen = provider.get(compshare_cloud.add(state="Stopped"))
    assert seen.disk_gb == 300.0
    assert seen.storage_micros_per_gb_month == 365_000  # 0.15 * 730 / 300


@pytest.mark.parametrize(
    "entry",
    [
        {"ChargeType": "Postpay", "IsBoot": True, "Price": "0.05"},
        {"ChargeType": "Postpay", "IsBoot": True},
        {"ChargeType": "Month", "IsBoot": True, "Price": 36.5},
        {"ChargeType": "Postpay", "IsBoot": True, "Price": -1},
    ],
)
def test_a_disk_price_that_cannot_be_read_as_hourly_gives_no_storage_price(
    provider, compshare_cloud, entry
):
    compshare_cloud.powered_off_billing = [entry]
    seen = provider.get(compshare_cloud.add(state="Stopped"))
    assert seen.disk_gb == 100.0
    assert seen.storage_micros_per_gb_month is None


def test_terminate_is_confirmed_by_its_own_answer_even_into_the_recycle_bin(
    provider, compshare_cloud
):
    compshare_cloud.in_recycle = True
    uid = compshare_cloud.add(state="Stopped")
    outcome = provider.release(uid, "terminate")
    assert (outcome.confirmed, outcome.state, outcome.detail) == (
        True,
        "terminated",
        "InRecycle=Yes",
    )


def test_a_catch_all_404_is_an_unknown_outcome(provider, compshare_cloud):
    uid = compshare_cloud.add()
    compshare_cloud.catch_all(404)
    with pytest.raises(ProviderError) as caught:
        provider.release(uid, "terminate")
    assert not isinstance(caught.value, ProviderNotFound)
    assert uid in compshare_cloud.instances


def test_the_billing_increment_is_a_setting():
    assert Settings().compshare_billing == "hour"  # the unverified, never-lower default
    assert Settings(compshare_billing="SECOND").compshare_billing == "second"
    by_second = ProviderRegistry.from_settings(
        Settings(compshare_public_key="k", compshare_private_key="p", compshare_billing="second")
    ).get("compshare")
    assert by_second.capabilities.billing.increment == "second"
    # Billing reads the documented default for what a registration did not store.
    assert platform_billing("compshare").increment == "hour"
    assert not platform_billing("compshare").verified
    with pytest.raises(ConfigError):
        Settings(compshare_billing="minute")
