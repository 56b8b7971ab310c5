"""`gpubot`: run the bot on Slack (Socket Mode or HTTP), open the local console, migrate, or
check a configuration before starting (`gpubot check`; `gpubot --version` says which gpubot).

With no arguments: Socket Mode when SLACK_BOT_TOKEN and SLACK_APP_TOKEN are set, otherwise the
console. Configuration comes from the environment (see bot/settings.py); a setting that cannot
be used exits with status 2 and says which.

Everything gpubot creates is private to its user: it sets the umask to 077 first, and the data
directory (the SQLite store, logs, the console's files) is made with mode 0700.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from types import FrameType

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from bot.check import check, version_text
from bot.errors import ConfigError, GpubotError
from bot.executor import BotExecutor
from bot.health import Health
from bot.http_server import (
    DRAIN_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    THREADS,
    OpsEndpoints,
    SlackHttpServer,
    ops_server,
)
from bot.logging_setup import LEVELS, configure_logging
from bot.metrics import Metrics
from bot.runtime import Runtime
from bot.scheduler import SchedulerHandle
from bot.settings import Settings
from bot.slack_notifier import SlackNotifier, make_client
from bot.store.db import Database

log = logging.getLogger(__name__)

EXIT_CONFIG = 2
#: Files and directories gpubot creates: readable and writable by its user only.
PRIVATE_UMASK = 0o077
# bot.app (the Bolt app, the charts and the services) is imported by the commands that run the
# bot, so that `gpubot --version`, `gpubot check` and a refused setting start in a fraction of
# the time.


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gpubot``; returns the exit status (0 ok, 1 failed, 2 bad usage or settings)."""
    os.umask(PRIVATE_UMASK)
    args = cli_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        if args.mode == "check":  # looks, and makes nothing
            return _check(settings, args)
        make_private_dir(settings.data_dir)
        mode = args.mode or ("socket" if settings.socket_mode else "console")
        return _MODES[mode](settings, args)
    except ConfigError as exc:
        print(f"gpubot: {exc.user_text()}", file=sys.stderr)
        return EXIT_CONFIG
    except GpubotError as exc:
        print(f"gpubot: {exc.user_text()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def make_private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents with mode 0700 (an existing directory is left as
    it is). Raises ConfigError when it cannot be created."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"Cannot create the data directory {path}: {exc.strerror or exc}.",
            hint="Set GPUBOT_DATA_DIR to a directory this user may create and write.",
        ) from exc


