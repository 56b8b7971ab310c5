"""HTTP mode: Slack's signed requests served to the Bolt app by waitress, a WSGI server.

The Slack port answers ``POST /slack/events`` alone. Its signature (``v0=`` HMAC-SHA256 of
``v0:{timestamp}:{body}``) and timestamp (at most 30 s ahead, 5 minutes behind) are checked
before anything parses the body: a request that fails is answered 401 with one log line, a
signed body Bolt cannot read 400 (https://api.slack.com/authentication/verifying-requests-from-slack).
It then goes to ``app.dispatch`` (which checks the signature again and, through bot.replay,
answers a signature already applied without running anything).

:class:`OpsEndpoints` answers probes and Prometheus: ``GET /healthz`` (liveness: ``ok``),
``GET /readyz`` (readiness, bot.health: 200 or 503 with one line per check) and ``GET /metrics``
(bot.metrics), on a listener of their own (:func:`ops_server`, loopback by default) with its own
threads, in HTTP mode as in Socket Mode: neither a scrape nor a flood on one port reaches the
other. A form body that merely contains the word "payload", which Bolt alone reads as an empty
request, keeps its fields.

Limits, so that no client can hold the bot:

- a fixed pool of worker threads runs the app; new connections are always accepted: when
  ``connection_limit`` connections are open, or ``peer_limit`` from one address, the one that
  has waited longest for its client (idle keep-alive, or a request still arriving) is closed
  first to make room, so idle or slow connections cannot hold the port shut (connections whose
  request is being answered are never closed for room);
- a request must arrive whole, headers and body, within ``request_timeout_s`` (a few seconds)
  of its connection being ready for it (accepted, or the previous answer sent), however slowly
  its bytes trickle in; past that the connection is closed, as is a keep-alive connection left
  idle that long;
- a body over ``max_body_bytes`` is answered 413 from its ``Content-Length`` alone, and
  headers over :data:`MAX_HEADER_BYTES` with 431;
- :meth:`SlackHttpServer.shutdown` stops accepting, closes idle connections, lets requests in
  flight finish for at most ``drain_timeout_s``, then closes whatever is left.

The threads that answer ask for the interpreter's lock (the GIL) among the command threads'
pure Python; a thread that asks waits up to the switch interval (5 ms by default) each time,
and an ack asks a dozen times (each socket read and write gives the lock up). So the Slack
port, once serving, lowers the process's switch interval to :data:`SWITCH_INTERVAL_S`: acks get
the lock within that of asking however busy the command threads are, at the cost of more
switches among those. The executor also holds new work while requests are being acked
(bot.executor.ACKS).

Request bodies stay out of the log: Bolt reports a bad signature with the whole body at INFO,
so its records lose the body and are cut to :data:`MAX_LOG_MESSAGE_CHARS`; waitress logs
paths, never bodies.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl
from wsgiref.types import StartResponse, WSGIEnvironment

from slack_bolt import App, BoltContext, BoltRequest, BoltResponse
from slack_bolt.adapter.wsgi import SlackRequestHandler
from slack_bolt.adapter.wsgi.http_request import WsgiHttpRequest
from slack_bolt.request.internals import build_context
from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

from bot.executor import ACKS
from bot.replay import FUTURE_SKEW_S

if TYPE_CHECKING:
    from bot.health import Health

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
METRICS_PATH = "/metrics"
FORM_TYPE = "application/x-www-form-urlencoded"
#: The largest request body accepted (bytes); Slack's payloads are a few kB.
MAX_BODY_BYTES = 1024 * 1024
#: The largest request line plus headers accepted (bytes).
MAX_HEADER_BYTES = 32 * 1024
#: Seconds a request may take to arrive whole (headers and body); Slack sends a few kB at once.
REQUEST_TIMEOUT_S = 5.0
#: Seconds :meth:`SlackHttpServer.shutdown` lets requests in flight finish.
DRAIN_TIMEOUT_S = 20.0
#: Worker threads that run the app.
THREADS = 8
#: Connections open at once; past it the longest-waiting idle one is closed.
CONNECTION_LIMIT = 1000
#: Connections open at once from one client address; past it its longest-waiting idle one is
#: closed.
PEER_LIMIT = 64
#: How old a request's timestamp may be (seconds), Slack's five minutes.
PAST_SKEW_S = 5 * 60
#: The longest message a Bolt log record keeps (characters).
MAX_LOG_MESSAGE_CHARS = 1000
#: Seconds the worker threads get to exit once the drain is over.
_THREADS_EXIT_S = 1
#: The interpreter's switch interval (seconds) while the Slack port serves.
SWITCH_INTERVAL_S = 0.0005
#: Worker threads, connections and request timeout of the ops endpoints' own listener.
OPS_THREADS = 2
OPS_CONNECTION_LIMIT = 16
OPS_REQUEST_TIMEOUT_S = 10.0


class OpsEndpoints:
    """``GET``/``HEAD`` of ``/healthz`` (200 ``ok`` while the process answers), ``/readyz``
    (``health.ready()``: 200, or 503 when a check fails; 404 without ``health``) and
    ``/metrics`` (``metrics()`` gives the body and its content type; 404 without it)."""

    def __init__(
        self,
        *,
        health: Health | None = None,
        metrics: Callable[[], tuple[bytes, str]] | None = None,
    ) -> None:
        self.health = health
        self.metrics = metrics

    def serves(self, environ: WSGIEnvironment) -> bool:
        """Whether the request is a probe or a scrape this answers."""
        if environ.get("REQUEST_METHOD") not in {"GET", "HEAD"}:
            return False
        path = environ.get("PATH_INFO")
        return (
            path == HEALTH_PATH
            or (path == READY_PATH and self.health is not None)
            or (path == METRICS_PATH and self.metrics is not None)
        )

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """The WSGI answer; anything :meth:`serves` does not take is 404."""
        path = environ.get("PATH_INFO")
        if not self.serves(environ):
            status, body, kind = "404 Not Found", b"not found\n", "text/plain; charset=utf-8"
        elif path == READY_PATH and self.health is not None:
            verdict = self.health.ready()
            status = "200 OK" if verdict.ok else "503 Service Unavailable"
            body, kind = verdict.text().encode(), "text/plain; charset=utf-8"
        elif path == METRICS_PATH and self.metrics is not None:
            body, kind = self.metrics()
            status = "200 OK"
        else:
            status, body, kind = "200 OK", b"ok", "text/plain"
        start_response(
            status,
            [
                ("content-type", kind),
                ("content-length", str(len(body))),
                ("cache-control", "no-store"),
            ],
        )
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]


class SlackHttpServer:
    """Serves ``app`` at ``/slack/events`` on ``host:port`` (port 0 picks a free one; a name
    binds its first address), and nothing else; with ``app`` None, ``chat`` instead (a WSGI
    app that answers its own path: bot.feishu.serve's ``/feishu/events``), or the ``ops``
    endpoints (without ``ops``, ``/healthz`` alone answers ``ok``). The socket is bound and
    listening once constructed. Raises OSError when the address cannot be bound, ValueError
    when a limit is not positive or more than one of ``app``, ``chat`` and ``ops`` is given
    (the ops endpoints have their own listener: :func:`ops_server`)."""

    def __init__(
        self,
        app: App | None,
        *,
        ops: OpsEndpoints | None = None,
        chat: Callable[[WSGIEnvironment, StartResponse], Iterable[bytes]] | None = None,
        host: str = "127.0.0.1",
        port: int = 3000,
        threads: int = THREADS,
        connection_limit: int = CONNECTION_LIMIT,
        peer_limit: int = PEER_LIMIT,
        max_body_bytes: int = MAX_BODY_BYTES,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
    ) -> None:
        if min(threads, connection_limit, peer_limit, max_body_bytes) < 1:
            raise ValueError(
                "threads, connection_limit, peer_limit and max_body_bytes must be at least 1"
            )
        if sum(part is not None for part in (app, ops, chat)) > 1:
            raise ValueError("the Slack port serves /slack/events alone; use ops_server")
        if min(request_timeout_s, drain_timeout_s) <= 0:
            raise ValueError("request_timeout_s and drain_timeout_s must be positive")
        self.app = app
        #: Whether this port answers a chat platform (its acks then get the lock sooner).
        self.serves_chat = app is not None or chat is not None
        self.threads = threads
        self.request_timeout_s = request_timeout_s
        self.drain_timeout_s = drain_timeout_s
        # The loop wakes at least this often (seconds) to enforce the deadlines.
        self._tick_s = max(0.01, min(0.25, request_timeout_s / 10, drain_timeout_s / 10))
        self.ops = ops if ops is not None else OpsEndpoints()
        wsgi: Callable[[WSGIEnvironment, StartResponse], Iterable[bytes]] = self.ops
        if app is not None:
            keep_bodies_out_of_logs(app)
            wsgi = _BoltWsgi(app, path=EVENTS_PATH)
        elif chat is not None:
            wsgi = chat
        adj = Adjustments(
            host=host,
            port=port,
            threads=threads,
            # waitress counts its listening socket and its wake-up pipe as connections; room
            # is made below the limit before each accept, so waitress's own stop (which leaves
            # new connections in the accept queue) is reached only when all are busy.
            connection_limit=connection_limit + 3,
            # waitress refuses a body of this size or more.
            max_request_body_size=max_body_bytes + 1,
            max_request_header_size=MAX_HEADER_BYTES,
            expose_tracebacks=False,
            ident="gpubot",
        )
        self._map: dict[int, Any] = {}
        self._dispatcher = ThreadedTaskDispatcher()
        self._server = _Server(
            wsgi,
            map=self._map,
            dispatcher=self._dispatcher,
            adj=adj,  # binds the first address of adj.listen
        )
        self._server.room = _Room(total=connection_limit, per_peer=peer_limit)
        host_bound, port_bound = self._server.getsockname()
        self._host, self._port = str(host_bound), int(port_bound)
        self._lock = threading.Lock()
        self._state = "new"  # then "serving", "closing", "stopped"
        self._drain_until: float | None = None  # monotonic; set by shutdown()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port actually bound."""
        return self._port

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` of the bound address."""
        shown = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{shown}:{self.port}"

    @property
    def url(self) -> str:
        """The request URL to give Slack (``http://HOST:PORT/slack/events``)."""
        return f"{self.base_url}{EVENTS_PATH}"

    def serve_forever(self) -> None:
        """Serve in this thread until :meth:`shutdown` (from another thread) has drained the
        connections. Returns at once when shutdown came first."""
        with self._lock:
            if self._state != "new":
                return
            self._state = "serving"
        if self.serves_chat:
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._dispatcher.set_thread_count(self.threads)
        try:
            while self._tend(time.monotonic()):
                wasyncore.poll2(self._tick_s, self._map)
        finally:
            self._close_all()

    def start(self) -> SlackHttpServer:
        """Serve in a background thread; returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="gpubot-http")
        self._thread.daemon = True
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop accepting, close idle connections, let requests in flight finish for at most
        ``drain_timeout_s`` seconds, then close the rest; returns once done (the drain plus
        about a second). Safe to call more than once and from any thread but the serving one."""
        with self._lock:
            if self._drain_until is None:
                self._drain_until = time.monotonic() + self.drain_timeout_s
            never_served = self._state == "new"
            if never_served:
                self._state = "stopped"
        if never_served:
            self._close_all()
        else:
            self._wake()
            if not self._done.wait(self.drain_timeout_s + _THREADS_EXIT_S + 5):
                log.warning("the HTTP server did not stop within its drain timeout")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _tend(self, now: float) -> bool:
        """Enforce the request deadline and run the drain, in the serving thread (connections
        are not thread-safe); False once the loop should end."""
        drain_until = self._drain_until
        if drain_until is not None and not self._server.draining:
            self._start_drain()
        for channel in self._channels():
            if channel.will_close or channel.close_when_flushed:
                continue  # closes itself once its answer is sent
            if channel.requests or channel.total_outbufs_len:
                channel.waiting_since = None  # being answered: the client is not to blame
                continue
            if channel.waiting_since is None:
                channel.waiting_since = now
            if self._server.draining and channel.request is None:
                channel.handle_close()  # idle: nothing to finish
            elif now - channel.waiting_since > self.request_timeout_s:
                if channel.request is not None:
                    log.info(
                        "closed a connection from %s: its request did not arrive within %g s",
                        _peer(channel),
                        self.request_timeout_s,
                    )
                channel.handle_close()
        if drain_until is None:
            return True
        left = self._channels()
        if left and now >= drain_until:
            log.warning(
                "closing %d connection(s) still open after the %g s drain",
                len(left),
                self.drain_timeout_s,
            )
            for channel in left:
                channel.handle_close()
            return False
        return bool(left)

    def _start_drain(self) -> None:
        self._server.draining = True
        self._server.accepting = False
        wasyncore.dispatcher.close(self._server)  # the listening socket; the trigger stays
        busy = sum(1 for channel in self._channels() if channel.requests or channel.request)
        log.info(
            "HTTP server draining: no new connections; %d request(s) arriving or being "
            "answered get up to %g s",
            busy,
            self.drain_timeout_s,
        )

    def _channels(self) -> list[_Channel]:
        return [d for d in list(self._map.values()) if isinstance(d, _Channel)]

    def _wake(self) -> None:
        """Wake the serving loop now rather than at its next tick; a loop that already closed
        its trigger is ending anyway, so there is nothing to wake."""
        with self._lock:
            if self._state != "serving":
                return
            try:
                self._server.pull_trigger()
            except OSError:
                log.debug("the HTTP server's trigger was already closed")

    def _close_all(self) -> None:
        try:
            for channel in self._channels():
                channel.handle_close()
            self._dispatcher.shutdown(cancel_pending=True, timeout=_THREADS_EXIT_S)
            with self._lock:  # the trigger closes here: never while shutdown() pulls it
                self._state = "closing"
                wasyncore.close_all(self._map, ignore_all=True)  # listening socket, trigger
        finally:
            with self._lock:
                self._state = "stopped"
            self._done.set()


class _Channel(HTTPChannel):
    """A waitress connection that remembers since when (monotonic seconds) it has waited for
    its client to send a whole request; None while its last request is being answered."""

    server: _Server
    waiting_since: float | None

    def __init__(
        self, server: _Server, sock: Any, addr: Any, adj: Adjustments, map: Any = None
    ) -> None:
        self.waiting_since = time.monotonic()
        super().__init__(server, sock, addr, adj, map)

    def readable(self) -> bool:
        # While draining, read only the rest of a request already begun.
        if self.server.draining and self.request is None:
            return False
        return super().readable()


@dataclass(frozen=True)
class _Room:
    """Bounds on open connections: in all, and from one client address."""

    total: int
    per_peer: int


class _Server(TcpWSGIServer):
    channel_class = _Channel
    draining = False
    room = _Room(total=CONNECTION_LIMIT, per_peer=PEER_LIMIT)

    def readable(self) -> bool:
        # Before waitress decides whether to accept, close the longest-waiting idle
        # connections so that one more fits: a new connection is always accepted.
        if self.accepting and not self.draining and len(self._map) > self.room.total:  # type: ignore[attr-defined]
            self._make_room(self._idle(), len(self._open()) - self.room.total + 1)
        return bool(super().readable())

    def handle_accept(self) -> None:
        super().handle_accept()
        by_peer: dict[str, list[_Channel]] = {}
        for channel in self._open():
            by_peer.setdefault(_peer(channel), []).append(channel)
        for peer, channels in by_peer.items():
            if len(channels) > self.room.per_peer:
                idle = [c for c in self._idle() if _peer(c) == peer]
                self._make_room(idle, len(channels) - self.room.per_peer)

    def _open(self) -> list[_Channel]:
        channels: dict[int, Any] = self._map  # type: ignore[attr-defined]
        return [d for d in list(channels.values()) if isinstance(d, _Channel)]

    def _idle(self) -> list[_Channel]:
        """Connections waiting for their client, longest-waiting first."""
        idle = [
            c
            for c in self._open()
            if c.waiting_since is not None
            and not (c.requests or c.total_outbufs_len or c.will_close or c.close_when_flushed)
        ]
        return sorted(idle, key=lambda c: c.waiting_since or 0.0)

    def _make_room(self, idle: list[_Channel], count: int) -> None:
        if count <= 0:
            return
        closing = idle[:count]
        for channel in closing:
            channel.handle_close()
        if closing:
            log.info("closed %d idle or slow connection(s) to make room for new ones", len(closing))

    def add_task(self, task: Any) -> None:
        # waitress hands over the connection whose request has just arrived whole.
        if isinstance(task, _Channel):
            task.waiting_since = None
        super().add_task(task)


def ops_server(ops: OpsEndpoints, *, host: str, port: int) -> SlackHttpServer:
    """A server of the ``ops`` endpoints alone, with its own few threads and connections
    (both modes). Raises OSError when the address cannot be bound."""
    return SlackHttpServer(
        None,
        ops=ops,
        host=host,
        port=port,
        threads=OPS_THREADS,
        connection_limit=OPS_CONNECTION_LIMIT,
        request_timeout_s=OPS_REQUEST_TIMEOUT_S,
        drain_timeout_s=OPS_REQUEST_TIMEOUT_S,
    )


class _BoltWsgi(SlackRequestHandler):
    """Bolt's WSGI adapter, verifying before parsing; a body that is not UTF-8 is decoded with
    replacement characters (its signature then fails: 401) rather than raising. Any other path
    is 404."""

    def __init__(self, app: App, *, path: str, clock: Callable[[], float] = time.time) -> None:
        super().__init__(app, path=path)
        self.clock = clock
        secret: str = getattr(app, "_signing_secret", "") or ""
        self.secret = secret.encode()
        # Bolt's own check runs too, afterwards; without a secret Bolt verifies nothing.
        self.verify = bool(secret)

    def dispatch(self, request: WsgiHttpRequest) -> BoltResponse:
        length = int(request.environ.get("CONTENT_LENGTH") or 0)
        stream = request.environ.get("wsgi.input")
        raw = stream.read(length) if stream is not None and length > 0 else b""
        body = raw.decode("utf-8", errors="replace")
        headers = request.get_headers()
        refusal = self._refusal(raw, headers)
        if refusal is not None:
            log.info("refused a request from %s: %s", _remote(request), refusal)
            return BoltResponse(status=401, body="")
        try:
            bolt_request = self._parse(body, request.query_string, headers)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            # A signed body Bolt cannot read (bad JSON, a payload that is not an object).
            log.info("refused a signed request whose body cannot be read: %s", type(exc).__name__)
            return BoltResponse(status=400, body="")
        with ACKS.acking():  # the executor's work waits for the acks (bot.executor)
            return self.app.dispatch(bolt_request)

    def _refusal(self, raw: bytes, headers: dict[str, str | Sequence[str]]) -> str | None:
        """Why a request is refused before anything reads its body, or None: Slack's
        signature (``v0=`` HMAC-SHA256 of ``v0:{timestamp}:{body}``) and its timestamp,
        at most :data:`FUTURE_SKEW_S` ahead and :data:`PAST_SKEW_S` behind now. Source:
        https://api.slack.com/authentication/verifying-requests-from-slack."""
        if not self.verify:
            return None
        stamp = _first(headers, "x-slack-request-timestamp")
        signature = _first(headers, "x-slack-signature")
        if not stamp or not signature:
            return "no signature or timestamp"
        if not (stamp.isascii() and stamp.isdigit()):
            return "a timestamp that is not a number"
        stamp_s = int(stamp)
        now_s = self.clock()
        if stamp_s > now_s + FUTURE_SKEW_S:
            return f"a timestamp {stamp_s - now_s:.0f} s in the future"
        if stamp_s < now_s - PAST_SKEW_S:
            return f"a timestamp {now_s - stamp_s:.0f} s old"
        base = b"v0:" + stamp.encode() + b":" + raw  # the bytes Slack signed
        expected = "v0=" + hmac.new(self.secret, base, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
            return "a bad signature"
        return None

    def _parse(self, body: str, query: str, headers: dict[str, str | Sequence[str]]) -> BoltRequest:
        bolt_request = BoltRequest(body=body, query=query, headers=headers)
        _restore_form_fields(bolt_request)
        return bolt_request


def _restore_form_fields(request: BoltRequest) -> None:
    """Bolt takes a form body that merely contains the word "payload" (a slash command's text,
    say) for an interactive payload, finds none, and sees an empty request; give such a form
    its fields back."""
    if request.body or (request.content_type or "").lower() != FORM_TYPE:
        return
    form = dict(parse_qsl(request.raw_body, keep_blank_values=True))
    if form and "payload" not in form:
        request.body = form
        request.context = build_context(BoltContext({}), form)


def _first(headers: dict[str, str | Sequence[str]], name: str) -> str | None:
    values = headers.get(name)
    if isinstance(values, str):
        return values
    return values[0] if values else None


def _remote(request: WsgiHttpRequest) -> str:
    return str(request.environ.get("REMOTE_ADDR") or "an unknown address")


def _peer(channel: HTTPChannel) -> str:
    addr = channel.addr
    return str(addr[0]) if isinstance(addr, tuple) and addr else str(addr)


# --- logging -------------------------------------------------------------------------------------

#: Where Bolt's messages put a request body; what follows is replaced.
_BODY_MARKERS = (", body: ", " for the request (")


class _NoRequestBodies(logging.Filter):
    """Takes request bodies out of Bolt's log records and cuts any record's message to
    :data:`MAX_LOG_MESSAGE_CHARS` characters."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError, KeyError):
            return True  # a broken record: the handler reports it
        cut = message
        for marker in _BODY_MARKERS:
            head, found, _ = cut.partition(marker)
            if found:
                cut = f"{head}{found}[not logged])"
        if len(cut) > MAX_LOG_MESSAGE_CHARS:
            more = len(cut) - MAX_LOG_MESSAGE_CHARS
            cut = f"{cut[:MAX_LOG_MESSAGE_CHARS]} [{more} more characters not logged]"
        if cut != message:
            record.msg, record.args = cut, ()
        return True


_NO_REQUEST_BODIES = _NoRequestBodies()


def keep_bodies_out_of_logs(app: App) -> None:
    """Filter the records of ``app``'s logger and of Bolt's own loggers (``slack_bolt.*``)
    so that no request body is logged. Bolt copies the app logger's filters to the loggers it
    makes later. Idempotent."""
    names = [
        name
        for name in list(logging.root.manager.loggerDict)
        if name == "slack_bolt" or name.startswith("slack_bolt.")
    ]
    # Bolt's signature check logs the whole body; make sure its logger is covered.
    names.append("slack_bolt.RequestVerification")
    for logger in [app.logger, *(logging.getLogger(name) for name in names)]:
        logger.addFilter(_NO_REQUEST_BODIES)
