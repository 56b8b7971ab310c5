"""Liveness and readiness of the running bot, for ``GET /healthz`` and ``GET /readyz``.

Live: the process answers (a bot whose HTTP loop is stuck does not). Ready, when each holds:

- **database**: one round trip answers within ``db_timeout_s`` seconds (a probe still waiting
  is not started again: later checks wait for the same one);
- **clock**: the last tick ended at most three tick intervals ago (before the first tick has
  ended, counted from the start);
- **slack** (Socket Mode only): the connection to Slack is up.

Told but never failed: **fonts**, when Chinese is in use (the workspace's language or a
person's), whether the charts find a CJK font.

Times come from an injected monotonic clock (seconds).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bot.errors import GpubotError

log = logging.getLogger(__name__)

#: Seconds the database gets to answer a readiness check.
DB_TIMEOUT_S = 5.0
#: The clock is late once no tick has ended for this many tick intervals.
LATE_TICKS = 3


@dataclass(frozen=True)
class Check:
    """One condition: its name, whether it holds, and what was seen."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Verdict:
    """The checks of one question (live or ready); ``ok`` when every one holds."""

    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        """Whether every check holds."""
        return all(check.ok for check in self.checks)

    def text(self) -> str:
        """One line per check (``ok NAME: DETAIL`` or ``FAIL NAME: DETAIL``), newline-ended."""
        return "".join(
            f"{'ok' if check.ok else 'FAIL'} {check.name}: {check.detail}\n"
            for check in self.checks
        )


class Health:
    """Answers liveness and readiness. ``database`` makes one round trip and raises a
    GpubotError when the database fails; ``slack_connected`` (Socket Mode) says whether the
    connection is up. Thread-safe."""

    def __init__(
        self,
        *,
        tick_interval_s: float,
        database: Callable[[], None],
        slack_connected: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        db_timeout_s: float = DB_TIMEOUT_S,
        fonts: Callable[[], str | None] | None = None,
    ) -> None:
        self.tick_interval_s = tick_interval_s
        self.slack_connected = slack_connected
        self.fonts = fonts
        self._clock = clock
        self._started = clock()
        self._last_tick: float | None = None
        self._database = _DatabaseProbe(database, timeout_s=db_timeout_s, clock=clock)

    def tick_finished(self) -> None:
        """Note that a tick has just ended."""
        self._last_tick = self._clock()

    def live(self) -> Verdict:
        """Liveness: the process is here to answer."""
        return Verdict((Check("process", True, "answering"),))

    def ready(self) -> Verdict:
        """Readiness: the database, the clock and (in Socket Mode) Slack's connection."""
        checks = [self._database.check(), self._clock_check()]
        if self.slack_connected is not None:
            checks.append(self._slack_check(self.slack_connected))
        if self.fonts is not None:
            # Said, not failed: the bot works without it, its Chinese charts do not read.
            missing = self.fonts()
            checks.append(Check("fonts", True, missing or "a CJK font for the charts is found"))
        verdict = Verdict(tuple(checks))
        if not verdict.ok:
            log.info("not ready: %s", "; ".join(c.detail for c in checks if not c.ok))
        return verdict

    def _clock_check(self) -> Check:
        allowed_s = LATE_TICKS * self.tick_interval_s
        now = self._clock()
        last = self._last_tick
        if last is None:
            waited_s = now - self._started
            detail = f"no tick has ended yet, {waited_s:.0f} s after the start"
        else:
            waited_s = now - last
            detail = f"the last tick ended {waited_s:.0f} s ago"
        if waited_s > allowed_s:
            return Check("clock", False, f"{detail} (more than {allowed_s:g} s: the clock is late)")
        return Check("clock", True, detail)

    @staticmethod
    def _slack_check(connected: Callable[[], bool]) -> Check:
        if connected():
            return Check("slack", True, "the Socket Mode connection is up")
        return Check("slack", False, "the Socket Mode connection is down")


@dataclass
class _Attempt:
    started: float
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    took_s: float = 0.0


class _DatabaseProbe:
    """Runs the database check on a thread of its own, one at a time, so that a database that
    hangs holds no caller past ``timeout_s``."""

    def __init__(
        self, check: Callable[[], None], *, timeout_s: float, clock: Callable[[], float]
    ) -> None:
        self._check = check
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._running: _Attempt | None = None

    def check(self) -> Check:
        with self._lock:
            attempt = self._running
            if attempt is None:
                attempt = self._running = _Attempt(started=self._clock())
                threading.Thread(
                    target=self._work, args=(attempt,), name="gpubot-health-db", daemon=True
                ).start()
        if not attempt.done.wait(self._timeout_s):
            waited_s = self._clock() - attempt.started
            return Check("database", False, f"no answer for {waited_s:.1f} s")
        if attempt.error is not None:
            return Check("database", False, attempt.error)
        return Check("database", True, f"answered in {attempt.took_s * 1000:.0f} ms")

    def _work(self, attempt: _Attempt) -> None:
        attempt.error = "the check ended without an answer"
        try:
            self._check()
            attempt.error = None
        except GpubotError as exc:
            attempt.error = exc.message
        finally:
            attempt.took_s = self._clock() - attempt.started
            with self._lock:
                if self._running is attempt:
                    self._running = None
            attempt.done.set()
