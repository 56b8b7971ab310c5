"""Acks go first: the executor's work waits while requests are being acked, never past its
longest hold, and not at all when nothing is acked."""

from __future__ import annotations

import threading
import time

from bot.executor import AcksFirst, BotExecutor


def test_work_waits_for_the_acks_in_flight_then_runs() -> None:
    acks = AcksFirst(quiet_s=0.0, hold_max_s=5.0)
    started = threading.Event()

    def wait() -> None:
        acks.wait_turn(time.monotonic())
        started.set()

    with acks.acking():
        waiter = threading.Thread(target=wait)
        waiter.start()
        assert not started.wait(0.2)  # held while the ack is in flight
    assert started.wait(2.0)  # and let go once it ended
    waiter.join()


def test_work_is_held_no_longer_than_the_longest_hold() -> None:
    acks = AcksFirst(quiet_s=0.0, hold_max_s=0.1)
    with acks.acking():
        began = time.monotonic()
        acks.wait_turn(began)
        held_s = time.monotonic() - began
    assert 0.09 <= held_s < 1.0


def test_nothing_acked_holds_nothing() -> None:
    acks = AcksFirst(quiet_s=0.0, hold_max_s=5.0)
    began = time.monotonic()
    acks.wait_turn(began)
    assert time.monotonic() - began < 0.5


def test_the_executor_runs_its_work_after_the_acks() -> None:
    executor = BotExecutor(2)
    try:
        assert executor.submit(lambda: 41 + 1).result(timeout=5) == 42
    finally:
        executor.shutdown(wait=True)
