"""Calls to the platforms' APIs off the clock: bounded pools, one per platform.

The scheduler's tick decides what is due and hands the platform calls (releases, reconciling
with the platforms' lists, recovering rentals) to these pools, so a platform that takes 30 s a
call never holds the tick, and one slow platform never holds another platform's releases. A
piece of work is known by a key while it is queued or running, so a tick that comes round
again does not queue it twice; past ``max_queued`` pieces for a platform, new ones wait for a
later tick. The work itself stays safe to run from two processes (rows and claims).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)

#: Threads per platform, and pieces of work queued or running per platform.
WORKERS_PER_PLATFORM = 4
MAX_QUEUED_PER_PLATFORM = 64


class PlatformWork:
    """Bounded pools by platform name. Thread-safe; ``shutdown()`` when the bot stops."""

    def __init__(
        self,
        *,
        workers_per_platform: int = WORKERS_PER_PLATFORM,
        max_queued: int = MAX_QUEUED_PER_PLATFORM,
    ) -> None:
        self._workers = workers_per_platform
        self._max_queued = max_queued
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._in_flight: dict[str, set[str]] = {}
        self._idle = threading.Condition()
        self._closed = False

    def submit(self, platform: str, key: str, work: Callable[[], object]) -> bool:
        """Run ``work`` on ``platform``'s pool unless ``key`` is already queued or running
        there, the pool is full or shut down; True when it was queued. ``work``'s exceptions
        are logged."""
        with self._idle:
            keys = self._in_flight.setdefault(platform, set())
            if self._closed or key in keys or len(keys) >= self._max_queued:
                return False
            keys.add(key)
            pool = self._pools.get(platform)
            if pool is None:
                pool = ThreadPoolExecutor(self._workers, thread_name_prefix=f"platform-{platform}")
                self._pools[platform] = pool
        future = pool.submit(contextvars.copy_context().run, work)
        future.add_done_callback(lambda done: self._finished(platform, key, done))
        return True

    def in_flight(self, platform: str | None = None) -> int:
        """How many pieces are queued or running (for one platform, or all)."""
        with self._idle:
            if platform is not None:
                return len(self._in_flight.get(platform, ()))
            return sum(len(keys) for keys in self._in_flight.values())

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or running; False when ``timeout_s`` ran out first."""
        with self._idle:
            return self._idle.wait_for(lambda: not any(self._in_flight.values()), timeout=timeout_s)

    def shutdown(self, *, wait: bool = True) -> None:
        """Take no more work; with ``wait``, let what runs finish."""
        with self._idle:
            self._closed = True
            pools = list(self._pools.values())
        for pool in pools:
            pool.shutdown(wait=wait, cancel_futures=not wait)

    def _finished(self, platform: str, key: str, done: Future[object]) -> None:
        error = None if done.cancelled() else done.exception()
        if error is not None:
            log.error("platform work %s on %s failed", key, platform, exc_info=error)
        with self._idle:
            self._in_flight.get(platform, set()).discard(key)
            self._idle.notify_all()