def cli_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpubot",
        description="Slack chat-ops for rented GPU instances. With no command: Socket Mode "
        "when SLACK_BOT_TOKEN and SLACK_APP_TOKEN are set, otherwise the local console.",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LEVELS,
        default=None,
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default GPUBOT_LOG_LEVEL, else INFO)",
    )
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="mode", metavar="COMMAND")
    console = sub.add_parser("console", help="chat with the bot locally, without Slack")
    console.add_argument("--user", default="console-user", help="who speaks first")
    clock = console.add_mutually_exclusive_group()
    clock.add_argument(
        "--clock", dest="clock", action="store_true", default=None, help="run the scheduler"
    )
    clock.add_argument("--no-clock", dest="clock", action="store_false", help="do not run it")
    serve = sub.add_parser("serve", help="serve Slack's signed HTTP requests")
    serve.add_argument("--http", action="store_true", help="HTTP mode (the only one here)")
    serve.add_argument("--port", type=int, default=3000, help="port (default 3000)")
    serve.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    serve.add_argument(
        "--threads",
        type=_positive(int),
        default=THREADS,
        help=f"worker threads (default {THREADS})",
    )
    serve.add_argument(
        "--request-timeout",
        type=_positive(float),
        default=REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help="time a request may take to arrive whole; slower clients are cut off "
        f"(default {REQUEST_TIMEOUT_S:g})",
    )
    serve.add_argument(
        "--drain-timeout",
        type=_positive(float),
        default=DRAIN_TIMEOUT_S,
        metavar="SECONDS",
        help="on SIGTERM, time requests in flight get to finish; keep it under the service "
        f"manager's stop timeout (default {DRAIN_TIMEOUT_S:g})",
    )
    sub.add_parser("socket", help="connect to Slack in Socket Mode")
    feishu = sub.add_parser(
        "feishu",
        help="connect to Feishu (Lark): the SDK's long connection, or --http for the request URL",
    )
    feishu.add_argument(
        "--http", action="store_true", help="serve Feishu's requests at /feishu/events instead"
    )
    feishu.add_argument("--port", type=int, default=3000, help="port (default 3000)")
    feishu.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    feishu.add_argument(
        "--threads",
        type=_positive(int),
        default=THREADS,
        help=f"worker threads (default {THREADS})",
    )
    feishu.add_argument(
        "--request-timeout",
        type=_positive(float),
        default=REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help=f"time a request may take to arrive whole (default {REQUEST_TIMEOUT_S:g})",
    )
    feishu.add_argument(
        "--drain-timeout",
        type=_positive(float),
        default=DRAIN_TIMEOUT_S,
        metavar="SECONDS",
        help=f"on SIGTERM, time requests in flight get to finish (default {DRAIN_TIMEOUT_S:g})",
    )
    feishu.add_argument(
        "--with-slack",
        action="store_true",
        help="serve Slack too, in Socket Mode (SLACK_BOT_TOKEN, SLACK_APP_TOKEN), on the same "
        "store; the ops channel is then GPUBOT_CHANNEL, else GPUBOT_FEISHU_CHAT",
    )
    sub.add_parser("migrate", help="bring the database to the newest schema")
    sub.add_parser(
        "check",
        help="try the configuration: every setting, the database, Slack, the SSH keys and the "
        "agent archive; one line per problem (status 1), else ok",
    )
    return parser


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type: ``kind(text)`` when it is finite and above zero, else a usage
    error."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
        return value

    return parse


def _console(settings: Settings, args: argparse.Namespace) -> int:
    from bot.console import run_console

    _configure_logging(settings, args, file=settings.data_dir / "console.log")
    user = getattr(args, "user", "console-user")
    return run_console(settings, user=user, clock=getattr(args, "clock", None))


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    from bot.app import build_app, build_health, build_ops

    if not args.http:
        raise ConfigError(
            "`gpubot serve` needs --http.", hint="Run `gpubot serve --http --port N`."
        )
    _require(settings.slack_bot_token, "SLACK_BOT_TOKEN", "the app's bot token (xoxb-...)")
    _require(
        settings.slack_signing_secret,
        "SLACK_SIGNING_SECRET",
        "the app's signing secret (Basic Information > App Credentials)",
    )
    _configure_logging(settings, args)
    _check_bot_token(settings)
    rt, client = _runtime(settings)
    app = build_app(settings, client, runtime=rt)
    health = build_health(rt)
    server = SlackHttpServer(
        app,
        host=args.host,
        port=args.port,
        threads=args.threads,
        request_timeout_s=args.request_timeout,
        drain_timeout_s=args.drain_timeout,
    )
    # Probes and scrapes on a listener and threads of their own, never on the Slack port.
    try:
        ops = _ops_server(settings, build_ops(rt, health))
    except ConfigError:
        server.shutdown()  # never served: closes its socket at once
        raise
    log.info("serving Slack requests at %s", server.url)
    try:
        return _run_until_signal(
            rt, start=server.serve_forever, stop=server.shutdown, health=health
        )
    finally:
        ops.shutdown()


