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
    with pytest.raises(UsageError, match="Nothing to change"):
        _command(rt, OWNER, "policy box")
    with pytest.raises(NotAuthorized):
        _command(rt, OTHER, "policy box --idle-release 1h")
    assert get_instance(rt.db, iid).deadline_policy == "wait-for-jobs"


def test_the_summary_shows_the_deadline_with_its_date(rt):
    add_instance(rt.db, deadline_at=T0.replace(hour=18, minute=0))
    reply = _command(rt, OWNER, "policy box --idle-release 1h")
    assert reply.text.startswith("*box*: deadline Wed 02 Dec 18:00 UTC\n")
    assert "idle: released 1h after the idle prompt" in reply.text
