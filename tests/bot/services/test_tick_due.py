"""What is due is looked up first: a tick with nothing due makes one query for the checked
steps and skips them; a step with work runs, and the steps after it see what it made."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import event

from bot.services import outbox, releases
from bot.services import tick as tick_module
from bot.services.tick import DUE_CHECKS, tick
from bot.store.db import Database
from tests.bot.services.support import T0, Clock, add_instance, get_instance, make_runtime

#: Not the first tick of a FULL_TICK_EVERY_S slot: the checks decide.
MID_SLOT = T0 + timedelta(seconds=90)


@contextmanager
def _counting(db: Database) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", count)


def _selects(statements: list[str]) -> list[str]:
    return [s for s in statements if s.lstrip().upper().startswith("SELECT")]


def test_a_tick_with_nothing_due_asks_once_and_skips_the_checked_steps(db):
    clock = Clock(MID_SLOT)
    rt = make_runtime(db, clock, poll_interval_s=60)
    for n in range(20):
        add_instance(
            rt.db,
            name=f"box{n}",
            deadline_at=T0 + timedelta(days=1),
            last_polled_at=MID_SLOT,
            poll_due_at=MID_SLOT + timedelta(seconds=30),
            ledger_due_at=T0 + timedelta(hours=1),
        )
    with _counting(rt.db) as statements:
        report = tick(rt, clock.now)
    assert report.errors == []
    assert sorted(report.skipped) == sorted(DUE_CHECKS)
    assert all(report.durations_s[name] == 0.0 for name in DUE_CHECKS)
    # One SELECT for every checked step, and the digest's own (it has no check).
    assert len(_selects(statements)) == 3, _selects(statements)


def test_the_first_tick_of_a_slot_runs_every_step(sqlite_db):
    rt = make_runtime(sqlite_db, Clock(T0), poll_interval_s=60)
    assert tick_module._full_tick(rt, T0)
    assert tick(rt, T0).skipped == []
    assert tick(rt, T0 + timedelta(seconds=30)).skipped == sorted(
        DUE_CHECKS, key=list(DUE_CHECKS).index
    )


def test_a_step_s_work_is_seen_by_the_steps_after_it_in_the_same_tick(sqlite_db):
    clock = Clock(MID_SLOT)
    rt = make_runtime(sqlite_db, clock, poll_interval_s=10**7, channel="COPS")
    warned = add_instance(
        rt.db, name="warned", deadline_at=MID_SLOT + timedelta(minutes=20), last_polled_at=T0
    )
    released = add_instance(rt.db, name="gone", last_polled_at=T0)
    releases.request_release(rt, released, reason="user", requested_by="UOWNER", now=MID_SLOT)
    with rt.db.session() as session:
        outbox.enqueue(
            session, key="k1", kind="notice", recipient="COPS", text="hello", now=MID_SLOT
        )
    report = tick(rt, clock.now)
    # deadlines made a warning, the prompts step posted it; the due release and message went.
    assert "deadlines" not in report.skipped
    assert report.prompts_posted == 1
    assert rt.notifier.containing("*warned* will be released")
    assert report.outbox_posted >= 1
    assert report.releases_processed == 1
    assert get_instance(rt.db, released).state == "awaiting_confirmation"  # manual: owner confirms
    assert get_instance(rt.db, warned).state == "active"
    assert {"poll", "idle", "jobs_done", "jobs", "budgets"} <= set(report.skipped)


def test_a_failing_lookup_runs_every_step(sqlite_db, monkeypatch):
    rt = make_runtime(sqlite_db, Clock(MID_SLOT), poll_interval_s=60)

    def broken(rt: Any) -> Any:
        raise RuntimeError("a check that breaks")

    monkeypatch.setitem(DUE_CHECKS, "poll", broken)
    report = tick(rt, MID_SLOT)
    assert report.skipped == []
    assert report.errors == []


def test_a_clock_that_steps_past_the_tick_interval_still_reconciles_every_slot(sqlite_db):
    """The console's `:tick` steps by the poll interval (60 s) while ticks are 30 s apart: a
    reconcile slot that starts between two of its ticks is still reconciled, once."""
    rt = make_runtime(sqlite_db, Clock(T0), poll_interval_s=60, tick_interval_s=30)
    start = T0 + timedelta(seconds=45)  # the 5-minute slots start 15 s after a tick
    reconciled = []
    for step in range(30):
        now = start + timedelta(minutes=step)
        if "reconcile" in tick(rt, now).durations_s:
            reconciled.append(now)
    assert [at - start for at in reconciled] == [timedelta(minutes=m) for m in (5, 10, 15, 20, 25)]
