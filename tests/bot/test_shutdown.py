"""The stop on SIGTERM keeps to its budget: work that finishes in time is waited for; work hung
past the budget (an SSH command on a silent instance) is abandoned and the process ends."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from bot import cli
from bot.executor import BotExecutor
from bot.store.db import Database
from tests.bot.services.support import Clock, NoFleet, make_runtime


class _Fleet(NoFleet):
    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


def _stop_on_sigterm(
    db: Database, hold: threading.Event, *, finishes: bool, stop_timeout_s: float
) -> tuple[list[int], float, _Fleet]:
    fleet = _Fleet()
    rt = make_runtime(
        db, Clock(), fleet=fleet, poll_interval_s=10**7, stop_timeout_s=stop_timeout_s
    )
    rt.executor = BotExecutor(max_workers=2)
    started = threading.Event()

    def work() -> None:
        started.set()
        hold.wait(0.3 if finishes else 30)  # a command that ends, or one hung on its channel

    stopped = threading.Event()
    exits: list[int] = []
    signalled: list[float] = []

    def serve() -> None:
        # Everything is started (the signal handlers, the clock): a command comes in, and
        # SIGTERM while it runs. The stop's time counts from the signal, as its budget does.
        rt.executor.submit(work)
        assert started.wait(5)
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)
        stopped.wait(10)

    code = cli._run_until_signal(rt, start=serve, stop=stopped.set, exit_now=exits.append)
    assert code == 0
    return exits, time.monotonic() - signalled[0], fleet


def test_a_hung_command_is_abandoned_within_the_budget(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "ABANDON_S", 0.5)
    hold = threading.Event()
    try:
        exits, took_s, fleet = _stop_on_sigterm(db, hold, finishes=False, stop_timeout_s=1.5)
    finally:
        hold.set()
    assert exits == [0]  # ended without waiting on the hung work
    assert took_s < 2.5
    assert fleet.closed.is_set()  # its SSH connections closed: the channel abandoned


def test_work_that_finishes_in_time_is_waited_for(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The clock's first tick runs beside the command, and under load it alone may take seconds
    # (a deadlines step of 1.8 s on a busy PostgreSQL): the budget is wide, and the stop must
    # end as soon as both are done, long before the abandon phase would begin.
    monkeypatch.setattr(cli, "ABANDON_S", 0.5)
    exits, took_s, fleet = _stop_on_sigterm(db, threading.Event(), finishes=True, stop_timeout_s=20)
    assert exits == []  # a clean stop: nothing abandoned
    assert took_s < 20 - 0.5
    assert fleet.closed.is_set()
