"""Billing rules against hand-computed cases and the platforms' documented examples."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from bot.billing import (
    STORAGE_MONTH_S,
    BillingRules,
    ProviderBilling,
    billed_seconds,
    compute_cost,
    cost_breakdown,
    cost_so_far,
    egress_cost,
    elapsed_seconds,
    job_cost,
    parse_increment,
    projected_cost,
    rules_for,
    storage_cost,
)
from bot.errors import UsageError
from bot.providers.registry import platform_billing
from bot.store.models import Instance

T0 = datetime(2026, 3, 10, 10, 0, 0)
USD = 1_000_000


def _platform(instance: Instance) -> ProviderBilling:
    """The documented rules of the instance's platform, from its provider module."""
    return platform_billing(instance.provider)


def _instance(**fields: Any) -> Instance:
    base: dict[str, Any] = {
        "name": "box",
        "owner_id": "U1",
        "host": "10.0.0.1",
        "ssh_user": "ubuntu",
        "created_at": T0,
        "price_micros": 2 * USD,
    }
    base.update(fields)
    return Instance(**base)


def test_hourly_increment_bills_started_hours() -> None:
    """1h10m on a per-started-hour platform is billed as 2h."""
    rules = BillingRules(price_micros_per_hour=2 * USD, increment="hour")
    assert compute_cost(rules, T0, T0 + timedelta(hours=1, minutes=10)) == 4 * USD
    assert compute_cost(rules, T0, T0 + timedelta(hours=1)) == 2 * USD
    assert compute_cost(rules, T0, T0 + timedelta(seconds=1)) == 2 * USD


def test_minute_increment_rounds_up_to_the_minute() -> None:
    # $1.20/h is 2 cents a minute; 61 s is two started minutes.
    rules = BillingRules(price_micros_per_hour=1_200_000, increment="minute")
    assert compute_cost(rules, T0, T0 + timedelta(seconds=61)) == 40_000
    assert compute_cost(rules, T0, T0 + timedelta(seconds=60)) == 20_000


def test_second_increment_counts_a_started_second() -> None:
    rules = BillingRules(price_micros_per_hour=3_600_000)  # $0.001 per second
    assert compute_cost(rules, T0, T0 + timedelta(seconds=90)) == 90_000
    assert compute_cost(rules, T0, T0 + timedelta(seconds=90, microseconds=1)) == 91_000
    assert elapsed_seconds(T0, T0 - timedelta(seconds=5)) == 0


def test_aws_documented_minimum_of_60_seconds_per_start() -> None:
    """EC2 per-second billing: a 30-second run bills 60 s; 90 s bills 90 s."""
    instance = _instance(provider="aws", price_micros=3_600_000)
    rules = rules_for(instance, _platform(instance))
    assert (rules.increment, rules.min_charge_s, rules.billing_from) == ("second", 60, "created")
    assert compute_cost(rules, T0, T0 + timedelta(seconds=30)) == 60_000
    assert compute_cost(rules, T0, T0 + timedelta(seconds=90)) == 90_000


def test_lambda_bills_per_minute_from_ssh_ready() -> None:
    instance = _instance(
        provider="lambda",
        price_micros=1_200_000,
        ssh_ready_at=T0 + timedelta(minutes=5),
    )
    rules = rules_for(instance, _platform(instance))
    assert (rules.increment, rules.billing_from) == ("minute", "ssh_ready")
    # Booted at 10:00, ready at 10:05, now 10:15:30 -> 10m30s -> 11 started minutes at 2 cents.
    assert (
        cost_so_far(instance, _platform(instance), T0 + timedelta(minutes=15, seconds=30))
        == 220_000
    )
    not_ready = _instance(provider="lambda", price_micros=1_200_000)
    assert cost_so_far(not_ready, _platform(not_ready), T0 + timedelta(hours=1)) == 0


def test_runpod_and_vast_bill_per_second_without_minimum() -> None:
    for provider in ("runpod", "vast"):
        instance = _instance(provider=provider, price_micros=3_600_000)
        rules = rules_for(instance, _platform(instance))
        assert (rules.increment, rules.min_charge_s) == ("second", 0)
        assert compute_cost(rules, T0, T0 + timedelta(seconds=7)) == 7_000


def test_manual_instance_bills_as_typed() -> None:
    instance = _instance(provider="manual", billing_increment="second", min_charge_s=0)
    rules = rules_for(instance, _platform(instance))
    assert (rules.increment, rules.min_charge_s, rules.billing_from) == ("second", 0, "created")


def test_instance_values_win_over_provider_defaults() -> None:
    instance = _instance(provider="aws", billing_increment="hour", min_charge_s=300)
    rules = rules_for(instance, _platform(instance))
    assert (rules.increment, rules.min_charge_s) == ("hour", 300)


