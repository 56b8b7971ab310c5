"""The instance services in Simplified Chinese: the errors a person meets (an unknown instance, a
bad name or address, a limit only an admin may pass ...), the figures of `/gpu estimate`, and
what the bot tells a person on its own (a host key alert, a rental it cleaned up) in the language
that person chose, while everyone else keeps the workspace's English."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import cast

import pytest

from bot.errors import GpubotError, HostKeyChanged
from bot.i18n import speaking
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import answers, lifecycle, lookup, registration, rent
from bot.services.money import advice
from bot.services.speaking import people
from bot.store.db import Database
from bot.store.models import Launch
from tests.bot.services.instances.test_registration import RTX4090, _snapshot
from tests.bot.services.support import (
    T0,
    Clock,
    RecordingNotifier,
    ScriptedPlatform,
    add_instance,
    get_instance,
    make_runtime,
)
from tests.chinese import assert_chinese, assert_said_in_chinese, chinese_error

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM")


@pytest.fixture
def rt(sqlite_db: Database) -> Runtime:
    return make_runtime(sqlite_db, Clock(), providers=[ScriptedPlatform()])


# --- errors -----------------------------------------------------------------------------------


def test_bad_names_and_addresses_are_refused_in_chinese() -> None:
    text = chinese_error(lambda: registration.validate_name("Bad Name!"), "'Bad Name!'")
    assert "实例名" in text
    chinese_error(lambda: registration.parse_address("203.0.113.7"), "'203.0.113.7'", "USER@HOST")
    chinese_error(lambda: registration.parse_address("root@bad_host!"), "'bad_host!'")
    chinese_error(lambda: registration.parse_address("root@[2001:db8::1"), "IPv6")
    chinese_error(lambda: registration.parse_address("root@box:99999"), "'99999'", "65535")


def test_a_registration_with_bad_options_is_refused_in_chinese(rt: Runtime) -> None:
    def register(**changes: object) -> Callable[[], object]:
        fields: dict[str, object] = {"name": "box", "address": "root@203.0.113.7"}
        fields.update(changes)
        request = registration.RegisterRequest(**fields)  # type: ignore[arg-type]
        return lambda: registration.register(rt, OWNER, request)

    chinese_error(register(gpu_count=0), "--count 0", "64")
    chinese_error(register(provider="azure"), "'azure'", "runpod")
    chinese_error(register(provider="runpod"), "--provider runpod", "--provider-id")
    both = register(release_in=timedelta(hours=1), release_at=T0 + timedelta(hours=2))
    chinese_error(both, "--release-in", "--release-at")


def test_an_unknown_instance_is_said_in_chinese(rt: Runtime) -> None:
    with rt.db.session() as session:
        chinese_error(lambda: lookup.get_live_instance(rt, session, "ghost"), "'ghost'")
        chinese_error(lambda: lookup.by_id(rt, session, 999), "999", "`/gpu list`")
    chinese_error(lambda: lifecycle.extend(rt, OWNER, "ghost", timedelta(hours=1)), "'ghost'")
    chinese_error(lambda: answers.keep(rt, OWNER, 999), "/gpu status NAME")


def test_what_only_an_admin_may_do_and_what_cannot_be_done_now_is_said_in_chinese(
    rt: Runtime,
) -> None:
    add_instance(rt.db, name="capped", lifetime_cap_at=T0 + timedelta(hours=1))
    add_instance(rt.db, name="parked", state="stopped")
    add_instance(rt.db, name="going", state="releasing")

    text = chinese_error(
        lambda: lifecycle.extend(rt, OWNER, "capped", timedelta(hours=3)),
        "capped",
        "12月02日 周三 13:00 UTC",
    )
    assert "管理员" in text
    text = chinese_error(
        lambda: lifecycle.extend(rt, Caller("UOTHER"), "capped", timedelta(hours=1)),
        "<@UOWNER>",
        "capped",
    )
    assert "延长" in text
    chinese_error(lambda: lifecycle.extend(rt, OWNER, "capped", timedelta(0)), "/gpu extend")
    chinese_error(
        lambda: lifecycle.ask_release(rt, OWNER, "parked", stop=True), "`/gpu release parked`"
    )
    text = chinese_error(lambda: lifecycle.ask_release(rt, OWNER, "going"), "going")
    assert "释放中" in text


def test_renting_checks_are_said_in_chinese(rt: Runtime) -> None:
    request = rent.RentRequest("scripted", "x", count=9)
    chinese_error(lambda: rent.plan_rent(rt, OWNER, request), "8", "--count 1")


def test_sizing_advice_errors_and_figures_are_in_chinese() -> None:
    chinese_error(lambda: advice.fit("huge", "inference"), "'huge'", "7b")
    chinese_error(lambda: advice.fit("7b", "inference", seq=0), "--seq 0", "4096")
    chinese_error(lambda: advice.resolve_bits("qlora", 16), "QLoRA", "--bits")
    chinese_error(lambda: advice.estimate("nope", hours=Decimal(50)), "'nope'", "4090")
    chinese_error(lambda: advice.estimate("4090", hours=Decimal(800)), "--hours 800", "744")
    chinese_error(lambda: advice.parse_hours("lots"), "'lots'")
    with speaking("zh"):
        report = advice.estimate("4090", hours=Decimal(50), count=2, hourly_micros=500_000)
    for option in report.options:
        assert_said_in_chinese(option.detail)
        assert "2" in option.detail
    assert_said_in_chinese(report.hourly_source, report.buy_source)  # as given; a list price
    assert report.monthly_source.endswith("未核实")  # the platform names its own offer


def test_gpu_mismatches_are_said_in_chinese() -> None:
    with speaking("zh"):
        fewer = lookup.compare_gpus("h100", 8, _snapshot(RTX4090))
        other = lookup.compare_gpus("a100", 2, _snapshot(RTX4090, RTX4090))
    assert fewer is not None
    assert other is not None
    assert_said_in_chinese(*fewer.problems, *other.problems)
    assert "8" in fewer.problems[0]
    assert "NVIDIA GeForce RTX 4090" in other.problems[0]
    assert "a100" in other.problems[0]


# --- messages the bot sends on its own --------------------------------------------------------


def test_a_host_key_alert_reaches_its_owner_in_the_language_they_chose(rt: Runtime) -> None:
    notifier = cast(RecordingNotifier, rt.notifier)
    theirs = add_instance(rt.db, name="zhbox", owner_id="UZH", host_key_fingerprint="SHA256:old")
    others = add_instance(rt.db, name="enbox", host_key_fingerprint="SHA256:other")
    people.set_language(rt, Caller("UZH"), "zh")
    changed = HostKeyChanged("host key changed", presented_fingerprint="SHA256:new")

    with speaking("en"):  # whoever's command ran into it speaks English
        lookup.handle_fleet_error(rt, get_instance(rt.db, theirs), changed)
    lookup.handle_fleet_error(rt, get_instance(rt.db, others), HostKeyChanged("changed"))

    [alert] = notifier.to("UZH")
    assert_chinese(alert.text, alert.blocks)
    assert "SHA256:new" in alert.text
    assert "zhbox" in alert.text
    [english] = notifier.to("UOWNER")
    assert "The host key of *enbox*" in english.text
    assert "no key of the pinned type" in english.text


def test_a_rental_cleaned_up_by_the_clock_is_told_in_the_renters_language(rt: Runtime) -> None:
    notifier = cast(RecordingNotifier, rt.notifier)
    people.set_language(rt, Caller("UZH"), "zh")
    with rt.db.session() as session:
        for renter, pod in (("UZH", "i-zh"), ("UEN", "i-en")):
            at = T0 - timedelta(hours=2)
            session.add(
                Launch(
                    launch_key=pod,
                    position=1,
                    provider="scripted",
                    instance_type="gpu",
                    name=f"{pod}-box",
                    renter=renter,
                    provider_id=pod,
                    state="launched",  # its renting process stopped: its lease ran out
                    lease_until=at,
                    started_at=at,
                    changed_at=at,
                )
            )

    assert sorted(rent.recover_orphans(rt, T0)) == ["i-en", "i-zh"]

    [told] = notifier.to("UZH")
    assert_chinese(told.text, told.blocks)
    assert "i-zh" in told.text
    [english] = notifier.to("UEN")
    assert "never registered because the bot stopped while setting it up" in english.text


def test_english_stays_the_default(rt: Runtime) -> None:
    with pytest.raises(GpubotError) as caught:
        lifecycle.ask_release(rt, OWNER, "ghost")
    assert caught.value.user_text() == (
        "There is no instance called 'ghost'.\n"
        "`/gpu list` shows the instances; names are lowercase."
    )