def _socket(settings: Settings, args: argparse.Namespace) -> int:
    from slack_bolt.adapter.socket_mode import SocketModeHandler

    from bot.app import build_app, build_health, build_ops

    _require(settings.slack_bot_token, "SLACK_BOT_TOKEN", "the app's bot token (xoxb-...)")
    _require(
        settings.slack_app_token,
        "SLACK_APP_TOKEN",
        "an app-level token (xapp-...) with connections:write",
    )
    _configure_logging(settings, args)
    _check_bot_token(settings)
    rt, client = _runtime(settings)
    app = build_app(settings, client, runtime=rt)
    handler = SocketModeHandler(app, settings.slack_app_token)
    health = build_health(rt, slack_connected=handler.client.is_connected)
    ops = _ops_server(settings, build_ops(rt, health))
    stopped = threading.Event()

    def start() -> None:
        try:
            handler.connect()  # type: ignore[no-untyped-call]
        except SlackApiError as exc:
            code = exc.response.get("error", "unknown_error")
            raise ConfigError(
                f"Slack refused SLACK_APP_TOKEN: {code}.",
                hint="Use an app-level token (xapp-...) with the connections:write scope, "
                "from the app's Basic Information page.",
            ) from exc
        log.info("connected to Slack in Socket Mode")
        stopped.wait()

    def stop() -> None:
        stopped.set()
        handler.close()  # type: ignore[no-untyped-call]

    try:
        return _run_until_signal(rt, start=start, stop=stop, health=health)
    finally:
        ops.shutdown()


def _feishu(settings: Settings, args: argparse.Namespace) -> int:
    """Serve Feishu: the long connection, or (``--http``) the request URL /feishu/events on the
    production HTTP server; ``--with-slack``: Slack's Socket Mode too, in the same process and
    store (bot.feishu.routing). The ops channel is GPUBOT_FEISHU_CHAT (GPUBOT_CHANNEL when
    Slack is served and it is set); the Feishu ops group keeps the fleet's summary pinned."""
    from bot.app import build_health, build_ops, build_runtime
    from bot.feishu.client import FeishuClient
    from bot.feishu.home import PinnedSummary
    from bot.feishu.notifier import FeishuNotifier
    from bot.feishu.routing import RoutingNotifier, ops_channel
    from bot.feishu.serve import EventGate, FeishuEndpoint, LongConnection, build_gate, verifier_of
    from bot.services.speaking import identities
    from bot.store.models import utcnow

    _require(settings.feishu_app_id, "FEISHU_APP_ID", "the app's App ID (cli_...)")
    _require(settings.feishu_app_secret, "FEISHU_APP_SECRET", "the app's App Secret")
    if args.http:
        where = "the app's Events and Callbacks > Encryption Strategy"
        _require(settings.feishu_verification_token, "FEISHU_VERIFICATION_TOKEN", where)
        _require(settings.feishu_encrypt_key, "FEISHU_ENCRYPT_KEY", where)
    if args.with_slack:
        _require(settings.slack_bot_token, "SLACK_BOT_TOKEN", "the app's bot token (xoxb-...)")
        _require(settings.slack_app_token, "SLACK_APP_TOKEN", "an app-level token (xapp-...)")
    _configure_logging(settings, args)
    settings = settings.with_(channel=ops_channel(settings, slack=args.with_slack, feishu=True))
    app_id, secret = settings.feishu_app_id or "", settings.feishu_app_secret or ""
    client = FeishuClient(
        app_id, secret, api_url=settings.feishu_api_url, timeout_s=settings.slack_timeout_s
    )
    metrics = Metrics()
    slack_client = make_client(settings) if args.with_slack else None
    router = RoutingNotifier(
        slack=SlackNotifier(slack_client, metrics=metrics) if slack_client else None,
        feishu=FeishuNotifier(client, now=utcnow),
    )
    rt = build_runtime(settings, notifier=router, metrics=metrics)
    router.feishu_of = partial(identities.feishu_of, rt)
    gate: EventGate = build_gate(rt, client)
    pinned = PinnedSummary(rt, client, settings.feishu_chat) if settings.feishu_chat else None
    health = build_health(rt)
    if args.http:
        server = SlackHttpServer(
            None,
            chat=FeishuEndpoint(verifier_of(settings), gate),
            host=args.host,
            port=args.port,
            threads=args.threads,
            request_timeout_s=args.request_timeout,
            drain_timeout_s=args.drain_timeout,
        )
        start, stop = server.serve_forever, server.shutdown
        log.info("serving Feishu requests at %s/feishu/events", server.base_url)
    else:
        connection = LongConnection(
            gate, app_id=app_id, app_secret=secret, domain=settings.feishu_api_url
        )
        start, stop = connection.run, connection.stop
        log.info("connecting to Feishu over the long connection")
    if slack_client is not None:
        start, stop = _with_socket_mode(settings, slack_client, rt, start, stop)
    try:
        ops = _ops_server(settings, build_ops(rt, health))
    except ConfigError:
        stop()
        raise
    try:
        also = pinned.refresh if pinned is not None else None
        return _run_until_signal(rt, start=start, stop=stop, health=health, also=also)
    finally:
        ops.shutdown()
        gate.front.close()