def test_minimum_charge() -> None:
    rules = BillingRules(price_micros_per_hour=6 * USD, increment="minute", min_charge_s=600)
    assert billed_seconds(rules, 1) == 600
    assert billed_seconds(rules, 601) == 660
    assert billed_seconds(rules, 0) == 0
    assert compute_cost(rules, T0, T0 + timedelta(minutes=3)) == 1 * USD


def test_gpu_hour_price_multiplies_by_gpu_count() -> None:
    instance = _instance(price_micros=2_500_000, price_per="gpu_hour", gpu_count=8)
    assert rules_for(instance, _platform(instance)).hourly_micros == 20 * USD
    assert cost_so_far(instance, _platform(instance), T0 + timedelta(minutes=30)) == 10 * USD


def test_amounts_round_up_to_the_micro() -> None:
    rules = BillingRules(price_micros_per_hour=1_000_000)  # 277.7... micros per second
    assert compute_cost(rules, T0, T0 + timedelta(seconds=1)) == 278
    assert compute_cost(rules, T0, T0 + timedelta(seconds=9)) == 2500


def test_deadline_extended_mid_hour_on_an_hourly_platform() -> None:
    """Started 10:00, deadline 11:00 -> 1 h projected; extended at 10:40 to 11:30 -> 2 h."""
    instance = _instance(provider="manual", billing_increment="hour", price_micros=3 * USD)
    deadline = T0 + timedelta(hours=1)
    assert projected_cost(instance, _platform(instance), deadline) == 3 * USD
    extended = deadline + timedelta(minutes=30)
    assert projected_cost(instance, _platform(instance), extended) == 6 * USD
    assert cost_so_far(instance, _platform(instance), T0 + timedelta(minutes=40)) == 3 * USD
    instance.released_at = extended
    # Released at the new deadline: still 2 started hours, and it stays so afterwards.
    assert cost_so_far(instance, _platform(instance), extended + timedelta(days=2)) == 6 * USD


def test_stop_then_storage_only_billing() -> None:
    """Compute stops at the stop; the 200 GB disk at $0.10/GB-month keeps billing until deleted."""
    instance = _instance(
        provider="runpod",
        price_micros=1 * USD,
        disk_gb=200,
        storage_micros_per_gb_month=100_000,
        stopped_at=T0 + timedelta(hours=2),
        release_mode="stop",
    )
    # 200 GB * $0.10 = $20 per 730 h month -> 20/730 $ per hour = 27_397.26 micros/hour.
    at_stop = cost_breakdown(instance, _platform(instance), T0 + timedelta(hours=2))
    assert at_stop.compute_micros == 2 * USD
    assert at_stop.storage_micros == 54_795  # ceil(2 * 20e6 / 730)
    later = cost_breakdown(instance, _platform(instance), T0 + timedelta(hours=2 + 730))
    assert later.compute_micros == 2 * USD
    assert later.storage_micros == 20_054_795  # ceil(732 * 20e6 / 730)
    instance.storage_deleted_at = T0 + timedelta(hours=10)
    final = cost_breakdown(instance, _platform(instance), T0 + timedelta(days=40))
    assert final.storage_micros == 273_973  # ceil(10 * 20e6 / 730)
    assert final.total_micros == 2 * USD + 273_973


def test_terminate_ends_storage_at_release() -> None:
    instance = _instance(
        disk_gb=100,
        storage_micros_per_gb_month=73_000,  # $7.30 per month for 100 GB -> 1 cent an hour
        released_at=T0 + timedelta(hours=3),
        release_mode="terminate",
    )
    result = cost_breakdown(instance, _platform(instance), T0 + timedelta(hours=50))
    assert result.storage_micros == 30_000
    assert result.compute_micros == 6 * USD


def test_storage_month_is_730_hours() -> None:
    rules = BillingRules(price_micros_per_hour=0, disk_mb=1000, storage_micros_per_gb_month=USD)
    assert storage_cost(rules, T0, T0 + timedelta(seconds=STORAGE_MONTH_S)) == USD
    # The documented EBS example: 30 GB for 24 hours at $0.10/GB-month is 0.986 GB-month.
    ebs = BillingRules(price_micros_per_hour=0, disk_mb=30_000, storage_micros_per_gb_month=100_000)
    assert storage_cost(ebs, T0, T0 + timedelta(hours=24)) == 98_631


def test_month_boundary_splits_nothing_in_the_session_cost() -> None:
    """A session across a month boundary costs the same as one inside a month."""
    start = datetime(2026, 1, 31, 23, 30)
    rules = BillingRules(price_micros_per_hour=2 * USD, increment="hour")
    assert compute_cost(rules, start, datetime(2026, 2, 1, 0, 40)) == 4 * USD


