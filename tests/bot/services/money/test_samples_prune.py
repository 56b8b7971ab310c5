"""The prune of raw samples keeps up with what a large fleet writes, in bounded slices."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, insert
from sqlmodel import col, select

import bot.timebox
from bot.services.money import samples
from bot.services.tick import PRUNE_EVERY_S, tick
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import UtilSample
from bot.timebox import Timebox
from tests.bot.services.support import Clock, add_instance, make_runtime

#: A slot boundary of the prune (the clock's start).
START = datetime(2026, 3, 5, 8, 0)
RETENTION = timedelta(days=Settings().sample_retention_days)
#: Twice what 2,000 instances polled once a minute write in one prune slot.
FLEET = 2_000
PER_SLOT = 2 * FLEET * PRUNE_EVERY_S // 60
SLOTS = 4


def _write(db: Database, instance_ids: list[int], start: datetime, count: int) -> None:
    """``count`` samples evenly over the prune slot from ``start``."""
    step_s = PRUNE_EVERY_S / count
    rows = [
        {
            "instance_id": instance_ids[index % len(instance_ids)],
            "at": start + timedelta(seconds=index * step_s),
            "ok": True,
            "util_avg_pct": 50.0,
        }
        for index in range(count)
    ]
    with db.session() as session:
        session.execute(insert(UtilSample), rows)


def _count(db: Database, *where: Any) -> int:
    with db.read_session() as session:
        return int(session.exec(select(func.count()).select_from(UtilSample).where(*where)).one())


def test_the_prune_keeps_up_with_twice_the_samples_of_two_thousand_instances(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Time stands still for the time boxes: what is pruned depends on the sizes alone.
    monkeypatch.setattr(bot.timebox, "monotonic", lambda: 0.0)
    assert (START - datetime(1970, 1, 1)).total_seconds() % PRUNE_EVERY_S == 0
    instance_ids = [add_instance(db, name=f"box{i}") for i in range(20)]
    clock = Clock(START)
    rt = make_runtime(db, clock, poll_interval_s=10**7)
    for slot in range(SLOTS + 1):
        _write(
            db, instance_ids, START - RETENTION + slot * timedelta(seconds=PRUNE_EVERY_S), PER_SLOT
        )
    for slot in range(1, SLOTS + 1):
        clock.set(START + slot * timedelta(seconds=PRUNE_EVERY_S))
        report = tick(rt, clock.now)
        assert "prune" in report.durations_s
        cutoff = clock.now - RETENTION
        assert _count(db, col(UtilSample.at) < cutoff) == 0  # nothing left behind
        assert _count(db) == (SLOTS + 1 - slot) * PER_SLOT  # and nothing newer lost


def test_a_backlog_is_cleared_in_bounded_slices(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(samples, "PRUNE_BATCH", 10)
    monkeypatch.setattr(samples, "PRUNE_BATCHES_PER_CALL", 3)
    instance_ids = [add_instance(db, name=f"box{i}") for i in range(3)]
    _write(db, instance_ids, START, 95)
    rt = make_runtime(db, Clock(START + RETENTION + timedelta(days=1)))
    deleted = [samples.prune(rt, rt.now()) for _ in range(5)]
    assert deleted == [30, 30, 30, 5, 0]


def test_the_prune_takes_no_batch_past_its_time_box(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(samples, "PRUNE_BATCH", 10)
    instance_ids = [add_instance(db, name=f"box{i}") for i in range(3)]
    _write(db, instance_ids, START, 95)
    rt = make_runtime(db, Clock(START + RETENTION + timedelta(days=1)))
    at = [0.0]

    def ticking() -> float:
        at[0] += 1.0  # each reading a second later: a batch takes about a second
        return at[0]

    monkeypatch.setattr(bot.timebox, "monotonic", ticking)
    first = samples.prune(rt, rt.now(), box=Timebox.open(4.0))
    assert 0 < first < 95
    assert first % 10 == 0
    rest = samples.prune(rt, rt.now())
    assert first + rest == 95