def _with_socket_mode(
    settings: Settings,
    client: WebClient,
    rt: Runtime,
    start: Callable[[], None],
    stop: Callable[[], None],
) -> tuple[Callable[[], None], Callable[[], None]]:
    """``start`` and ``stop`` with Slack's Socket Mode beside them, on the same runtime."""
    from slack_bolt.adapter.socket_mode import SocketModeHandler

    from bot.app import build_app

    _check_bot_token(settings)
    handler = SocketModeHandler(build_app(settings, client, runtime=rt), settings.slack_app_token)

    def both_start() -> None:
        handler.connect()  # type: ignore[no-untyped-call]
        log.info("connected to Slack in Socket Mode")
        start()

    def both_stop() -> None:
        stop()
        handler.close()  # type: ignore[no-untyped-call]

    return both_start, both_stop


def _ops_server(settings: Settings, ops: OpsEndpoints) -> SlackHttpServer:
    """/metrics, /healthz and /readyz on GPUBOT_METRICS_HOST:PORT (both modes), serving in the
    background. Raises ConfigError when that address cannot be bound."""
    try:
        server = ops_server(ops, host=settings.metrics_host, port=settings.metrics_port)
    except OSError as exc:
        raise ConfigError(
            f"Cannot serve metrics and health on {settings.metrics_host}:"
            f"{settings.metrics_port}: {exc.strerror or exc}.",
            hint="Set GPUBOT_METRICS_PORT to a free port (0 picks one) and GPUBOT_METRICS_HOST "
            "to an address of this machine.",
        ) from exc
    log.info("serving metrics and health at %s (/metrics, /healthz, /readyz)", server.base_url)
    return server.start()


def _migrate(settings: Settings, args: argparse.Namespace) -> int:
    _configure_logging(settings, args)
    db = Database(settings.effective_database_url)
    try:
        db.migrate()
        print(f"gpubot: the database is at revision {db.current_revision()}")
    finally:
        db.dispose()
    return 0


def _check(settings: Settings, args: argparse.Namespace) -> int:
    """Print one line per problem in the configuration and return 1, or ``ok`` and 0."""
    problems = check(settings)
    for problem in problems:
        print(problem.line())
    if not problems:
        print("ok")
    return 1 if problems else 0


def _runtime(settings: Settings) -> tuple[Runtime, WebClient]:
    from bot.app import build_runtime

    client = make_client(settings)
    metrics = Metrics()
    notifier = SlackNotifier(client, metrics=metrics)
    return build_runtime(settings, notifier=notifier, metrics=metrics), client


def _configure_logging(
    settings: Settings, args: argparse.Namespace, *, file: Path | None = None
) -> None:
    """Logging at --log-level (else GPUBOT_LOG_LEVEL) in GPUBOT_LOG_FORMAT."""
    level = args.log_level or settings.log_level
    configure_logging(level, file=file, json_format=settings.log_format == "json")


