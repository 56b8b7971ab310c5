"""The store's gauges for /metrics as the clock last read them: a scrape never waits on a hung
database past a first reading's second, one reading at a time, and a reading too old is not
served."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from bot.errors import StoreError
from bot.metrics import Metrics
from bot.store.db import Database
from bot.store.stats import CachedStats, read_stats

UTC = ZoneInfo("UTC")


class Seconds:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_clock_s_reading_is_served_until_it_is_too_old(sqlite_db: Database) -> None:
    reads: list[int] = []

    def read():  # type: ignore[no-untyped-def]
        reads.append(1)
        return read_stats(sqlite_db, datetime(2026, 12, 4), tz=UTC, poll_interval_s=60)

    seconds = Seconds()
    gauges = CachedStats(read, max_age_s=90, clock=seconds)
    gauges.refresh()  # what the clock does after a tick
    first = gauges.stats()
    seconds.now += 60
    assert gauges.stats() is first
    assert len(reads) == 1  # scrapes read nothing themselves
    seconds.now += 31
    with pytest.raises(StoreError, match="91 s old: the store has not answered since"):
        gauges.stats()


def test_a_hung_store_holds_a_scrape_one_second_and_starts_one_reading() -> None:
    release = threading.Event()
    started: list[float] = []

    def hung():  # type: ignore[no-untyped-def]
        started.append(time.monotonic())
        release.wait(30)
        raise StoreError("the database failed: it hung")

    gauges = CachedStats(hung, max_age_s=90, wait_s=0.5)
    try:
        took = time.monotonic()
        text, _ = Metrics().exposition(gauges.stats)
        took = time.monotonic() - took
        assert took < 2.0
        assert "gpubot_store_up 0.0" in text.decode()
        for _ in range(3):  # more scrapes while it hangs: no second reading
            with pytest.raises(StoreError, match=r"did not answer within 0\.5 s"):
                gauges.stats()
        gauges.refresh()  # the clock's own try returns at once: one reading at a time
        assert len(started) == 1
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while gauges._reading is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(StoreError, match="it hung"):
        gauges.stats()  # what went wrong is said, and a new reading is started
