"""What the threads that ack rely on, so that they never wait on the store.

A command is acked on the listener's thread and run on the bot's executor
(:func:`submit_command`), in a copy of its context (its request id) and after the check the
request left for it (:data:`CHECK_BEFORE_RUNNING`: the store's replay check of a signed
command). A command turned away is answered in the language its caller was last spoken to in
(:class:`Languages`, kept in memory). A command still waiting for a store that does not answer
is told so :data:`STORE_ANSWER_S` seconds after its ack (:class:`StoreWatch`,
:data:`STORE_SLOW_NOTE`, logged once a minute); it is neither cancelled nor run again, and its
own answer follows once the store answers (or, when its store check fails,
:data:`STORE_HUNG_NOTE`: nothing was run). Slack's listeners (bot.listeners) and Feishu's use
the same pieces.
"""

from __future__ import annotations

import contextvars
import heapq
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from slack_bolt import Respond

from bot.errors import GpubotError
from bot.executor import BotExecutor
from bot.i18n import N_, Language, language_of, speaking, t
from bot.logging_setup import RepeatLimiter
from bot.services.access import Caller
from bot.services.speaking.people import language_for
from bot.store.deadline import StoreDeadline, StoreHung
from bot.store.stats import ping

if TYPE_CHECKING:
    from bot.runtime import Runtime

log = logging.getLogger(__name__)

#: The most people whose language is kept in memory.
LANGUAGES_KEPT = 10_000
#: Said of a request the bot could not check or run because the store did not answer.
STORE_HUNG_NOTE = N_("The store is not answering, so nothing was run; try again in a minute.")
#: Said of a command under way when the store stops answering it.
STORE_SLOW_NOTE = N_(
    "The store is not answering; the command waits for it, and its answer follows."
)
#: Seconds after its ack by which a command still waiting on the store is told so.
STORE_ANSWER_S = 2.5

P = ParamSpec("P")
T = TypeVar("T")

#: A check a request leaves for the executor to make before its command runs (the store's
#: replay check, bot.app.BoundedReplayGuard): False, and the command is not run. It runs at
#: most once: later calls give its first answer.
CHECK_BEFORE_RUNNING: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "gpubot_check_before_running", default=None
)


def submit_command(
    rt: Runtime, caller: Caller, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> Future[T | None]:
    """Hand a command of ``caller`` to the runtime's executor, in a copy of the current
    context (its request id). A check the request left for the executor
    (:data:`CHECK_BEFORE_RUNNING`) runs there first, and the command only when it passes.
    Raises Busy when the executor (a BotExecutor) has no room for it or the caller is at their
    limit."""
    work = in_this_context(_checked_first(CHECK_BEFORE_RUNNING.get(), fn))
    if isinstance(rt.executor, BotExecutor):
        return rt.executor.submit_command(caller.user_id, work, *args, **kwargs)
    return rt.executor.submit(work, *args, **kwargs)


def _checked_first(check: Callable[[], bool] | None, fn: Callable[P, T]) -> Callable[P, T | None]:
    """``fn``, run only when ``check`` (None: none) passes; otherwise nothing is run."""

    def run(*args: P.args, **kwargs: P.kwargs) -> T | None:
        if check is not None and not check():
            return None
        return fn(*args, **kwargs)

    return run


def in_this_context(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` run, wherever it is called, in a copy of the current context (the request id
    of the lines it logs)."""
    context = contextvars.copy_context()

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return context.run(fn, *args, **kwargs)

    return run


class Languages:
    """The language each person was last spoken to in, kept in memory (the newest
    ``kept``), for answers given where the store must not be waited on (the thread that acks)
    or cannot be asked (it does not answer). Thread-safe."""

    def __init__(self, rt: Runtime, *, kept: int = LANGUAGES_KEPT) -> None:
        self.rt = rt
        self._kept = kept
        self._known: OrderedDict[str, Language] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, user_id: str) -> Language:
        """The language of ``user_id`` from the store (bot.services.speaking.people.language_for),
        remembered for :meth:`known`."""
        language = language_for(self.rt, user_id)
        if user_id:
            with self._lock:
                self._known[user_id] = language
                self._known.move_to_end(user_id)
                while len(self._known) > self._kept:
                    self._known.popitem(last=False)
        return language

    def known(self, user_id: str) -> Language:
        """The language last read for ``user_id``, else the workspace's; never the store."""
        with self._lock:
            language = self._known.get(user_id)
        return language or language_of(self.rt.settings.language) or "en"


class StoreWatch:
    """Tells the caller of a command still under way ``after_s`` seconds after its ack, when
    the store does not answer a round trip bounded by ``probe``, that its answer follows once
    the store answers (the command is neither cancelled nor run again), through ``tell``
    (the listeners' answer to a command: a response URL and the text). One thread of its own
    waits for the commands' times; a command that ended by then is not looked at again."""

    def __init__(
        self,
        rt: Runtime,
        languages: Languages,
        *,
        tell: Callable[[Respond, str], object],
        after_s: float = STORE_ANSWER_S,
        probe: StoreDeadline | None = None,
    ) -> None:
        self.rt = rt
        self.languages = languages
        self.after_s = after_s
        self.probe = probe if probe is not None else StoreDeadline(deadline_s=0.5, workers=1)
        self.tell = tell
        self._due: list[tuple[float, int, str, Future[Any], Respond]] = []
        self._count = 0
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        #: Commands told the store is not answering, logged at most once a minute.
        self.waits = RepeatLimiter()

    def watch(self, user_id: str, running: Future[Any], respond: Respond) -> None:
        """Look at ``running`` (a command of ``user_id``) ``after_s`` seconds from now."""
        with self._wake:
            self._count += 1
            due = (time.monotonic() + self.after_s, self._count, user_id, running, respond)
            heapq.heappush(self._due, due)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="gpubot-store-watch", daemon=True
                )
                self._thread.start()
            elif self._due[0] is due:
                self._wake.notify()  # sooner than the thread waits for (else it sleeps on)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    wait_s = self._due[0][0] - time.monotonic() if self._due else None
                    self._wake.wait(wait_s)
                _, _, user_id, running, respond = heapq.heappop(self._due)
            if not running.done() and self._hung():
                self._log_waiting()
                with speaking(self.languages.known(user_id)):
                    self.tell(respond, store_hung_text(STORE_SLOW_NOTE))

    def _log_waiting(self) -> None:
        repeat = self.waits.admit("store-watch", time.monotonic())
        if repeat is not None:
            log.warning(
                "the store is not answering: %d command(s) waiting for it in the last %.0f s",
                repeat.count,
                repeat.window_s,
            )

    def _hung(self) -> bool:
        if self.probe.held():
            return True  # the last probe is still waiting for the store
        try:
            self.probe.call(ping, self.rt.db)
        except StoreHung:
            return True
        except GpubotError:  # a store that fails at once fails the command itself
            return False
        return False


def store_hung_text(note: str = STORE_HUNG_NOTE) -> str:
    """What is said when the store does not answer (``note``), in the active language."""
    return t(":warning: {problem}", problem=t(note))
