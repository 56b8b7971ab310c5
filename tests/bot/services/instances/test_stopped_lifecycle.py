"""Stop is a state with its own life: a stopped instance has no compute deadline (its old one
never fires), costs only its disk in every view, offers Start and Release but not Extend,
reminds its owner on a widening, bounded schedule through a month and a restart, and runs
again with a new deadline when started; against the Vast stand-in, with a hand clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import select

from bot import billing
from bot.blocks import home as home_blocks
from bot.blocks import instances as instance_blocks
from bot.errors import UsageError
from bot.providers.registry import ProviderRegistry, platform_billing
from bot.runtime import Runtime
from bot.services import home
from bot.services.access import Caller
from bot.services.instances import fleet_views, lifecycle, starts
from bot.services.instances.policies import PolicyChange, set_policy
from bot.services.tick import tick
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import Release
from tests.bot.services.support import (
    T0,
    Clock,
    NoFleet,
    RecordingNotifier,
    add_instance,
    get_instance,
    make_runtime,
)
from tests.fixtures.providers import VastStandIn

pytestmark = pytest.mark.integration

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM")
USD = 1_000_000
#: 730 GB at $0.10 per GB-month: $0.10 an hour while stopped.
DISK = {"disk_gb": 730.0, "storage_micros_per_gb_month": 100_000}
DEADLINE = T0 + timedelta(hours=3)
DAY = timedelta(days=1)


class Notifier(RecordingNotifier):
    """Records posts; takes the digest's chart and CSV too (the month turns in these tests)."""

    def upload_file(self, channel: str, filename: str, content: bytes, **_: object) -> None:
        return None


def _runtime(
    db: Database, clock: Clock, vast: VastStandIn, notifier: RecordingNotifier, **settings: int
) -> Runtime:
    vast_settings = Settings(vast_api_url=vast.url, vast_api_key=vast.api_key)
    provider = ProviderRegistry.from_settings(vast_settings).get("vast")
    provider.sleep = lambda _s: None  # type: ignore[attr-defined]
    return make_runtime(
        db,
        clock,
        providers=[provider],
        notifier=notifier,
        fleet=NoFleet(),
        poll_interval_s=10**7,
        **settings,
    )


def _vast_box(db: Database, vast: VastStandIn) -> tuple[str, int]:
    """A Vast instance registered at $2.00/h with its disk priced and a deadline 3 h away:
    (its Vast id, its registration)."""
    vid = vast.add()
    iid = add_instance(
        db,
        provider="vast",
        provider_instance_id=vid,
        price_micros=2 * USD,
        deadline_at=DEADLINE,
        **DISK,
    )
    return vid, iid


def _ticks(rt: Runtime, clock: Clock, until, step: timedelta) -> None:
    while clock.now < until:
        clock.advance(seconds=step.total_seconds())
        tick(rt, clock.now)


def _owner_texts(notifier: RecordingNotifier) -> list[str]:
    return [p.text for p in notifier.posts if p.channel == OWNER.user_id]