def test_egress_per_gb() -> None:
    rules = BillingRules(price_micros_per_hour=0, egress_micros_per_gb=90_000)
    assert egress_cost(rules, 2_500_000_000) == 225_000
    assert egress_cost(rules, 0) == 0


def test_job_share_of_gpus() -> None:
    instance = _instance(price_micros=8 * USD, gpu_count=8)
    start = T0 + timedelta(minutes=5)
    assert (
        job_cost(instance, _platform(instance), start, start + timedelta(minutes=30), 2) == 1 * USD
    )
    assert (
        job_cost(instance, _platform(instance), start, start + timedelta(minutes=30), 0) == 4 * USD
    )
    assert (
        job_cost(instance, _platform(instance), start, start + timedelta(minutes=30), None)
        == 4 * USD
    )
    assert job_cost(instance, _platform(instance), start, start, 2) == 0


def test_bad_rules_are_refused_with_a_hint() -> None:
    with pytest.raises(UsageError, match="increment"):
        BillingRules(price_micros_per_hour=1, increment="day")
    with pytest.raises(UsageError, match="negative"):
        BillingRules(price_micros_per_hour=-1)
    with pytest.raises(UsageError, match="billing from"):
        BillingRules(price_micros_per_hour=1, billing_from="boot")
    with pytest.raises(UsageError, match="price per"):
        BillingRules(price_micros_per_hour=1, price_per="day")


def test_parse_increment() -> None:
    assert parse_increment("H") == "hour"
    assert parse_increment("min") == "minute"
    assert parse_increment("second") == "second"
    with pytest.raises(UsageError, match="not a billing increment"):
        parse_increment("fortnight")


def test_a_stopped_instance_costs_its_disk_per_hour() -> None:
    from bot.billing import storage_micros_per_hour

    # 730 GB at $0.10 a GB-month: $0.10 an hour, whatever the month.
    inst = _instance(disk_gb=730.0, storage_micros_per_gb_month=100_000)
    assert storage_micros_per_hour(inst) == 100_000
    assert storage_micros_per_hour(_instance()) == 0
    # A stop ends compute, not the disk.
    inst.stopped_at = T0 + timedelta(hours=1)
    later = cost_breakdown(inst, _platform(inst), T0 + timedelta(hours=5))
    assert (later.compute_micros, later.storage_micros) == (2 * USD, 5 * 100_000)


def test_a_restart_bills_from_the_start_and_not_the_stopped_time() -> None:
    from bot.billing import restart

    inst = _instance(price_micros=3_600_000, provider="vast")  # per second, $0.001 a second
    inst.stopped_at = T0 + timedelta(hours=1)
    started = T0 + timedelta(hours=4)
    before = cost_so_far(inst, _platform(inst), started)
    values = restart(inst, _platform(inst), started)
    assert values == {
        "stopped_at": None,
        "compute_carried_s": 4 * 3600,
        "compute_carried_micros": 3_600_000,
        "compute_session_at": started,
        "compute_closed_s": 3600,
        "compute_closed_used_s": 3600,
    }
    for name, value in values.items():
        setattr(inst, name, value)
    assert cost_so_far(inst, _platform(inst), started) == before  # nothing jumps at the restart
    assert cost_so_far(inst, _platform(inst), started + timedelta(minutes=30)) == before + 1_800_000
    # A second stop and restart carry both sessions.
    inst.stopped_at = started + timedelta(hours=1)
    again = T0 + timedelta(hours=10)
    for name, value in restart(inst, _platform(inst), again).items():
        setattr(inst, name, value)
    assert cost_so_far(inst, _platform(inst), again + timedelta(hours=1)) == 3 * 3_600_000


def test_restarting_what_never_stopped_changes_only_the_stop() -> None:
    from bot.billing import restart

    fresh = _instance()
    assert restart(fresh, _platform(fresh), T0 + timedelta(hours=1)) == {"stopped_at": None}


def _restart_at(inst: Instance, at: datetime) -> None:
    from bot.billing import restart

    for name, value in restart(inst, _platform(inst), at).items():
        setattr(inst, name, value)


def test_each_start_has_the_minimum_of_its_own_and_stopped_time_bills_nothing() -> None:
    """AWS bills at least 60 s per start: 20 s, 10 s and 30 s runs are three minutes."""
    from bot.services.money.costs import final_cost

    inst = _instance(price_micros=3_600_000, provider="aws")  # $0.001 a second
    inst.stopped_at = T0 + timedelta(seconds=20)
    _restart_at(inst, T0 + timedelta(hours=1))
    inst.stopped_at = T0 + timedelta(hours=1, seconds=10)
    assert cost_so_far(inst, _platform(inst), T0 + timedelta(hours=1, minutes=30)) == 120_000
    _restart_at(inst, T0 + timedelta(hours=2))
    released = T0 + timedelta(hours=2, seconds=30)
    inst.released_at = released
    assert cost_so_far(inst, _platform(inst), released) == 180_000
    cost = final_cost(inst)
    assert cost is not None
    assert (cost.used_s, cost.billed_s, cost.carried) == (60, 180, False)


