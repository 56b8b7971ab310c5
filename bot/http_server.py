"""HTTP mode: Slack's signed requests served to the Bolt app by a threading HTTP server.

``POST /slack/events`` goes to ``app.dispatch`` (which checks the signature and the timestamp,
and through bot.replay answers a signature it already accepted without running anything);
``GET /healthz`` answers ``ok`` for load balancers and container health checks.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from slack_bolt import App, BoltRequest

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
MAX_BODY_BYTES = 1024 * 1024


class SlackHttpServer:
    """Serves ``app`` on ``host:port`` (port 0 picks a free one); one thread per request."""

    def __init__(self, app: App, *, host: str = "127.0.0.1", port: int = 3000) -> None:
        self.app = app
        server_class = _Server6 if ":" in host else _Server
        self._server = server_class((host, port), _handler_for(app))
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port actually bound."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The request URL to give Slack (``http://HOST:PORT/slack/events``)."""
        host = str(self._server.server_address[0])
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}{EVENTS_PATH}"

    def serve_forever(self) -> None:
        """Serve in this thread until :meth:`shutdown` is called from another."""
        self._server.serve_forever(poll_interval=0.2)

    def start(self) -> SlackHttpServer:
        """Serve in a background thread; returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="gpubot-http")
        self._thread.daemon = True
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


class _Server(ThreadingHTTPServer):
    # Slack may send bursts: a deep accept queue keeps connections from waiting on SYN retries.
    request_queue_size = 256
    # Requests in flight finish (their work reaches the executor) before the server closes.
    daemon_threads = False
    block_on_close = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def _handler_for(app: App) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 30  # seconds a client may take to send its request

        def do_GET(self) -> None:
            if self.path.partition("?")[0] == "/healthz":
                self._send(HTTPStatus.OK, {"content-type": ["text/plain"]}, "ok")
            else:
                self._send(HTTPStatus.NOT_FOUND, {"content-type": ["text/plain"]}, "not found")

        def do_POST(self) -> None:
            path, _, query = self.path.partition("?")
            if path != EVENTS_PATH:
                self._send(HTTPStatus.NOT_FOUND, {"content-type": ["text/plain"]}, "not found")
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {}, "")
                return
            body = self.rfile.read(length).decode("utf-8", errors="replace")
            headers: dict[str, str | Sequence[str]] = {
                name.lower(): value for name, value in self.headers.items()
            }
            response = app.dispatch(BoltRequest(body=body, query=query, headers=headers))
            self._send(response.status, response.headers, response.body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s - %s", self.address_string(), format % args)

        def _send(self, status: int, headers: dict[str, Any], body: str) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            for name, values in headers.items():
                if name.lower() == "content-length":
                    continue
                for value in values if isinstance(values, list | tuple) else [values]:
                    self.send_header(name, str(value))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
