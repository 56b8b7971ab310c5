"""Store work with a deadline, for callers that must answer in time (a request being acked).

A database that hangs (a dead network path, a proxy that stops forwarding) never answers a
statement already sent, and nothing in Python can take back a blocking driver call. So the
work runs on a small pool of threads of its own and the caller waits for it at most
``deadline_s`` seconds; past that it gets :class:`StoreHung` and goes on. Work that had not
started by then is dropped; work under way is neither cancelled nor run again: it finishes (or
fails) once the database answers, and its result is dropped. The pool is bounded: while
``workers`` calls are under way, and as many wait, a new call is refused at once with StoreHung,
so a hung store holds at most ``workers`` threads and queues nothing without end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import ParamSpec, TypeVar

from bot.errors import StoreError

P = ParamSpec("P")
T = TypeVar("T")

#: Seconds a caller waits for the store before it is told the store is not answering.
DEADLINE_S = 1.5
#: Threads that may run store work at once.
WORKERS = 16


class StoreHung(StoreError):
    """The store did not answer within the deadline (work under way may still finish)."""


class StoreDeadline:
    """Runs store work with a deadline of ``deadline_s`` seconds on at most ``workers``
    threads of its own, with as many calls waiting at most. Thread-safe."""

    def __init__(self, *, deadline_s: float = DEADLINE_S, workers: int = WORKERS) -> None:
        if deadline_s <= 0 or workers < 1:
            raise ValueError("deadline_s must be positive and workers at least 1")
        self.deadline_s = deadline_s
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gpubot-store")
        self._lock = threading.Lock()
        self._pending = 0

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)``'s result, or its exception, within the deadline. Raises
        StoreHung when it has not ended by then, or at once while the pool is full of earlier
        calls (the store is not answering them)."""
        with self._lock:
            if self._pending >= 2 * self.workers:
                raise StoreHung(f"{self._pending} calls to the database are waiting for it")
            self._pending += 1
        try:
            future: Future[T] = self._pool.submit(fn, *args, **kwargs)
        except BaseException:
            self._done()
            raise
        future.add_done_callback(lambda _future: self._done())
        try:
            return future.result(timeout=self.deadline_s)
        except FutureTimeout as exc:
            future.cancel()  # not yet started: it never runs
            raise StoreHung(f"the database did not answer within {self.deadline_s:g} s") from exc

    def held(self) -> int:
        """How many calls are under way or waiting."""
        with self._lock:
            return self._pending

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1
