"""Launch rows: the states of a rental, the claim and its lease (two claimers, a lease that runs
out), and the due clause orphan recovery selects by, on SQLite and PostgreSQL."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import TypeVar

from sqlmodel import col, select

from bot.runtime import Runtime
from bot.services import tick as tick_module
from bot.services.instances import launches, rent
from bot.store.models import AuditLog, Launch
from tests.bot.services.support import T0, Clock, ScriptedPlatform, add_instance, make_runtime

T = TypeVar("T")
LEASE = timedelta(seconds=launches.CLAIM_LEASE_S)


def _open(rt: Runtime, holder: str, *names: str, key: str = "k1") -> None:
    with rt.db.session() as session:
        launches.open_launch(
            session,
            launch_key=key,
            provider="scripted",
            instance_type="gpu",
            platform_name=f"{names[0]}-{key}",
            names=names,
            renter="UOWNER",
            holder=holder,
            now=rt.now(),
        )


def _answer(rt: Runtime, holder: str, *ids: str, key: str = "k1") -> bool:
    with rt.db.session() as session:
        return launches.record_answer(session, key, holder, list(ids), rt.now())


def _states(rt: Runtime, key: str = "k1") -> list[tuple[str | None, str]]:
    return [(r.provider_id, r.state) for r in launches.rows_of(rt, key)]


def _row(rt: Runtime, key: str = "k1", position: int = 1) -> Launch:
    [row] = [r for r in launches.rows_of(rt, key) if r.position == position]
    return row


def _due_ids(rt: Runtime, now: datetime) -> set[int]:
    return {r.id for r in launches.due(rt, now) if r.id is not None}


# --- the states --------------------------------------------------------------------------------


def test_a_rental_goes_from_launching_to_adopted_and_is_due_nowhere_while_held(
    rt: Runtime, clock: Clock
) -> None:
    holder = launches.new_holder()
    _open(rt, holder, "box")
    assert _states(rt) == [(None, "launching")]
    # The call may still run until LAUNCH_CALL has passed: not due before.
    assert _due_ids(rt, T0 + launches.LAUNCH_CALL - timedelta(seconds=1)) == set()
    assert _answer(rt, holder, "i-1")
    row = _row(rt)
    assert (row.state, row.provider_id, row.lease_until) == ("launched", "i-1", T0 + LEASE)
    row_id = row.id
    assert row_id is not None
    assert launches.advance(rt, row_id, holder, launches.CHECKED)
    assert launches.advance(rt, row_id, holder, launches.ADOPTED)
    row = _row(rt)
    assert (row.state, row.holder) == ("adopted", None)
    assert _due_ids(rt, T0 + timedelta(days=30)) == set()  # a final state is never due
    assert not launches.advance(rt, row_id, holder, launches.CHECKED)  # held no more


def test_a_refused_launch_is_settled_and_never_due(rt: Runtime) -> None:
    holder = launches.new_holder()
    _open(rt, holder, "a", "b")
    with rt.db.session() as session:
        assert launches.record_refused(session, "k1", holder, "no capacity", rt.now())
    assert _states(rt) == [(None, "refused"), (None, "refused")]
    assert _due_ids(rt, T0 + timedelta(days=1)) == set()


def test_an_answer_with_fewer_or_more_instances_than_asked_keeps_a_row_for_each(
    rt: Runtime,
) -> None:
    holder = launches.new_holder()
    _open(rt, holder, "a", "b", key="few")
    with rt.db.session() as session:
        assert launches.record_answer(session, "few", holder, ["i-1"], rt.now())
    assert _states(rt, "few") == [("i-1", "launched"), (None, "refused")]
    _open(rt, holder, "c", key="many")
    with rt.db.session() as session:
        assert launches.record_answer(session, "many", holder, ["i-2", "i-3", "i-4"], rt.now())
    rows = launches.rows_of(rt, "many")
    assert [(r.position, r.provider_id, r.state, r.name) for r in rows] == [
        (1, "i-2", "launched", "c"),
        (2, "i-3", "launched", None),  # started unasked: held, so given back or recovered
        (3, "i-4", "launched", None),
    ]


def test_an_answer_after_the_launch_was_taken_over_changes_nothing(
    rt: Runtime, clock: Clock
) -> None:
    holder = launches.new_holder()
    _open(rt, holder, "box")
    late = T0 + launches.LAUNCH_CALL
    assert launches.claim_unanswered(rt, "k1", late, launches.new_holder())
    assert not _answer(rt, holder, "i-1")
    assert _states(rt) == [(None, "launching")]


# --- the claim and its lease -------------------------------------------------------------------


def test_a_live_holder_keeps_its_rows_and_a_dead_one_loses_them_when_the_lease_runs_out(
    rt: Runtime, clock: Clock
) -> None:
    holder = launches.new_holder()
    _open(rt, holder, "box")
    _answer(rt, holder, "i-1")
    for _ in range(10):  # ten heartbeats, each CLAIM_HEARTBEAT_S apart: never due
        clock.advance(seconds=launches.CLAIM_HEARTBEAT_S)
        assert launches.renew(rt, "k1", holder) == 1
        assert _due_ids(rt, clock.now) == set()
    assert _row(rt).lease_until == clock.now + LEASE
    # The holder dies: the row is due exactly when its lease runs out.
    assert _due_ids(rt, clock.now + LEASE - timedelta(seconds=1)) == set()
    assert _due_ids(rt, clock.now + LEASE) == {_row(rt).id}


def test_of_two_claimers_of_a_due_row_one_wins(rt: Runtime, clock: Clock) -> None:
    holder = launches.new_holder()
    _open(rt, holder, "box")
    _answer(rt, holder, "i-1")
    later = T0 + LEASE
    [due] = launches.due(rt, later)
    first = launches.claim_orphan(rt, due, later, "claimer-1", reason=rent.STOPPED_WHILE_SETTING_UP)
    second = launches.claim_orphan(
        rt, due, later, "claimer-2", reason=rent.STOPPED_WHILE_SETTING_UP
    )
    assert first is not None
    assert second is None
    assert (first.state, first.holder, first.lease_until) == (
        "orphaned",
        "claimer-1",
        later + LEASE,
    )
    assert first.reason == rent.STOPPED_WHILE_SETTING_UP
    # The dead holder, were it alive after all, can move nothing now.
    assert first.id == due.id
    assert not launches.advance(rt, first.id, holder, launches.CHECKED)
    assert launches.give_up(rt, first.id, holder, reason="x") is None
    assert launches.renew(rt, "k1", holder) == 0
    # While the claim holds, the row is not due; once it runs out, it is again.
    assert _due_ids(rt, later + LEASE - timedelta(seconds=1)) == set()
    assert _due_ids(rt, later + LEASE) == {due.id}


def _race(rt: Runtime, other: Runtime, claim: Callable[[Runtime, str], T]) -> list[T]:
    """``claim`` from two runtimes on one store at once, each on its own thread."""
    barrier = threading.Barrier(2)

    def run(args: tuple[Runtime, str]) -> T:
        barrier.wait(timeout=10)
        return claim(*args)

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(run, ((rt, "claimer-1"), (other, "claimer-2"))))


def test_two_processes_claiming_at_once_one_wins_each_time(rt: Runtime, clock: Clock) -> None:
    other = make_runtime(rt.db, clock)
    for n in range(5):
        holder = launches.new_holder()
        _open(rt, holder, "box", key=f"k{n}")
        _answer(rt, holder, f"i-{n}", key=f"k{n}")
    later = T0 + LEASE
    for row in launches.due(rt, later):
        won = _race(
            rt,
            other,
            lambda runtime, who, row=row: launches.claim_orphan(  # type: ignore[misc]
                runtime, row, later, who, reason="r"
            ),
        )
        assert sorted(w is not None for w in won) == [False, True]


def test_two_processes_taking_an_unanswered_launch_at_once_one_wins(
    rt: Runtime, clock: Clock
) -> None:
    other = make_runtime(rt.db, clock)
    _open(rt, launches.new_holder(), "a", "b")
    later = T0 + launches.LAUNCH_CALL
    won = _race(
        rt, other, lambda runtime, who: launches.claim_unanswered(runtime, "k1", later, who)
    )
    assert sorted(len(w) for w in won) == [0, 2]


def test_what_an_unanswered_launch_started_becomes_orphans_and_the_rest_is_settled(
    rt: Runtime,
) -> None:
    _open(rt, launches.new_holder(), "a", "b", "c")
    later = T0 + launches.LAUNCH_CALL
    claims = launches.claim_unanswered(rt, "k1", later, "recoverer")
    assert [c.position for c in claims] == [1, 2, 3]
    with rt.db.session() as session:
        orphans = launches.found_unanswered(
            session, claims, ["i-1"], later, reason=rent.ANSWER_NEVER_CAME
        )
    assert [(o.provider_id, o.state, o.holder, o.reason) for o in orphans] == [
        ("i-1", "orphaned", "recoverer", rent.ANSWER_NEVER_CAME)
    ]
    assert _states(rt) == [("i-1", "orphaned"), (None, "terminated"), (None, "terminated")]


def test_a_failed_termination_is_due_again_later_and_a_settled_one_never(
    rt: Runtime, clock: Clock
) -> None:
    holder = launches.new_holder()
    _open(rt, holder, "box")
    _answer(rt, holder, "i-1")
    row = _row(rt)
    assert row.id is not None
    claim = launches.give_up(rt, row.id, holder, reason=rent.COULD_NOT_REGISTER)
    assert claim is not None
    assert (claim.state, claim.holder) == ("orphaned", holder)
    with rt.db.session() as session:
        assert launches.retry_later(session, claim, T0, error="HTTP 500", told=True)
    row = _row(rt)
    assert (row.attempts, row.told_at, row.holder) == (1, T0, None)
    assert _due_ids(rt, T0 + timedelta(seconds=launches.RETRY_S - 1)) == set()
    retry_at = T0 + timedelta(seconds=launches.RETRY_S)
    [due] = launches.due(rt, retry_at)
    again = launches.claim_orphan(rt, due, retry_at, "recoverer", reason="other")
    assert again is not None
    assert (again.reason, again.told) == (rent.COULD_NOT_REGISTER, True)  # kept
    with rt.db.session() as session:
        assert not launches.settle(session, claim, "terminated", retry_at, detail="late")  # stale
        assert launches.settle(session, again, "terminated", retry_at, detail="terminated")
    assert _states(rt) == [("i-1", "terminated")]
    assert _due_ids(rt, retry_at + timedelta(days=1)) == set()


# --- recovery, end to end on the scripted platform ----------------------------------------------


def test_recovery_terminates_a_dead_holder_s_instance_once_and_records_it(
    rt: Runtime, clock: Clock, platform: ScriptedPlatform
) -> None:
    other = make_runtime(rt.db, clock, providers=[platform])
    holder = launches.new_holder()
    _open(rt, holder, "box")
    _answer(rt, holder, "i-1")
    assert rent.recover_orphans(rt, T0 + LEASE - timedelta(seconds=1)) == []
    later = T0 + LEASE
    done = _race(rt, other, lambda runtime, _who: rent.recover_orphans(runtime, later))
    assert sorted(done) == [[], ["i-1"]]
    assert platform.release_calls == [("i-1", "terminate")]
    assert _states(rt) == [("i-1", "terminated")]
    with rt.db.session() as session:
        actions = session.exec(select(AuditLog.action)).all()
    assert actions == ["rent_recovered"]  # the log says what happened, once
    assert rent.recover_orphans(rt, later + timedelta(days=1)) == []


def test_an_orphan_registered_after_all_is_adopted_not_terminated(
    rt: Runtime, clock: Clock, platform: ScriptedPlatform
) -> None:
    holder = launches.new_holder()
    _open(rt, holder, "box")
    _answer(rt, holder, "i-1")
    add_instance(rt.db, name="box", provider="scripted", provider_instance_id="i-1")
    assert rent.recover_orphans(rt, T0 + LEASE) == []
    assert platform.release_calls == []
    assert _states(rt) == [("i-1", "adopted")]


def test_rentals_in_progress_are_what_reconcile_leaves_alone(rt: Runtime) -> None:
    for key, state, provider_id in (
        ("k1", "launching", None),
        ("k2", "launched", "i-2"),
        ("k3", "checked", "i-3"),
        ("k4", "orphaned", "i-4"),
        ("k5", "adopted", "i-5"),
        ("k6", "terminated", "i-6"),
        ("k7", "refused", None),
    ):
        with rt.db.session() as session:
            session.add(
                Launch(
                    launch_key=key,
                    position=1,
                    provider="scripted",
                    instance_type="gpu",
                    platform_name=f"box-{key}",
                    renter="UOWNER",
                    provider_id=provider_id,
                    state=state,
                    lease_until=T0,
                    started_at=T0,
                    changed_at=T0,
                )
            )
    held = launches.recent_launches(rt)
    assert held.ids == {("scripted", "i-2"), ("scripted", "i-3"), ("scripted", "i-4")}
    assert held.names == {("scripted", "box-k1")}


# --- the due clause ----------------------------------------------------------------------------

_OFFSETS_S = (-3600, -61, -60, -45, -1, 0, 1, 45, 60, 600)


def _random_rows(rt: Runtime, seed: int) -> None:
    rng = random.Random(seed)
    with rt.db.session() as session:
        for n in range(40):
            session.add(
                Launch(
                    launch_key=f"r{n}",
                    position=1,
                    provider="scripted",
                    instance_type="gpu",
                    platform_name="",  # a launch without a name finds nothing to terminate
                    renter="UOWNER",
                    provider_id=None if rng.random() < 0.3 else f"i-{n}",
                    state=rng.choice(launches.STATES),
                    holder=rng.choice((None, "someone")),
                    lease_until=T0 + timedelta(seconds=rng.choice(_OFFSETS_S)),
                    started_at=T0 - timedelta(hours=1),
                    changed_at=T0 - timedelta(hours=1),
                )
            )


def _expected(rt: Runtime, now: datetime) -> set[int]:
    with rt.db.session() as session:
        rows = session.exec(select(Launch)).all()
    return {
        r.id
        for r in rows
        if r.id is not None and r.state in launches.IN_PROGRESS and r.lease_until <= now
    }


def _check(rt: Runtime, now: datetime) -> bool:
    with rt.db.session() as session:
        row = session.execute(tick_module._probe(rt, now)).one()
    return bool(row._mapping["rent_orphans"])


def test_the_due_clause_selects_exactly_the_rows_in_progress_past_their_lease(
    rt: Runtime,
) -> None:
    for seed in (1, 2, 3):
        _random_rows(rt, seed)
        for offset_s in (-7200, *_OFFSETS_S, 7200):
            now = T0 + timedelta(seconds=offset_s)
            expected = _expected(rt, now)
            assert _due_ids(rt, now) == expected, now
            assert _check(rt, now) == bool(expected), now
        with rt.db.session() as session:
            for row in session.exec(select(Launch)).all():
                session.delete(row)


def test_every_row_recovery_takes_makes_its_check_true(
    rt: Runtime, platform: ScriptedPlatform
) -> None:
    _random_rows(rt, 7)
    now = T0
    before = _expected(rt, now)
    assert before
    assert _check(rt, now)
    rent.recover_orphans(rt, now)
    with rt.db.session() as session:
        changed = set(session.exec(select(Launch.id).where(col(Launch.changed_at) == now)).all())
    assert changed
    assert changed <= before  # it touched nothing its clause did not select
    terminated = {pid for pid, _mode in platform.release_calls}
    with rt.db.session() as session:
        due_ids = set(
            session.exec(select(Launch.provider_id).where(col(Launch.id).in_(before))).all()
        )
    assert terminated <= due_ids
    # Whatever is left is not due until its new lease runs out.
    assert not _check(rt, now)
