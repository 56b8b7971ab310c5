"""Utilisation samples: rolled up by hour as they are recorded, pruned after their retention."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlmodel import col, func, select

from bot.services.money import samples
from bot.services.tick import PRUNE_EVERY_S, tick
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import UtilHour, UtilSample
from tests.bot.services.support import Clock, add_instance, make_runtime

HOUR = datetime(2026, 3, 5, 8, 0)
UTC = ZoneInfo("UTC")


def _record(db: Database, iid: int, at: datetime, **fields: object) -> None:
    with db.session() as session:
        samples.record(session, UtilSample(instance_id=iid, at=at, **fields), UTC)


def _hours(db: Database, iid: int) -> list[UtilHour]:
    with db.session() as session:
        return list(
            session.exec(
                select(UtilHour)
                .where(UtilHour.instance_id == iid)
                .order_by(col(UtilHour.bucket_start))
            ).all()
        )


def test_each_sample_counts_in_its_hour(db: Database) -> None:
    iid = add_instance(db, created_at=HOUR - timedelta(days=1))
    _record(db, iid, HOUR + timedelta(minutes=1), ok=True, util_avg_pct=3.0)
    _record(db, iid, HOUR + timedelta(minutes=59, seconds=59), ok=True, util_avg_pct=12.5)
    _record(db, iid, HOUR + timedelta(hours=1), ok=True, util_avg_pct=0.0)
    _record(db, iid, HOUR + timedelta(hours=1, minutes=30), ok=False)
    _record(db, iid, HOUR + timedelta(hours=1, minutes=31), ok=True, util_avg_pct=None)
    first, second = _hours(db, iid)
    assert first.bucket_start == HOUR
    assert second.bucket_start == HOUR + timedelta(hours=1)
    assert (first.polls, first.bad_polls, first.max_util_pct) == (2, 0, 12.5)
    assert (second.polls, second.bad_polls, second.max_util_pct) == (3, 2, 0.0)


def test_pruning_deletes_only_samples_past_retention_and_keeps_the_hours(db: Database) -> None:
    iid = add_instance(db)
    for minute in range(10):
        _record(db, iid, HOUR + timedelta(minutes=minute), ok=True, util_avg_pct=1.0)
    retention = timedelta(days=Settings().sample_retention_days)
    rt = make_runtime(db, Clock(HOUR + retention + timedelta(minutes=5)))
    assert samples.prune(rt, rt.now()) == 5  # minutes 0-4 are past the retention
    with db.session() as session:
        left = session.exec(select(func.count()).select_from(UtilSample)).one()
    assert left == 5
    (hour,) = _hours(db, iid)
    assert hour.polls == 10  # what reports read stays whole


DAY = timedelta(days=1)
SECOND = timedelta(seconds=1)
#: Sample ages around 31, 35 and 90 days: one exactly at each, one a second past it.
AGES = (0 * DAY, 30 * DAY, 31 * DAY, 31 * DAY + SECOND, 35 * DAY, 35 * DAY + SECOND, 90 * DAY)
AGES_PAST_ALL = (90 * DAY + SECOND, 150 * DAY)


@pytest.mark.parametrize(
    ("retention_days", "kept"),
    [
        (31, (0 * DAY, 30 * DAY, 31 * DAY)),
        (35, (0 * DAY, 30 * DAY, 31 * DAY, 31 * DAY + SECOND, 35 * DAY)),
        (90, AGES),
    ],
    ids=["shorter", "default", "longer"],
)
def test_the_configured_retention_decides_what_is_pruned(
    db: Database, retention_days: int, kept: tuple[timedelta, ...]
) -> None:
    iid = add_instance(db)
    now = HOUR + 200 * DAY
    for age in (*AGES, *AGES_PAST_ALL):
        _record(db, iid, now - age, ok=True, util_avg_pct=1.0)
    rt = make_runtime(db, Clock(now), sample_retention_days=retention_days)
    assert samples.prune(rt, rt.now()) == len(AGES) + len(AGES_PAST_ALL) - len(kept)
    with db.session() as session:
        left = session.exec(select(UtilSample.at).order_by(col(UtilSample.at).desc())).all()
    assert left == [now - age for age in kept]


def test_pruning_is_bounded_per_call(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    iid = add_instance(db)
    monkeypatch.setattr(samples, "PRUNE_BATCH", 3)
    monkeypatch.setattr(samples, "PRUNE_BATCHES_PER_CALL", 2)
    for minute in range(10):
        _record(db, iid, HOUR + timedelta(minutes=minute), ok=True, util_avg_pct=1.0)
    rt = make_runtime(db, Clock(HOUR + timedelta(days=100)))
    assert samples.prune(rt, rt.now()) == 6
    assert samples.prune(rt, rt.now()) == 4
    assert samples.prune(rt, rt.now()) == 0


def test_the_clock_prunes_once_a_slot_whatever_the_processes(db: Database) -> None:
    iid = add_instance(db, last_polled_at=HOUR + timedelta(days=200))
    _record(db, iid, HOUR, ok=True, util_avg_pct=1.0)
    start = HOUR + timedelta(days=100)
    clock = Clock(
        start - timedelta(seconds=(start - datetime(1970, 1, 1)).total_seconds() % PRUNE_EVERY_S)
    )
    first, second = (make_runtime(db, clock, poll_interval_s=10**7) for _ in range(2))
    assert "prune" in tick(first, clock.now).durations_s
    assert "prune" not in tick(second, clock.now).durations_s  # the same slot: claimed
    clock.advance(seconds=30)
    assert "prune" not in tick(first, clock.now).durations_s
    with db.session() as session:
        assert session.exec(select(func.count()).select_from(UtilSample)).one() == 0


def test_samples_go_to_the_bucket_of_the_charge_they_fall_in(db: Database) -> None:
    # Billing starts at 08:20 and Kolkata's month starts at 18:30 UTC: buckets split there.
    kolkata = ZoneInfo("Asia/Kolkata")
    iid = add_instance(db, created_at=HOUR + timedelta(minutes=20))
    month_start = datetime(2026, 3, 31, 18, 30)  # April 1st, 00:00 in Kolkata
    for at in (
        HOUR + timedelta(minutes=10),  # before billing: the hour, matching no charge
        HOUR + timedelta(minutes=25),
        HOUR + timedelta(minutes=55),
        month_start - timedelta(minutes=1),
        month_start + timedelta(minutes=1),
    ):
        with db.session() as session:
            samples.record(
                session, UtilSample(instance_id=iid, at=at, ok=True, util_avg_pct=1), kolkata
            )
    starts = [(h.bucket_start, h.polls) for h in _hours(db, iid)]
    assert starts == [
        (HOUR, 1),
        (HOUR + timedelta(minutes=20), 2),
        (datetime(2026, 3, 31, 18, 0), 1),
        (month_start, 1),
    ]


def test_each_gpu_of_a_poll_is_judged_idle_in_use_or_not_measured() -> None:
    from tests.agents.factories import make_gpu, make_nvml_error, make_process, make_status

    status = make_status(
        [
            make_gpu(0, util_gpu_pct=4),
            make_gpu(1, util_gpu_pct=5),
            make_gpu(2, util_gpu_pct=0),
            make_gpu(3, util_gpu_pct=None),
        ],
        processes=[make_process(gpu_index=2)],
    )
    assert samples.judge_gpus(status, 5.0) == samples.GpuStates(idle=1, busy=2, unmeasured=1)
    assert samples.judge_gpus(status, 50.0) == samples.GpuStates(idle=2, busy=1, unmeasured=1)
    broken = make_status(nvml_error=make_nvml_error())
    assert samples.judge_gpus(broken, 5.0) == samples.GpuStates(idle=0, busy=0, unmeasured=0)


def test_a_failed_poll_counts_every_gpu_of_the_instance_not_measured(db: Database) -> None:
    iid = add_instance(db, created_at=HOUR - timedelta(days=1), gpu_count=8)
    _record(
        db, iid, HOUR + timedelta(minutes=1), ok=True, util_avg_pct=2.0, gpus_idle=7, gpus_busy=1
    )
    _record(db, iid, HOUR + timedelta(minutes=2), ok=False)
    # A poll that read no GPU (NVML failed) stands for all of them too.
    _record(db, iid, HOUR + timedelta(minutes=3), ok=True, util_avg_pct=None)
    [hour] = _hours(db, iid)
    assert (hour.idle_gpu_samples, hour.busy_gpu_samples, hour.unmeasured_gpu_samples) == (7, 1, 16)
    assert (hour.polls, hour.bad_polls) == (3, 2)
