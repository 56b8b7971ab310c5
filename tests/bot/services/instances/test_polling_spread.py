"""Polls spread over the interval: each instance at its own place in it, so the ticks share
the fleet's polls evenly; a new registration is polled at once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from itertools import pairwise

from sqlmodel import select

from bot.errors import FleetError
from bot.fleet.base import Target
from bot.runtime import Runtime
from bot.services.instances import polling
from bot.services.tick import tick
from bot.store.models import UtilHour
from tests.bot.services.support import (
    T0,
    Clock,
    add_instance,
    counting_statements,
    get_instance,
    make_runtime,
    selects,
)

POLL_S = 60
TICK_S = 5
FLEET = 100


class CountingFleet:
    """Stands in for the fleet: records each fan-out's targets; no agent answers."""

    closed = False  # the bot is not shutting down

    def __init__(self) -> None:
        self.fan_outs: list[list[str]] = []

    def fan_out(self, targets: Sequence[Target], fn: object) -> dict[str, FleetError]:
        self.fan_outs.append([t.name for t in targets])
        return {t.name: FleetError("no answer", instance=t.name) for t in targets}


def _runtime(db) -> tuple[Runtime, Clock, CountingFleet]:
    clock = Clock(T0)
    fleet = CountingFleet()
    rt = make_runtime(db, clock, fleet=fleet, poll_interval_s=POLL_S, tick_interval_s=TICK_S)
    return rt, clock, fleet


def test_a_fleet_s_polls_are_spread_evenly_over_the_interval(sqlite_db):
    rt, clock, _ = _runtime(sqlite_db)
    ids = [add_instance(rt.db, name=f"box{n}") for n in range(FLEET)]
    polled_at: dict[int, list[int]] = {iid: [] for iid in ids}
    per_tick: list[int] = []
    ticks = 5 * POLL_S // TICK_S + 1
    for n in range(ticks):
        results = polling.poll_instances(rt, clock.now)
        per_tick.append(len(results))
        for result in results:
            polled_at[result.instance_id].append(n * TICK_S)
        clock.advance(seconds=TICK_S)

    assert per_tick[0] == FLEET  # new registrations: all at once
    flat = FLEET * TICK_S / POLL_S  # 8.3 a tick (all 100 on one tick before polls were spread)
    assert max(per_tick[1:]) <= flat + 2, per_tick
    # After the first poll, every instance once in each interval, at the same place.
    for times in polled_at.values():
        first, *later = times
        assert first == 0
        assert POLL_S / 2 <= later[0] < 1.5 * POLL_S + TICK_S  # at the first tick in its place
        gaps = [b - a for a, b in pairwise(later)]
        assert len(gaps) >= 3
        assert gaps == [POLL_S] * len(gaps), times


def test_the_place_in_the_interval_is_stable_and_never_half_an_interval_near():
    after = T0 + timedelta(seconds=7)
    for iid in range(1, 500):
        due = polling.next_poll_at(iid, after, POLL_S)
        gap_s = (due - after).total_seconds()
        assert POLL_S / 2 <= gap_s < 1.5 * POLL_S
        # The same place in every interval.
        assert polling.next_poll_at(iid, due, POLL_S) == due + timedelta(seconds=POLL_S)
    places = Counter(
        int((polling.next_poll_at(iid, T0, POLL_S) - T0).total_seconds()) % POLL_S // TICK_S
        for iid in range(1, FLEET + 1)
    )
    assert max(places.values()) - min(places.values()) <= 2, places


def test_two_processes_claim_a_due_instance_once(db):
    rt, clock, _ = _runtime(db)
    iid = add_instance(rt.db)
    due = polling._due(rt, clock.now)
    assert [i for i, _, _ in polling._claim(rt, due, clock.now)] == [iid]
    assert polling._claim(rt, due, clock.now) == []  # the other process read it due, too
    inst = get_instance(rt.db, iid)
    assert inst.last_polled_at == clock.now
    assert inst.poll_due_at == polling.next_poll_at(iid, clock.now, POLL_S)


def test_rows_without_a_place_keep_the_interval_and_a_longer_interval_s_place_is_caught_up(
    sqlite_db,
):
    rt, clock, _ = _runtime(sqlite_db)
    legacy = add_instance(rt.db, name="legacy", last_polled_at=T0 - timedelta(seconds=POLL_S))
    far = add_instance(
        rt.db,
        name="far",
        last_polled_at=T0 - timedelta(seconds=3 * POLL_S),
        poll_due_at=T0 + timedelta(days=100),  # placed under a 10**7 s interval
    )
    fresh = add_instance(rt.db, name="fresh", last_polled_at=T0 - timedelta(seconds=30))
    polled = {r.instance_id for r in polling.poll_instances(rt, clock.now)}
    assert polled == {legacy, far}
    assert fresh not in polled


def test_the_tick_polls_a_new_registration_at_once(sqlite_db):
    rt, clock, fleet = _runtime(sqlite_db)
    tick(rt, clock.now)
    add_instance(rt.db, name="new")
    assert tick(rt, clock.advance(seconds=TICK_S)).polled == 1
    assert fleet.fan_outs == [["new"]]


def test_a_batch_s_reads_do_not_grow_with_its_size(db):
    """A poll batch reads its rows, their jobs and their roll-ups once each, on both stores:
    a batch of 2 and one of POLL_BATCH make the same number of SELECTs (two a row before)."""
    selects = {size: _selects_of_one_batch(db, size) for size in (2, polling.POLL_BATCH)}
    assert selects[2] == selects[polling.POLL_BATCH], selects


def _selects_of_one_batch(db, size: int) -> int:
    rt, clock, _ = _runtime(db)
    ids = {add_instance(rt.db, name=f"batch{size}-{n}") for n in range(size)}
    with counting_statements(db) as seen:
        results = polling.poll_instances(rt, clock.now)
    assert {r.instance_id for r in results} == ids
    assert all(get_instance(rt.db, iid).last_poll_ok is False for iid in ids)  # none answered
    with db.session() as session:
        hours = [h for h in session.exec(select(UtilHour)).all() if h.instance_id in ids]
    assert sum(h.polls for h in hours) == size
    assert sum(h.bad_polls for h in hours) == size
    return len(selects(seen))
