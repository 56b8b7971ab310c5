"""Building the bot: the runtime (store, fleet, providers, executor) and the Bolt app.

There is no module-level app: ``build_app(settings)`` makes one, so the tests, the console and
the server each build their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from slack_bolt import App
from slack_sdk import WebClient

from bot.commands import load_all
from bot.commands.registry import Registry
from bot.errors import ConfigError
from bot.executor import BotExecutor
from bot.fleet.fleet import Fleet
from bot.fleet.local import LocalTransport
from bot.listeners import register_listeners
from bot.notify import Notifier
from bot.platform_work import PlatformWork
from bot.providers.base import ProviderRegistry
from bot.replay import ReplayGuard
from bot.runtime import Runtime
from bot.scheduler import SchedulerHandle, start_scheduler
from bot.settings import Settings
from bot.slack_notifier import SlackNotifier
from bot.store.db import Database
from bot.store.models import utcnow

log = logging.getLogger(__name__)

__all__ = ["BotExecutor", "build_app", "build_runtime", "make_client", "start_clock"]


def start_clock(rt: Runtime) -> SchedulerHandle:
    """Start the scheduler that ticks deadlines, releases, polls and digests."""
    return start_scheduler(rt)


def make_client(settings: Settings) -> WebClient:
    """A Web API client for the bot token, at ``settings.slack_api_url``; a call gives up after
    ``settings.slack_timeout_s`` seconds."""
    return WebClient(
        token=settings.slack_bot_token,
        base_url=settings.slack_api_url,
        timeout=max(1, round(settings.slack_timeout_s)),
    )


def build_runtime(
    settings: Settings,
    *,
    notifier: Notifier | None = None,
    clock: Callable[[], datetime] | None = None,
    fleet: Fleet | None = None,
    providers: ProviderRegistry | None = None,
    db: Database | None = None,
    console: bool = False,
) -> Runtime:
    """The bot's parts: the store (migrated to the newest schema), fleet, providers, a Slack
    notifier, a naive-UTC clock and the executor for users' commands (bounded by
    ``settings.command_queue_max`` and ``settings.commands_per_user``). ``console`` serves the
    local console, the only runtime whose fleet reaches the bot's own machine. Raises
    ConfigError, StoreError."""
    database = db if db is not None else Database(settings.effective_database_url)
    if db is None:
        database.migrate()
    return Runtime(
        settings=settings,
        db=database,
        fleet=fleet if fleet is not None else _fleet(settings, console=console),
        providers=providers if providers is not None else ProviderRegistry.from_settings(settings),
        notifier=notifier if notifier is not None else SlackNotifier(make_client(settings)),
        clock=clock if clock is not None else utcnow,
        executor=BotExecutor(
            settings.executor_workers,
            thread_name_prefix="gpubot",
            max_queued=settings.command_queue_max,
            per_user=settings.commands_per_user,
        ),
        console=console,
        # The console's clock waits for what it asks the platforms: one person, one terminal.
        platform_work=None if console else PlatformWork(),
    )


def _fleet(settings: Settings, *, console: bool) -> Fleet:
    return Fleet(settings, local_transport=LocalTransport() if console else None)


def build_app(
    settings: Settings,
    client: WebClient | None = None,
    *,
    runtime: Runtime | None = None,
    registry: Registry | None = None,
    replay_guard: ReplayGuard | None = None,
) -> App:
    """The Bolt app with the `/gpu` command and button listeners. ``client`` defaults to a
    WebClient at ``settings.slack_api_url``; ``runtime`` to :func:`build_runtime` with a
    notifier on that client; ``replay_guard`` (which answers a signed request sent again
    without running it) to a new :class:`~bot.replay.ReplayGuard`. Raises ConfigError when
    SLACK_BOT_TOKEN is missing."""
    if not settings.slack_bot_token:
        raise ConfigError(
            "SLACK_BOT_TOKEN is not set.",
            hint="Set it to the app's bot token (xoxb-...), or run `gpubot console`.",
        )
    commands = registry if registry is not None else load_all()
    web = client if client is not None else make_client(settings)
    if not web.token:
        raise ConfigError("The Slack client has no token.", hint="Give WebClient the bot token.")
    rt = runtime if runtime is not None else build_runtime(settings, notifier=SlackNotifier(web))
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
    # After Bolt's own middleware: only requests whose signature checked out are remembered.
    app.use(replay_guard if replay_guard is not None else ReplayGuard())
    register_listeners(app, rt, commands)
    return app
