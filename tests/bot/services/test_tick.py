"""The tick itself: its steps run with (rt, now); a failing step is logged and the
others still run; reconcile runs once per slot."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.services import tick as tick_module
from bot.services.tick import RECONCILE_EVERY_S, tick
from tests.bot.services.support import (
    T0,
    Clock,
    ScriptedPlatform,
    add_instance,
    get_instance,
    make_runtime,
)

CALLS: list[tuple[str, object]] = []


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch):
    def with_now(rt, now):
        CALLS.append(("with_now", now))

    def also(rt, now):
        CALLS.append(("also", now))

    def broken(rt, now):
        raise RuntimeError("a step that breaks")

    monkeypatch.setattr(
        tick_module, "TICK_STEPS", [("broken", broken), ("with_now", with_now), ("also", also)]
    )
    CALLS.clear()
    return CALLS


def test_steps_run_and_a_broken_one_stops_nothing(sqlite_db, steps):
    clock = Clock(T0 + timedelta(hours=2))
    rt = make_runtime(sqlite_db, clock, poll_interval_s=10**7)
    iid = add_instance(rt.db, deadline_at=T0 + timedelta(hours=1), last_polled_at=T0)
    report = tick(rt, clock.now)
    assert report.errors == ["broken"]
    assert steps == [("with_now", clock.now), ("also", clock.now)]
    # The rules after the broken step still ran: the late warning went out.
    assert report.prompts_posted == 1
    assert get_instance(rt.db, iid).state == "active"


def test_reconcile_runs_once_per_slot_and_notes_a_stop_outside(sqlite_db):
    clock = Clock(T0)
    platform = ScriptedPlatform()
    rt = make_runtime(sqlite_db, clock, providers=[platform], poll_interval_s=10**7)
    iid = add_instance(
        rt.db,
        provider="scripted",
        provider_instance_id="i-1",
        created_at=T0 - timedelta(hours=1),
        last_polled_at=T0,
    )
    reconciled = []
    while clock.now < T0 + timedelta(seconds=3 * RECONCILE_EVERY_S):
        report = tick(rt, clock.now)
        if "reconcile" not in report.errors and tick_module._reconcile_due(rt, clock.now):
            reconciled.append(clock.now)
        clock.advance(seconds=30)
    assert reconciled == [T0 + timedelta(seconds=i * RECONCILE_EVERY_S) for i in range(3)]

    platform.state = "stopped"
    clock.set(T0 + timedelta(seconds=3 * RECONCILE_EVERY_S))
    assert tick(rt, clock.now).reconciled == [iid]
    inst = get_instance(rt.db, iid)
    assert inst.state == "stopped"  # still registered: its disk bills on
    assert inst.release_mode == "stop"
    assert inst.stopped_at == clock.now
    assert inst.storage_deleted_at is None
    assert "was stopped on scripted outside the bot" in rt.notifier.posts[-1].text