def test_a_stopped_instance_lives_a_month_on_its_disk_and_runs_again_when_started(
    db: Database, vast_cloud: VastStandIn
) -> None:
    clock = Clock(T0)
    notifier = Notifier()
    rt = _runtime(db, clock, vast_cloud, notifier)
    vid, iid = _vast_box(db, vast_cloud)

    clock.advance(hours=1)
    view = lifecycle.release(rt, OWNER, iid, mode="stop")
    assert view.instance.state == "stopped"
    stopped_at = clock.now
    inst = get_instance(db, iid)
    assert (inst.state, inst.stopped_at, inst.deadline_at) == ("stopped", stopped_at, None)

    # Every view says the same: its disk at $0.10/h, kept until released; Start and Release.
    overview = fleet_views.list_instances(rt)
    text = str(instance_blocks.instance_list(overview)[1])
    assert "stopped: disk $0.10/h" in text
    assert "kept until released" in text
    assert "$2.00/h" not in text
    detail = fleet_views.instance_detail(rt, "box")
    assert detail.can_start
    detail_blocks = str(instance_blocks.instance_detail(detail)[1])
    assert "stopped: disk $0.10/h" in detail_blocks
    assert instance_blocks.START_INSTANCE in detail_blocks
    assert instance_blocks.RELEASE_CONFIRM in detail_blocks
    mine = home.home_view(rt, OWNER.user_id)
    [item] = mine.mine
    assert (item.can_extend, item.can_start, item.burn_micros_per_hour) == (False, True, 100_000)
    home_text = str(home_blocks.home_view(mine))
    assert "stopped: disk $0.10/h" in home_text
    assert "kept until released" in home_text
    assert home_blocks.HOME_EXTEND not in home_text
    assert instance_blocks.START_INSTANCE in home_text
    assert "1 instance, $0.10/h together." in home_text
    with pytest.raises(UsageError, match="is stopped and has no deadline"):
        lifecycle.extend(rt, OWNER, "box", timedelta(hours=1))

    # Through the old deadline and a fortnight: nothing is released, reminders widen.
    _ticks(rt, clock, stopped_at + 15 * DAY, timedelta(hours=12))
    # The bot restarts (a new runtime on the same store) and the month goes on.
    rt = _runtime(db, clock, vast_cloud, notifier)
    _ticks(rt, clock, stopped_at + 31 * DAY, timedelta(hours=12))
    with rt.db.session() as session:
        rows = session.exec(select(Release.reason, Release.mode, Release.state)).all()
    assert rows == [("user", "stop", "confirmed")]
    texts = _owner_texts(notifier)
    assert len([x for x in texts if "is stopped" in x]) == 1
    reminders = [p for p in notifier.posts if "has been stopped for" in p.text]
    assert [r.text.split("for ")[1].split(";")[0] for r in reminders] == [
        "1d",
        "3d",
        "7d",
        "14d",
        "30d",
    ]
    assert "This is the last reminder." in reminders[-1].text
    assert "last reminder" not in reminders[0].text
    assert not [x for x in texts if "will be released" in x or "deadline" in x.lower()]
    assert len(texts) == 1 + 5  # the stop, the reminders: nothing else said on its own
    inst = get_instance(db, iid)
    month = billing.cost_breakdown(inst, platform_billing(inst.provider), clock.now)
    assert month.compute_micros == 2 * USD  # the hour it ran
    hours = (clock.now - T0) // timedelta(hours=1)
    assert month.storage_micros == hours * 100_000  # the disk, every hour since registered

    # Started from the bot: compute bills again, and it has a deadline again.
    result = starts.start(rt, OWNER, iid)
    assert result.started
    assert vast_cloud.instances[vid]["cur_state"] == "running"
    inst = get_instance(db, iid)
    assert (inst.state, inst.stopped_at, inst.stopped_remind_at) == ("active", None, None)
    assert inst.deadline_at == clock.now + timedelta(seconds=rt.settings.default_release_in_s)
    before = billing.cost_breakdown(inst, platform_billing(inst.provider), clock.now).compute_micros
    later = billing.cost_breakdown(
        inst, platform_billing(inst.provider), clock.now + timedelta(hours=1)
    ).compute_micros
    assert later - before == 2 * USD
    tick(rt, clock.now)  # the notice goes out with the clock
    told = [x for x in _owner_texts(notifier) if "was started again on Vast by" in x]
    assert len(told) == 1
    assert "Its new deadline is" in told[0]


def test_policy_release_after_sets_when_a_stopped_disk_goes(db: Database, vast_cloud: VastStandIn):
    clock = Clock(T0)
    notifier = Notifier()
    rt = _runtime(db, clock, vast_cloud, notifier)
    vid, iid = _vast_box(db, vast_cloud)
    lifecycle.release(rt, OWNER, iid, mode="stop")
    with pytest.raises(UsageError, match="only when its disk is released can change"):
        set_policy(rt, OWNER, "box", PolicyChange(idle_release_after_s=3600))
    set_policy(rt, OWNER, "box", PolicyChange(release_after_s=2 * 86_400))
    assert get_instance(db, iid).deadline_at == T0 + 2 * DAY
    _ticks(rt, clock, T0 + timedelta(hours=1), timedelta(minutes=30))  # the stop's news
    clock.set(T0 + 2 * DAY - timedelta(minutes=40))  # nothing happens in between
    _ticks(rt, clock, T0 + 2 * DAY + timedelta(minutes=30), timedelta(minutes=5))
    assert vid not in vast_cloud.instances
    inst = get_instance(db, iid)
    assert inst.state == "released"
    warned = [p.text for p in notifier.posts if "(stopped) will be released in" in p.text]
    assert warned  # warned before its disk went


def test_an_admin_s_keep_policy_releases_a_stopped_disk_after_it(
    db: Database, vast_cloud: VastStandIn
):
    clock = Clock(T0)
    rt = _runtime(db, clock, vast_cloud, Notifier(), stopped_keep_s=7 * 86_400)
    _, iid = _vast_box(db, vast_cloud)
    lifecycle.release(rt, OWNER, iid, mode="stop")
    assert get_instance(db, iid).deadline_at == T0 + 7 * DAY
