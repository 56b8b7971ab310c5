"""The team's figures on Home and in `/gpu list` as the clock read them: a person's view reads
no more of the team than its own instances while the reading is fresh, and reads afresh once
it ages out."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from bot.runtime import Runtime
from bot.services.instances import fleet_views
from tests.bot.services.support import Clock, add_instance, make_runtime


@pytest.fixture
def rt(db) -> Runtime:
    return make_runtime(db, Clock(), tick_interval_s=60)


def _statements(rt: Runtime) -> list[str]:
    seen: list[str] = []
    event.listen(rt.db.engine, "before_cursor_execute", lambda *a: seen.append(str(a[2])))
    return seen


def test_the_clock_s_reading_is_served_without_the_database_until_it_ages_out(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(3):
        add_instance(rt.db, name=f"box{n}", deadline_at=rt.now())
    fleet_views.refresh_summary(rt)
    add_instance(rt.db, name="late")  # registered after the clock's reading
    seen = _statements(rt)
    kept = fleet_views.fleet_summary(rt, nearest=2)
    assert seen == []  # no query of the team
    assert kept.count == 3
    assert [d.name for d in kept.nearest] == ["box0", "box1"]
    assert fleet_views.read_summary(rt).count == 4  # what the store says now
    fleet_views.refresh_summary(rt)  # the next tick
    assert fleet_views.fleet_summary(rt).count == 4
    # A reading older than two tick intervals is not served: the clock has stopped.
    later = fleet_views.time.monotonic() + 2 * 60 + 1
    monkeypatch.setattr(fleet_views.time, "monotonic", lambda: later)
    add_instance(rt.db, name="after")
    assert fleet_views.fleet_summary(rt).count == 5


def test_without_a_clock_reading_the_figures_are_read_now(rt: Runtime) -> None:
    add_instance(rt.db, name="box")
    assert fleet_views.fleet_summary(rt).count == 1