def test_an_hourly_platform_rounds_every_start_up_to_the_hour() -> None:
    """Two 10-minute runs on an hourly platform, the second starting mid-hour: two started
    hours."""
    inst = _instance(price_micros=2 * USD, provider="compshare", currency="CNY")
    inst.stopped_at = T0 + timedelta(minutes=10)
    assert cost_so_far(inst, _platform(inst), T0 + timedelta(hours=3)) == 2 * USD
    _restart_at(inst, T0 + timedelta(hours=5, minutes=30))
    assert cost_so_far(inst, _platform(inst), T0 + timedelta(hours=5, minutes=40)) == 4 * USD
    inst.released_at = T0 + timedelta(hours=5, minutes=40)
    assert cost_so_far(inst, _platform(inst), T0 + timedelta(days=1)) == 4 * USD


def test_a_new_price_after_a_restart_applies_from_then_within_that_session() -> None:
    from bot.billing import carry

    inst = _instance(price_micros=3_600_000, provider="vast")
    inst.stopped_at = T0 + timedelta(hours=1)
    _restart_at(inst, T0 + timedelta(hours=3))
    changed = T0 + timedelta(hours=3, minutes=30)
    for name, value in carry(inst, _platform(inst), changed).items():
        setattr(inst, name, value)
    inst.price_micros = 7_200_000
    assert cost_so_far(inst, _platform(inst), changed) == 3_600_000 + 1_800_000
    assert (
        cost_so_far(inst, _platform(inst), changed + timedelta(minutes=30))
        == 3_600_000 + 1_800_000 + 3_600_000
    )


def test_a_release_is_partly_at_an_earlier_price_only_when_that_price_differed() -> None:
    """A session priced from the start, or restarted at the same price, is one price; a stretch
    without a price, or at another one, before the current price is an earlier price."""
    from bot.billing import carry
    from bot.services.money.costs import final_cost

    def carried_after_price_change(before: int, after: int) -> bool:
        inst = _instance(price_micros=before, provider="vast")
        changed = T0 + timedelta(minutes=30)
        for name, value in carry(inst, _platform(inst), changed).items():
            setattr(inst, name, value)
        inst.price_micros = after
        inst.released_at = T0 + timedelta(hours=1)
        cost = final_cost(inst)
        assert cost is not None
        return cost.carried

    assert carried_after_price_change(2 * USD, 2 * USD) is False
    assert carried_after_price_change(0, 2 * USD) is True
    assert carried_after_price_change(1 * USD, 2 * USD) is True

    restarted = _instance(price_micros=3_600_000, provider="aws")
    for stop, start in ((7, 20), (33, 50)):
        restarted.stopped_at = T0 + timedelta(minutes=stop, seconds=1)
        _restart_at(restarted, T0 + timedelta(minutes=start))
    restarted.released_at = T0 + timedelta(hours=1, seconds=7)
    cost = final_cost(restarted)
    assert cost is not None
    assert cost.carried is False


def test_a_price_given_within_the_first_second_bills_from_the_start_at_that_price() -> None:
    """`local` stored without a price, registered at $2.00/h by the hour 0.4 s later and
    released 70 minutes after that: one price, 2 h billed, exactly $4.00. A price given a
    second or more later still leaves the stretch before it at the earlier price."""
    from bot.billing import at_one_price, carry
    from bot.services.money.costs import final_cost

    def released(after: timedelta) -> Instance:
        inst = _instance(price_micros=0, provider="manual", ssh_ready_at=T0)
        changed = T0 + after
        for name, value in carry(inst, _platform(inst), changed).items():
            setattr(inst, name, value)
        inst.price_micros = 2 * USD
        inst.billing_increment = "hour"
        inst.released_at = changed + timedelta(minutes=70)
        return inst

    moment = released(timedelta(milliseconds=400))
    assert (moment.compute_carried_s, moment.storage_carried_s) == (0, 0)
    assert at_one_price(moment, _platform(moment))
    cost = final_cost(moment)
    assert cost is not None
    assert (cost.carried, cost.total_micros, cost.billed_s) == (False, 4 * USD, 7200)
    later = released(timedelta(seconds=30))
    assert later.compute_carried_s == 30
    assert not at_one_price(later, _platform(later))