#: Of the stop's budget (GPUBOT_STOP_TIMEOUT_S), kept for abandoning what still runs (closing
#: SSH connections, the store), seconds.
ABANDON_S = 3.0


def _run_until_signal(
    rt: Runtime,
    *,
    start: Callable[[], None],
    stop: Callable[[], None],
    health: Health | None = None,
    also: Callable[[], None] | None = None,
    exit_now: Callable[[int], None] = os._exit,
) -> int:
    """Start the clock (reporting its ticks to ``health``), run ``start`` until SIGTERM/SIGINT
    calls ``stop``, then clean up within GPUBOT_STOP_TIMEOUT_S seconds of the signal: no new
    work is taken, what runs may finish until the budget's last ``ABANDON_S`` seconds, then SSH
    connections are closed (hung channels abandoned). If work still runs after that, the process
    ends through ``exit_now`` rather than wait on it; what it abandoned (a release claim, a job
    poll) is picked up by the next start once its claim lapses."""
    from bot.app import start_clock

    signalled: list[float] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %s: stopping", signum)
        signalled.append(time.monotonic())
        threading.Thread(target=stop, name="gpubot-stop", daemon=True).start()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    clock = start_clock(rt, health=health, also=also)
    try:
        start()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_timeout_s = rt.settings.stop_timeout_s
        deadline = (signalled[0] if signalled else time.monotonic()) + stop_timeout_s
        if not _wind_down(rt, clock, deadline):
            log.warning("stopping: work still running abandoned; the next start takes it up")
            logging.shutdown()
            exit_now(0)
    return 0


def _wind_down(rt: Runtime, clock: SchedulerHandle | None, deadline: float) -> bool:
    """Stop taking work, let what runs finish until ``ABANDON_S`` before ``deadline``
    (time.monotonic), then close SSH connections and the store. False when work was still
    running at the deadline."""
    if clock is not None:
        clock.shutdown(wait=False)
    rt.executor.shutdown(wait=False)
    if rt.platform_work is not None:
        rt.platform_work.shutdown(wait=False)
    drain_until = deadline - ABANDON_S
    idle = _executor_idle(rt, max(0.0, drain_until - time.monotonic()))
    if rt.platform_work is not None:
        idle = rt.platform_work.wait_idle(max(0.0, drain_until - time.monotonic())) and idle
    rt.fleet.close()  # abandons channels still hung on an instance
    if not idle:
        idle = _executor_idle(rt, max(0.0, min(1.0, deadline - time.monotonic())))
    rt.db.dispose()
    return idle


def _executor_idle(rt: Runtime, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for the bot's pool to be idle (True for a pool that
    cannot say)."""
    executor = rt.executor
    return executor.wait_idle(timeout_s) if isinstance(executor, BotExecutor) else True


def _check_bot_token(settings: Settings) -> None:
    """Ask Slack whether the bot token works. Raises ConfigError when Slack refuses it; a Slack
    that cannot be reached only logs a warning (Bolt asks again on the first request)."""
    try:
        make_client(settings).auth_test()
    except SlackApiError as exc:
        code = exc.response.get("error", "unknown_error")
        raise ConfigError(
            f"Slack refused SLACK_BOT_TOKEN: {code}.",
            hint="Use the Bot User OAuth Token (xoxb-...) from the app's Install App page.",
        ) from exc
    except (SlackClientError, OSError) as exc:
        log.warning("could not reach Slack to check the bot token: %s", exc)


def _require(value: str | None, name: str, what: str) -> None:
    if not value:
        raise ConfigError(f"{name} is not set.", hint=f"Set it to {what}.")


_MODES: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "console": _console,
    "serve": _serve,
    "socket": _socket,
    "feishu": _feishu,
    "migrate": _migrate,
}


if __name__ == "__main__":
    sys.exit(main())
