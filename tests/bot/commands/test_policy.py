"""`/gpu policy` through the registry and the command parser."""

from __future__ import annotations

import pytest

from bot.commands import build_registry
from bot.commands.parser import parse
from bot.errors import NotAuthorized, UsageError
from bot.services.access import Caller
from bot.store.models import Instance
from tests.bot.services.support import T0, Clock, add_instance, get_instance, make_runtime

OWNER = Caller("UOWNER", channel_id="CTEAM")
OTHER = Caller("UOTHER", channel_id="CTEAM")


@pytest.fixture
def rt(sqlite_db):
    return make_runtime(sqlite_db, Clock(), poll_interval_s=10**7)


def _command(rt, caller, text):
    spec, args = parse(text, build_registry())
    return spec.handler(rt, caller, args)


def test_policy_command_changes_and_validates(rt):
    iid = add_instance(rt.db)
    reply = _command(
        rt,
        OWNER,
        "policy box --at-deadline wait-for-jobs --max-grace 2h --idle-release 1h "
        "--release-when-done on",
    )
    assert "wait for running jobs, at most 2h" in reply.text
    with rt.db.session() as session:
        inst = session.get(Instance, iid)
        assert inst is not None
        assert inst.deadline_policy == "wait-for-jobs"
        assert inst.max_grace_s == 7200
        assert inst.idle_release_after_s == 3600
        assert inst.release_when_done
    _command(rt, OWNER, "policy box --idle-release off")
    assert get_instance(rt.db, iid).idle_release_after_s is None

    with pytest.raises(UsageError):
        _command(rt, OWNER, "policy box --at-deadline explode")
    # Without options it shows the settings (it used to answer "Nothing to change").
    shown = _command(rt, OWNER, "policy box")
    assert "at the deadline: wait for running jobs, at most 2h" in shown.text
    with pytest.raises(NotAuthorized):
        _command(rt, OTHER, "policy box --idle-release 1h")
    assert get_instance(rt.db, iid).deadline_policy == "wait-for-jobs"


def test_the_summary_shows_the_deadline_with_its_date(rt):
    add_instance(rt.db, deadline_at=T0.replace(hour=18, minute=0))
    reply = _command(rt, OWNER, "policy box --idle-release 1h")
    assert reply.text.startswith("*box*: deadline Wed 02 Dec 18:00 UTC\n")
    assert "idle: released 1h after the idle prompt" in reply.text


def test_policy_without_options_shows_every_setting_and_changes_nothing(rt):
    from datetime import timedelta

    from bot.store.models import AuditLog
    from tests.bot.services.support import rows

    iid = add_instance(
        rt.db,
        deadline_at=T0 + timedelta(hours=6),
        lifetime_cap_at=T0 + timedelta(days=3),
        billing_increment="minute",
        min_charge_s=600,
        disk_gb=200.0,
        storage_micros_per_gb_month=100_000,
        idle_release_after_s=3600,
        release_when_done=True,
    )
    before = get_instance(rt.db, iid)
    reply = _command(rt, OTHER, "policy box")  # anyone may look

    assert reply.text.startswith("*box*: deadline Wed 02 Dec 18:00 UTC (6h left)\n")
    for line in (
        "at the deadline: release",
        "idle: released 1h after the idle prompt",
        "when its jobs are done: released",
        "lifetime cap: Sat 05 Dec 12:00 UTC",
        "billing: per minute, minimum charge 10m",
        "disk: 200 GB at $0.10/GB-month",
    ):
        assert line in reply.text
    assert reply.ephemeral
    assert get_instance(rt.db, iid) == before
    assert rows(rt.db, AuditLog) == []


def test_policy_without_options_shows_the_platforms_billing_rules(rt):
    add_instance(rt.db, provider="aws", provider_instance_id="i-0abc")
    reply = _command(rt, OWNER, "policy box")
    assert "billing: per second, minimum charge 1m" in reply.text
    assert "disk: not given" in reply.text
    assert "lifetime cap: none" in reply.text
    assert "when its jobs are done: kept" in reply.text
    assert "idle: prompt only" in reply.text


def test_policy_of_an_unknown_instance_is_not_found(rt):
    from bot.errors import NotFound

    with pytest.raises(NotFound, match="There is no instance called 'nobox'"):
        _command(rt, OWNER, "policy nobox")
