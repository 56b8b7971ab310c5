"""The Compshare stand-in bills Postpay by the hour on its own clock, each hour in full as it
begins: Running stretches at ``InstancePrice``, Stopped ones at the powered-off disks' prices,
nothing once terminated; the bot's client drives it through a two-step release."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.providers.compshare import CompshareProvider
from tests.fixtures.providers import CompshareStandIn

pytestmark = pytest.mark.integration

T0 = datetime(2027, 3, 1, 10, 0, 0)


@pytest.fixture
def provider(compshare_provider: CompshareProvider) -> CompshareProvider:
    return compshare_provider


def test_a_running_instance_bills_each_hour_as_it_begins(compshare_cloud: CompshareStandIn):
    compshare_cloud.now = T0
    uid = compshare_cloud.add(price=1.98)
    assert compshare_cloud.bill(uid, T0, T0) == 0
    compshare_cloud.now = T0 + timedelta(seconds=1)
    assert compshare_cloud.bill(uid, T0, compshare_cloud.now) == pytest.approx(1.98)
    compshare_cloud.now = T0 + timedelta(hours=2, minutes=5)
    assert compshare_cloud.bill(uid, T0, compshare_cloud.now) == pytest.approx(3 * 1.98)
    # A window takes the hours that begin in it; the clock bounds it.
    assert compshare_cloud.bill(uid, T0 + timedelta(minutes=30), T0 + timedelta(hours=9)) == (
        pytest.approx(2 * 1.98)
    )


def test_a_stop_ends_the_compute_bill_and_the_stopped_disks_bill_until_terminated(
    provider: CompshareProvider, compshare_cloud: CompshareStandIn
):
    compshare_cloud.now = T0
    uid = compshare_cloud.add(price=1.98)
    compshare_cloud.now = T0 + timedelta(minutes=70)
    first = provider.release(uid, "stop")
    assert (first.confirmed, first.state) == (True, "stopped")
    assert [state for _, _, state in compshare_cloud.history[uid]] == ["running", "stopped"]
    compshare_cloud.now = T0 + timedelta(minutes=200)
    second = provider.release(uid, "terminate")
    assert (second.confirmed, second.state) == (True, "terminated")
    assert uid in compshare_cloud.gone
    assert uid not in compshare_cloud.instances
    # Two hours of compute (0:00-1:10), then the system disk at 0.05 an hour for the three
    # hours that began while it stood stopped (1:10-3:20); nothing after.
    compshare_cloud.now = T0 + timedelta(days=1)
    assert compshare_cloud.bill(uid, T0, compshare_cloud.now) == pytest.approx(2 * 1.98 + 3 * 0.05)


def test_a_stopped_instance_without_powered_off_billing_bills_nothing(
    compshare_cloud: CompshareStandIn,
):
    compshare_cloud.powered_off_billing = []
    compshare_cloud.now = T0
    uid = compshare_cloud.add(price=0.45)
    compshare_cloud.now = T0 + timedelta(minutes=10)
    compshare_cloud.stop_outside(uid)
    compshare_cloud.now = T0 + timedelta(hours=5)
    compshare_cloud.start_outside(uid)
    compshare_cloud.now = T0 + timedelta(hours=5, minutes=1)
    # One hour before the stop, one for the run started again; none while stopped.
    assert compshare_cloud.bill(uid, T0, compshare_cloud.now) == pytest.approx(2 * 0.45)


def test_terminated_in_the_console_it_bills_what_it_ran(compshare_cloud: CompshareStandIn):
    compshare_cloud.now = T0
    uid = compshare_cloud.add(price=3.6)
    compshare_cloud.now = T0 + timedelta(minutes=61)
    compshare_cloud.terminate_outside(uid)
    compshare_cloud.now = T0 + timedelta(hours=8)
    assert compshare_cloud.bill(uid, T0, compshare_cloud.now) == pytest.approx(2 * 3.6)


def test_a_locked_instance_answers_operation_in_progress_and_throttling_is_disarmed(
    compshare_cloud: CompshareStandIn,
):
    uid = compshare_cloud.add()
    compshare_cloud.lock_instance(uid, True)
    assert (
        compshare_cloud._stop(
            "StopCompShareInstance", {"UHostId": uid, "Region": "cn-wlcb", "Zone": "cn-wlcb-01"}
        ).body["Message"]
        == "InstanceOperationInProgress"
    )
    compshare_cloud.lock_instance(uid, False)
    compshare_cloud.retcode_next(153, "Request too frequently")
    compshare_cloud.disarm()
    assert compshare_cloud.refusals == []


def test_without_a_clock_set_it_keeps_the_documented_create_time(
    compshare_cloud: CompshareStandIn,
):
    uid = compshare_cloud.add()
    assert compshare_cloud.instances[uid]["CreateTime"] == 1796209200
    assert abs(compshare_cloud.now - datetime.now(UTC).replace(tzinfo=None)) < timedelta(minutes=1)
