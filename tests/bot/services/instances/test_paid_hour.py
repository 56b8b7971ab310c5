"""On an instance billed by the whole hour, the deadline warning offers the rest of the hour
already paid for (the guides' case: a release a minute late costs a whole third hour), and
the button keeps it to that hour's last minute at no extra cost."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import select

from bot import billing
from bot.blocks import deadlines as blocks
from bot.providers.registry import platform_billing
from bot.services.access import Caller
from bot.services.instances import answers, deadlines
from bot.services.tick import tick
from bot.store.db import Database
from bot.store.models import Instance, Prompt
from tests.bot.services.support import (
    T0,
    Clock,
    NoFleet,
    RecordingNotifier,
    add_instance,
    get_instance,
    make_runtime,
)

OWNER = Caller("UOWNER", channel_id="CTEAM")
PRICE = 2_000_000  # $2.00/h


def _warned(db: Database, increment: str) -> tuple[object, int, RecordingNotifier]:
    clock = Clock(T0)
    notifier = RecordingNotifier()
    rt = make_runtime(db, clock, notifier=notifier, fleet=NoFleet(), poll_interval_s=10**7)
    iid = add_instance(
        db,
        price_micros=PRICE,
        billing_increment=increment,
        deadline_at=T0 + timedelta(hours=2, minutes=10),
        last_polled_at=T0,
    )
    clock.advance(hours=1, minutes=45)  # the 30-minute warning is due
    tick(rt, clock.now)
    return rt, iid, notifier


def test_an_hourly_instance_is_offered_the_rest_of_its_paid_hour(db: Database) -> None:
    rt, iid, notifier = _warned(db, "hour")
    [warning] = [p for p in notifier.posts if "will be released" in p.text]
    assert "billed by the whole hour: keeping it until Wed 02 Dec 14:59 UTC costs nothing" in (
        warning.text
    )
    assert blocks.EXTEND_PAID_HOUR in str(warning.blocks)
    with rt.db.session() as session:  # type: ignore[attr-defined]
        prompt = session.exec(select(Prompt).where(Prompt.kind == deadlines.KIND_WARNING)).one()
    assert prompt.id is not None
    answers.extend_to_paid_hour(rt, OWNER, prompt.id)  # type: ignore[arg-type]
    inst = get_instance(db, iid)
    assert inst.deadline_at == T0 + timedelta(hours=2, minutes=59)
    # Released at either time, it is billed three whole hours: the minutes kept cost nothing.
    platform = platform_billing(inst.provider)
    at_deadline = billing.cost_breakdown(
        inst.model_copy(update={"released_at": T0 + timedelta(hours=2, minutes=10)}),
        platform,
        T0 + timedelta(hours=2, minutes=10),
    )
    at_paid_end = billing.cost_breakdown(
        inst.model_copy(update={"released_at": inst.deadline_at}), platform, inst.deadline_at
    )
    assert at_deadline.compute_micros == at_paid_end.compute_micros == 3 * PRICE
    # A second click (a double click) is told the warning was answered: extended once.
    answers.extend_to_paid_hour(rt, OWNER, prompt.id)  # type: ignore[arg-type]
    assert get_instance(db, iid).deadline_at == T0 + timedelta(hours=2, minutes=59)


def test_a_per_second_instance_is_offered_nothing_of_the_kind(db: Database) -> None:
    _, _, notifier = _warned(db, "second")
    [warning] = [p for p in notifier.posts if "will be released" in p.text]
    assert "billed by the whole hour" not in warning.text
    assert blocks.EXTEND_PAID_HOUR not in str(warning.blocks)


def test_the_paid_hour_stays_within_an_admin_s_cap_and_off_a_stopped_instance() -> None:
    running = Instance(
        name="box",
        owner_id="U1",
        host="h",
        state="active",
        price_micros=PRICE,
        billing_increment="hour",
        created_at=T0,
    )
    at = T0 + timedelta(hours=2, minutes=10)
    assert deadlines.paid_hour_end(running, at) == T0 + timedelta(hours=2, minutes=59)
    capped = running.model_copy(update={"lifetime_cap_at": T0 + timedelta(hours=2, minutes=30)})
    assert deadlines.paid_hour_end(capped, at) is None
    assert deadlines.paid_hour_end(running.model_copy(update={"state": "stopped"}), at) is None
    assert deadlines.paid_hour_end(running, T0 + timedelta(hours=2, minutes=58, seconds=30)) is None
