"""The tick's log through a store outage: each failing step (and the look-up of what is due) is
logged once with its traceback, then once a minute of the tick's clock with how often it failed,
and once when it works again; every line of one tick carries that tick's request id."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest

from bot.logging_setup import REQUEST_ID_LENGTH, ContextIds, RepeatLimiter
from bot.runtime import Runtime
from bot.services import tick as tick_module
from bot.services.tick import tick
from bot.store.db import Database
from tests.bot.services.support import T0, Clock, make_runtime

#: Seconds between ticks; the TICKS ticks from START (the one before it too) stay within one
#: reconcile and prune slot (T0 starts one), so no claim of those is made.
INTERVAL_S = 10
START = T0 + timedelta(seconds=15)
TICKS = 28

_FAILED = re.compile(r"tick (step (?P<step>\w+)|look-up of what is due) failed")
#: A step's wall time past its budget is logged too; under load a step that fails at once can
#: take that long, so those lines (tested in test_tick_budgets) are left out here.
_OVER_BUDGET = re.compile(r"tick step \w+ took [\d.]+ s, past its budget")
_COUNTED = re.compile(r"failed (?P<count>\d+) times in the last (?P<window>\d+) s \(latest: ")


@pytest.fixture(autouse=True)
def fresh_limiter(monkeypatch: pytest.MonkeyPatch) -> RepeatLimiter:
    """A limiter of this test's own (the process's remembers other tests' failures)."""
    limiter = RepeatLimiter()
    monkeypatch.setattr(tick_module, "STEP_FAILURES", limiter)
    return limiter


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Every record of bot.services.tick but the over-budget lines, stamped with the context's
    ids as a handler is."""
    caught: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not _OVER_BUDGET.match(record.getMessage()):
                caught.append(record)

    handler = Keep(logging.DEBUG)
    handler.addFilter(ContextIds())
    logger = logging.getLogger("bot.services.tick")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield caught
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _down(rt: Runtime) -> Runtime:
    """``rt`` with its store on a PostgreSQL port nothing listens on: every session fails."""
    return replace(rt, db=Database(f"postgresql://gpubot@127.0.0.1:{_closed_port()}/gpubot"))


def _key(record: logging.LogRecord) -> str | None:
    found = _FAILED.search(record.getMessage())
    return None if found is None else found["step"] or "due"


def test_a_store_outage_logs_one_line_per_failing_step_a_minute(
    sqlite_db: Database, records: list[logging.LogRecord]
) -> None:
    clock = Clock(START)
    rt = make_runtime(sqlite_db, clock, tick_interval_s=INTERVAL_S)
    down = _down(rt)
    failing: set[str] = set()
    for n in range(TICKS):
        report = tick(down, START + timedelta(seconds=n * INTERVAL_S))
        failing.update(report.errors)
    assert {"poll", "jobs", "ledger", "budgets", "outbox", "releases"} <= failing

    by_key: dict[str, list[logging.LogRecord]] = {}
    for record in records:
        key = _key(record)
        assert key is not None, record.getMessage()  # nothing else is logged
        by_key.setdefault(key, []).append(record)
    assert set(by_key) == failing | {"due"}
    # 28 ticks over 4.5 minutes: the first failure, then one line at each new minute.
    for key, lines in by_key.items():
        assert len(lines) == 5, (key, [r.getMessage() for r in lines])
        first, *later = lines
        assert first.levelno == logging.ERROR
        assert first.exc_info is not None  # the traceback, once
        assert _COUNTED.search(first.getMessage()) is None
        for line in later:
            assert line.exc_info is None
            counted = _COUNTED.search(line.getMessage())
            assert counted is not None, line.getMessage()
            # Six failures a minute (one a tick) since the line before, this one included.
            assert (counted["count"], counted["window"]) == ("6", "60")
            assert "StoreError" in line.getMessage()
    # A traceback per failing step and tick before; now five lines a step in 28 ticks.
    assert len(records) == 5 * len(by_key)


def test_a_step_that_works_again_says_so_once(
    sqlite_db: Database, records: list[logging.LogRecord]
) -> None:
    clock = Clock(START)
    rt = make_runtime(sqlite_db, clock, tick_interval_s=INTERVAL_S)
    down = _down(rt)
    at = [START + timedelta(seconds=n * INTERVAL_S) for n in range(13)]
    for now in at[:3]:  # three failing ticks: the first logged, two held back
        tick(down, now)
    failed = {_key(r) for r in records}
    held = len(records)
    assert held == len(failed) > 5
    for now in at[3:6]:  # working again within the minute of that line: nothing yet
        assert tick(rt, now).errors == []
    assert len(records) == held
    ran = {"due"}  # the look-up of what is due is made on every tick
    for now in at[6:12]:  # once the minute is over: one line per step that ran, and worked
        report = tick(rt, now)
        assert report.errors == []
        ran |= set(report.durations_s) - set(report.skipped)
    again = {_again(r.getMessage()): r.getMessage() for r in records[held:]}
    assert len(again) == len(records) - held  # one line each
    assert set(again) == failed & ran
    assert {"due", "digest"} <= set(again)
    assert all(m.endswith("works again (2 failures since the last line)") for m in again.values())
    # A failure after that opens a new run: logged in full again.
    shown = len(records)
    tick(down, at[12])
    renewed = [r for r in records[shown:] if _key(r) in again]
    assert {_key(r) for r in renewed} == set(again)
    assert all(r.exc_info is not None for r in renewed)


def _again(message: str) -> str:
    found = re.fullmatch(
        r"tick (step (?P<step>\w+)|look-up of what is due) works again .*", message
    )
    assert found is not None, message
    return found["step"] or "due"


def test_every_line_of_a_tick_carries_that_tick_s_request_id(
    sqlite_db: Database, records: list[logging.LogRecord]
) -> None:
    rt = make_runtime(sqlite_db, Clock(START), tick_interval_s=INTERVAL_S)
    down = _down(rt)
    tick(down, START)
    first = len(records)
    tick(down, START + timedelta(seconds=INTERVAL_S * 7))  # past the minute: a line each again
    ids = [getattr(r, "request_id", None) for r in records]
    assert first > 0
    assert len(records) == 2 * first
    assert len(set(ids[:first])) == len(set(ids[first:])) == 1
    assert ids[0] != ids[-1]
    assert all(isinstance(rid, str) and len(rid) == REQUEST_ID_LENGTH for rid in ids)


def test_a_store_outage_across_reconcile_slots_never_raises_out_of_the_tick(
    sqlite_db: Database, records: list[logging.LogRecord]
) -> None:
    """The claim of a slot step (reconcile every 5 minutes, prune) fails with the store: the
    tick goes on, the step counts as failed, and it is logged like any other step."""
    rt = make_runtime(sqlite_db, Clock(START), tick_interval_s=60)
    down = _down(rt)
    failing: set[str] = set()
    for n in range(12):  # 12 minutes: two reconcile slots begin
        failing.update(tick(down, START + timedelta(minutes=n)).errors)
    assert "reconcile" in failing
    reconcile_lines = [r for r in records if _key(r) == "reconcile"]
    # One claim a slot (the first tick's, 5 and 10 minutes on), each a minute or more apart:
    # the first with its traceback, the others one line each.
    assert len(reconcile_lines) == 3
    assert reconcile_lines[0].exc_info is not None
    assert all(line.exc_info is None for line in reconcile_lines[1:])
