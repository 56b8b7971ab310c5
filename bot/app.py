"""Building the bot: the runtime (store, fleet, providers, executor) and the Bolt app.

There is no module-level app: ``build_app(settings)`` makes one, so the tests, the console and
the server each build their own.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial, wraps
from typing import ParamSpec, TypeVar

from slack_bolt import App, BoltRequest, BoltResponse
from slack_sdk import WebClient
from slack_sdk.webhook import WebhookClient
from sqlmodel import select

from bot import charts
from bot.ack_path import CHECK_BEFORE_RUNNING, Languages, store_hung_text
from bot.blocks import render, render_files
from bot.commands import build_registry
from bot.commands import home as home_commands
from bot.commands.registry import Registry
from bot.errors import ConfigError, GpubotError, StoreError
from bot.executor import BotExecutor
from bot.fleet.fleet import Fleet
from bot.fleet.local import LocalTransport
from bot.health import Health
from bot.http_server import OpsEndpoints
from bot.i18n import language_of, set_default_language, speaking
from bot.listeners import Forms, register_listeners
from bot.logging_setup import RepeatLimiter
from bot.metrics import Metrics, StoreStats
from bot.notify import Notifier
from bot.platform_work import PlatformWork
from bot.providers.registry import ProviderRegistry
from bot.replay import ReplayGuard
from bot.runtime import Runtime
from bot.scheduler import SchedulerHandle, TickWatch, start_scheduler
from bot.services.instances import fleet_views
from bot.settings import Settings
from bot.slack_notifier import SlackNotifier, make_client
from bot.store import stats
from bot.store.db import Database
from bot.store.deadline import StoreDeadline
from bot.store.models import Person, utcnow

log = logging.getLogger(__name__)

__all__ = [
    "BotExecutor",
    "build_app",
    "build_health",
    "build_ops",
    "build_runtime",
    "start_clock",
    "timed_registry",
    "with_home_buttons",
]

#: The store's gauges are served for this many tick intervals after their reading (at least
#: GAUGE_MAX_AGE_MIN_S seconds); older, the store is said to be down.
GAUGE_MAX_AGE_TICKS = 3
GAUGE_MAX_AGE_MIN_S = 60.0
#: Seconds ``/readyz`` waits for the database before it says the database does not answer.
READY_DB_TIMEOUT_S = 2.0
#: Seconds the thread that acks waits for the store to check a signed request for a replay.
REPLAY_CHECK_DEADLINE_S = 1.5

P = ParamSpec("P")
T = TypeVar("T")


def start_clock(
    rt: Runtime, *, health: Health | None = None, also: Callable[[], None] | None = None
) -> SchedulerHandle:
    """Start the scheduler that ticks deadlines, releases, polls and digests; each tick is
    measured into the process's metrics and, given ``health``, reported to it; after each
    tick the store's gauges for ``/metrics`` are read (:func:`store_gauges`), and the team's
    figures every person's Home and list show
    (bot.services.instances.fleet_views.refresh_summary), then ``also`` (Feishu's pinned
    summary)."""
    gauges = store_gauges(rt)

    def after_tick() -> None:
        gauges.refresh()
        fleet_views.refresh_summary(rt)
        if also is not None:
            also()

    return start_scheduler(
        rt, watch=TickWatch(metrics=rt.metrics, health=health, after_tick=after_tick)
    )


#: The store's gauges of each runtime, read by its clock (by ``id``, dropped with it).
_GAUGES: dict[int, stats.CachedStats] = {}
_GAUGES_LOCK = threading.Lock()


def store_gauges(rt: Runtime) -> stats.CachedStats:
    """The runtime's store gauges, as its clock last read them: ``/metrics`` serves these and
    never waits on the database (past a first reading's second)."""
    key = id(rt)
    with _GAUGES_LOCK:
        cached = _GAUGES.get(key)
        if cached is None:

            def read() -> StoreStats:
                return stats.read_stats(
                    rt.db,
                    rt.now(),
                    tz=rt.settings.tz(),
                    poll_interval_s=rt.settings.poll_interval_s,
                )

            max_age_s = max(GAUGE_MAX_AGE_TICKS * rt.settings.tick_interval_s, GAUGE_MAX_AGE_MIN_S)
            cached = _GAUGES[key] = stats.CachedStats(read, max_age_s=max_age_s)
            weakref.finalize(rt, _forget_gauges, key)
        return cached


def _forget_gauges(key: int) -> None:
    with _GAUGES_LOCK:
        _GAUGES.pop(key, None)


def build_health(rt: Runtime, *, slack_connected: Callable[[], bool] | None = None) -> Health:
    """The readiness check of ``rt``: its database, its clock and (Socket Mode, given
    ``slack_connected``) the connection to Slack."""
    fonts: Callable[[], str | None] | None = None
    if _chinese_in_use(rt):

        def fonts() -> str | None:
            return charts.cjk_font_missing()

    missing = fonts() if fonts is not None else None
    if missing:
        log.warning("Chinese is in use, but %s", missing)
    return Health(
        tick_interval_s=rt.settings.tick_interval_s,
        database=partial(stats.ping, rt.db),
        slack_connected=slack_connected,
        fonts=fonts,
        db_timeout_s=READY_DB_TIMEOUT_S,
    )


def _chinese_in_use(rt: Runtime) -> bool:
    """Whether the workspace speaks Chinese or a person chose it (`/gpu lang zh`); a store
    that cannot answer counts as yes (the font check only warns)."""
    if rt.settings.language == "zh":
        return True
    try:
        with rt.db.session() as session:
            return (
                session.exec(select(Person.slack_id).where(Person.language == "zh")).first()
                is not None
            )
    except GpubotError:
        return True


def build_ops(rt: Runtime, health: Health) -> OpsEndpoints:
    """``/healthz``, ``/readyz`` and ``/metrics`` of ``rt``: the process's metrics and the
    store's gauges as the clock last read them (a hung database holds no scrape)."""
    gauges = store_gauges(rt)
    return OpsEndpoints(health=health, metrics=lambda: rt.metrics.exposition(gauges.stats))


class BoundedReplayGuard(ReplayGuard):
    """The replay guard on the store, kept from holding the threads that ack.

    A slash command's signature is checked against this process's memory at once, and in the
    store on the executor before the command runs (bot.ack_path.CHECK_BEFORE_RUNNING): its ack
    waits for no store and a replay is dropped unrun; when the store fails that check, the
    command's response URL is told that the store is not answering and nothing was run (in its
    caller's language as last known, ``languages``); a store that does not answer leaves the
    command waiting for it (bot.ack_path.StoreWatch tells its caller). Any other signed request
    is checked before its listener runs, waiting for the store at most ``deadline``'s seconds;
    past that, or when the store fails, it is answered 503 and nothing runs. Either way nothing
    runs twice, and a check that ends late only records the signature. Failures are logged once
    a minute with their count."""

    def __init__(
        self, *, db: Database, languages: Languages, deadline: StoreDeadline | None = None
    ) -> None:
        super().__init__(db=db)
        self.languages = languages
        #: Signatures this process has seen, checked on the thread that acks (no store).
        self.seen_here = ReplayGuard()
        self.deadline = (
            deadline if deadline is not None else StoreDeadline(deadline_s=REPLAY_CHECK_DEADLINE_S)
        )
        #: The store's failed checks, logged at most once a minute with their count.
        self.failures = RepeatLimiter()

    def process(
        self,
        *,
        req: BoltRequest,
        resp: BoltResponse,
        next: Callable[[], BoltResponse],
    ) -> BoltResponse | None:
        body = req.body if isinstance(req.body, dict) else {}
        deferral = (
            _Deferral(str(body.get("user_id") or ""), str(body.get("response_url") or ""))
            if body.get("command")
            else None
        )
        deferring = _DEFERRING.set(deferral)
        # Bolt runs the listener after the middleware returns, in this thread and context:
        # the check set by first_time stays for it, and each request starts without one.
        CHECK_BEFORE_RUNNING.set(None)
        try:
            return super().process(req=req, resp=resp, next=next)
        except _StoreUnanswered as exc:
            self.failed(str(exc))
            return BoltResponse(status=503, body="")
        finally:
            _DEFERRING.reset(deferring)

    def first_time(self, signature: str, timestamp: str | None) -> bool:
        """For a slash command: False when this process has seen it, else True, leaving the
        store's check to the executor. Otherwise the store's check within the deadline."""
        deferral = _DEFERRING.get()
        if deferral is not None:
            if not self.seen_here.first_time(signature, timestamp):
                return False
            CHECK_BEFORE_RUNNING.set(_DeferredCheck(self, signature, timestamp, deferral))
            return True
        try:
            answer = self.deadline.call(super().first_time, signature, timestamp)
        except GpubotError as exc:  # StoreError, StoreHung
            raise _StoreUnanswered(exc.message) from exc
        self.settled()
        return answer

    def stored_first_time(self, signature: str, timestamp: str | None) -> bool:
        """The check itself (memory, then the store), waiting as long as the store takes.
        Raises StoreError when the store fails."""
        answer = super().first_time(signature, timestamp)
        self.settled()
        return answer

    def failed(self, reason: str) -> None:
        """Log that the store could not check a request (at most once a minute)."""
        repeat = self.failures.admit("replay-check", time.monotonic())
        if repeat is None:
            return
        if repeat.first:
            log.warning("the store did not check a signed request: %s", reason)
        else:
            log.warning(
                "the store did not check %d signed request(s) in the last %.0f s: %s",
                repeat.count,
                repeat.window_s,
                reason,
            )

    def settled(self) -> None:
        """Log, once, that the store checks requests again after failing."""
        held = self.failures.settle("replay-check", time.monotonic())
        if held is not None:
            log.warning("the store checks signed requests again (%d failed before)", held)


@dataclass(frozen=True)
class _Deferral:
    """Who sent a slash command and where its answer goes."""

    user_id: str
    response_url: str


#: The slash command whose replay check is being left to the executor (None: none).
_DEFERRING: contextvars.ContextVar[_Deferral | None] = contextvars.ContextVar(
    "gpubot_replay_deferral", default=None
)


class _DeferredCheck:
    """A slash command's replay check, made on the executor before it runs; once."""

    def __init__(
        self,
        guard: BoundedReplayGuard,
        signature: str,
        timestamp: str | None,
        deferral: _Deferral,
    ) -> None:
        self.guard = guard
        self.signature = signature
        self.timestamp = timestamp
        self.deferral = deferral
        self._lock = threading.Lock()
        self._answer: bool | None = None

    def __call__(self) -> bool:
        with self._lock:
            if self._answer is None:
                self._answer = self._check()
            return self._answer

    def _check(self) -> bool:
        try:
            first = self.guard.stored_first_time(self.signature, self.timestamp)
        except StoreError as exc:
            self.guard.failed(exc.message)
            self._say_not_run()
            return False
        if not first:
            log.warning("a signed request was sent again (timestamp %s); not run", self.timestamp)
        return first

    def _say_not_run(self) -> None:
        if not self.deferral.response_url:
            return
        with speaking(self.guard.languages.known(self.deferral.user_id)):
            text = store_hung_text()
        try:
            WebhookClient(self.deferral.response_url).send(text=text, response_type="ephemeral")
        except Exception:  # noqa: BLE001 - Slack unreachable as well: the log says it
            log.warning("could not tell %s the store is not answering", self.deferral.user_id)


class _StoreUnanswered(Exception):
    """The replay guard's store did not answer (not a StoreError: ReplayGuard answers those
    itself)."""


def with_home_buttons(registry: Registry) -> Registry:
    """A copy of ``registry`` that also answers the Home tab's own buttons."""
    both = Registry(commands=dict(registry.commands), actions=dict(registry.actions))
    home_commands.register(both)
    return both


def timed_registry(registry: Registry, metrics: Metrics) -> Registry:
    """A copy of ``registry`` whose handlers record how long they run: commands by name,
    buttons as ``button:ACTION_ID``."""
    timed = Registry()
    for command in registry.primary_commands():
        timed.command(replace(command, handler=_timed(command.name, command.handler, metrics)))
    for action in registry.actions.values():
        label = f"button:{action.action_id}"
        timed.action(replace(action, handler=_timed(label, action.handler, metrics)))
    return timed


def _timed(name: str, handler: Callable[P, T], metrics: Metrics) -> Callable[P, T]:
    @wraps(handler)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        started = time.perf_counter()
        try:
            return handler(*args, **kwargs)
        finally:
            metrics.command_took(name, time.perf_counter() - started)

    return run


def build_runtime(
    settings: Settings,
    *,
    notifier: Notifier | None = None,
    clock: Callable[[], datetime] | None = None,
    fleet: Fleet | None = None,
    providers: ProviderRegistry | None = None,
    db: Database | None = None,
    console: bool = False,
    metrics: Metrics | None = None,
) -> Runtime:
    """The bot's parts: the store (migrated to the newest schema), fleet, providers, a Slack
    notifier, a naive-UTC clock and the executor for users' commands (bounded by
    ``settings.command_queue_max`` and ``settings.commands_per_user``). ``console`` serves the
    local console, the only runtime whose fleet reaches the bot's own machine. Raises
    ConfigError, StoreError."""
    metrics = metrics if metrics is not None else Metrics()
    database = db if db is not None else Database(settings.effective_database_url)
    if db is None:
        database.migrate()
    set_default_language(language_of(settings.language) or "en")
    return Runtime(
        settings=settings,
        db=database,
        fleet=fleet if fleet is not None else _fleet(settings, console=console, metrics=metrics),
        providers=providers if providers is not None else ProviderRegistry.from_settings(settings),
        notifier=notifier
        if notifier is not None
        else SlackNotifier(make_client(settings), metrics=metrics),
        clock=clock if clock is not None else utcnow,
        render=render,
        render_files=render_files,
        executor=BotExecutor(
            settings.executor_workers,
            thread_name_prefix="gpubot",
            max_queued=settings.command_queue_max,
            per_user=settings.commands_per_user,
        ),
        console=console,
        # The console's clock waits for what it asks the platforms: one person, one terminal.
        platform_work=None if console else PlatformWork(),
        metrics=metrics,
    )


def _slack_runtime(settings: Settings, client: WebClient) -> Runtime:
    """A runtime whose Slack notifier counts into the runtime's metrics."""
    metrics = Metrics()
    return build_runtime(settings, notifier=SlackNotifier(client, metrics=metrics), metrics=metrics)


def _fleet(settings: Settings, *, console: bool, metrics: Metrics) -> Fleet:
    return Fleet(settings, local_transport=LocalTransport() if console else None, metrics=metrics)


def build_app(
    settings: Settings,
    client: WebClient | None = None,
    *,
    runtime: Runtime | None = None,
    registry: Registry | None = None,
    replay_guard: ReplayGuard | None = None,
    forms: Forms | None = None,
) -> App:
    """The Bolt app with the `/gpu` command, the button listeners (the Home tab's included),
    the forms and the Home tab. ``client`` defaults to a WebClient at
    ``settings.slack_api_url``; ``runtime`` to :func:`build_runtime` with a notifier on that
    client; ``replay_guard`` (which answers a signed request sent again without running it) to
    a new :class:`~bot.replay.ReplayGuard` on the runtime's store; ``forms`` to
    bot.commands.forms. Raises ConfigError when SLACK_BOT_TOKEN is missing."""
    if not settings.slack_bot_token:
        raise ConfigError(
            "SLACK_BOT_TOKEN is not set.",
            hint="Set it to the app's bot token (xoxb-...), or run `gpubot console`.",
        )
    commands = registry if registry is not None else build_registry()
    web = client if client is not None else make_client(settings)
    if not web.token:
        raise ConfigError("The Slack client has no token.", hint="Give WebClient the bot token.")
    rt = runtime if runtime is not None else _slack_runtime(settings, web)
    app = App(
        # Bolt takes the token from the client (giving both only logs a warning).
        token=None,
        signing_secret=settings.slack_signing_secret or "",
        client=web,
        token_verification_enabled=False,
        # The listeners only ack and hand the work to the bot's executor, so Bolt may run them
        # in the request's own thread: the answer goes back the moment they return, without
        # Bolt's pool of listener threads or its polling for the ack.
        process_before_response=True,
        logger=logging.getLogger("bot.bolt"),
    )
    languages = Languages(rt)
    # After Bolt's own middleware: only requests whose signature checked out are remembered.
    # The store decides, so that processes sharing it apply a signed request once; a store
    # that does not answer holds the request at most REPLAY_CHECK_DEADLINE_S.
    guard = (
        replay_guard
        if replay_guard is not None
        else BoundedReplayGuard(db=rt.db, languages=languages)
    )
    app.use(guard)
    register_listeners(
        app,
        rt,
        timed_registry(with_home_buttons(commands), rt.metrics),
        forms=forms,
        languages=languages,
    )
    return app
