"""The pool that runs users' commands after the ack: bounded, with a limit per person.

A command is admitted only while the pool has room (its workers busy plus at most
``max_queued`` waiting) and its caller has fewer than ``per_user`` commands pending; otherwise
:class:`Busy` says so at once, and nothing waits in an unbounded queue behind a dead host. Work
a running command hands on (``submit``) is always taken.

Acks go first (:data:`ACKS`): the work runs in Python threads of one process, which take turns
on the interpreter's lock, so a command that starts while requests are being acked slows their
acks. A worker therefore starts its next piece of work only once no request has been in the
ack path (bot.http_server marks it) for :data:`ACK_QUIET_S`, or once the work has waited
:data:`ACK_HOLD_MAX_S` since it was submitted: a burst of requests is acked before its commands
run, and a steady stream of them delays no command by more than that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from bot.errors import GpubotError
from bot.i18n import nt, t

P = ParamSpec("P")
T = TypeVar("T")

#: Seconds without a request in the ack path before held work starts.
ACK_QUIET_S = 0.002
#: The longest (seconds) work waits for acks after it was submitted.
ACK_HOLD_MAX_S = 0.2


class AcksFirst:
    """Counts the requests being acked, so that work can wait for them (monotonic seconds).
    Thread-safe."""

    def __init__(self, *, quiet_s: float = ACK_QUIET_S, hold_max_s: float = ACK_HOLD_MAX_S) -> None:
        self.quiet_s = quiet_s
        self.hold_max_s = hold_max_s
        self._cond = threading.Condition()
        self._acking = 0
        self._last_s = float("-inf")

    @contextmanager
    def acking(self) -> Iterator[None]:
        """The block acks a request."""
        with self._cond:
            self._acking += 1
        try:
            yield
        finally:
            with self._cond:
                self._acking -= 1
                self._last_s = time.monotonic()
                if not self._acking:
                    self._cond.notify_all()

    def wait_turn(self, submitted_s: float) -> None:
        """Return once no request has been acked for ``quiet_s``, or ``hold_max_s`` after
        ``submitted_s`` (a monotonic reading)."""
        until_s = submitted_s + self.hold_max_s
        with self._cond:
            while True:
                now = time.monotonic()
                if now >= until_s:
                    return
                if not self._acking:
                    quiet_until = self._last_s + self.quiet_s
                    if now >= quiet_until:
                        return
                    self._cond.wait(min(quiet_until, until_s) - now)
                else:
                    self._cond.wait(until_s - now)


#: The process's acks (bot.http_server marks each request it hands to the Bolt app).
ACKS = AcksFirst()


class Busy(GpubotError):
    """The bot turned a command away unrun: the pool is full, or the caller has their limit of
    commands pending. ``str(err)`` is the answer for the user."""


class BotExecutor(ThreadPoolExecutor):
    """The bot's own pool for work after an ack; it can wait until nothing is pending.

    ``max_queued`` (None: no bound) and ``per_user`` (None: no limit) bound what
    :meth:`submit_command` admits.
    """

    def __init__(
        self,
        max_workers: int,
        thread_name_prefix: str = "gpubot",
        *,
        max_queued: int | None = None,
        per_user: int | None = None,
    ) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.max_workers = max_workers
        self.max_queued = max_queued
        self.per_user = per_user
        self._pending = 0
        self._completed = 0
        self._by_user: dict[str, int] = {}
        self._idle = threading.Condition()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn`` on the pool, counting it as pending until it ends (never refused)."""
        with self._idle:
            self._pending += 1
        return self._start(None, fn, *args, **kwargs)

    def submit_command(
        self, user_id: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Future[T]:
        """Run a command of ``user_id`` on the pool. Raises Busy, at once, when the caller
        already has ``per_user`` commands pending or the queue holds ``max_queued``."""
        with self._idle:
            mine = self._by_user.get(user_id, 0)
            if self.per_user is not None and mine >= self.per_user:
                raise Busy(
                    nt(
                        "You already have {n} command running; wait for them to finish, "
                        "then try again.",
                        "You already have {n} commands running; wait for them to finish, "
                        "then try again.",
                        mine,
                        n=mine,
                    )
                )
            if self.max_queued is not None and (
                self._pending >= self.max_workers + self.max_queued
            ):
                raise Busy(t("gpubot is busy, try again in a moment."))
            self._pending += 1
            self._by_user[user_id] = mine + 1
        return self._start(user_id, fn, *args, **kwargs)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until no submitted work is pending (work may submit more); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    @property
    def completed(self) -> int:
        """How many submitted calls have ended (successfully or not)."""
        with self._idle:
            return self._completed

    def pending_for(self, user_id: str) -> int:
        """How many commands of ``user_id`` are queued or running."""
        with self._idle:
            return self._by_user.get(user_id, 0)

    def _start(
        self, user_id: str | None, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Future[T]:
        submitted_s = time.monotonic()

        def after_acks() -> T:
            try:
                ACKS.wait_turn(submitted_s)
                return fn(*args, **kwargs)
            finally:  # before the future holds the result: whoever saw it may submit again
                self._finished(user_id)

        try:
            future = super().submit(after_acks)
        except BaseException:
            self._finished(user_id)
            raise
        # Only a command cancelled before it ran skips after_acks (the pool has no initializer
        # that could break it), so only that one gives its place back here.
        future.add_done_callback(lambda done: self._finished(user_id) if done.cancelled() else None)
        return future

    def _finished(self, user_id: str | None) -> None:
        with self._idle:
            self._pending -= 1
            self._completed += 1
            if user_id is not None:
                left = self._by_user[user_id] - 1
                if left:
                    self._by_user[user_id] = left
                else:
                    del self._by_user[user_id]
            self._idle.notify_all()
