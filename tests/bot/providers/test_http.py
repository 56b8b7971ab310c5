"""The REST helper: Retry-After, error documents, and redirects (against local servers)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bot.errors import (
    ProviderError,
    ProviderNotFound,
    ProviderRateLimited,
    ProviderUnknownOutcome,
)
from bot.providers.http import (
    JsonApi,
    mask_credentials,
    origin,
    rate_limit_wait_s,
    retry_after_s,
)


def test_retry_after_in_seconds_and_as_a_date() -> None:
    now = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
    assert retry_after_s("30") == 30
    assert retry_after_s("Wed, 02 Dec 2026 12:01:30 GMT", now=now) == 90
    assert retry_after_s("Wed, 02 Dec 2026 11:00:00 GMT", now=now) == 0
    assert retry_after_s("soon") is None
    assert retry_after_s(None) is None


def test_a_non_http_url_is_refused_without_a_request() -> None:
    api = JsonApi("vast", "file:///etc", headers={})
    with pytest.raises(ProviderError, match="not an http") as caught:
        api.get("/passwd")
    assert not caught.value.retryable


def test_unreachable_is_retryable() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = JsonApi("runpod", f"http://127.0.0.1:{port}", headers={}, timeout_s=2)
    with pytest.raises(ProviderError, match="cannot reach") as caught:
        api.get("/pods")
    assert caught.value.retryable


# --- redirects: the API key stays with the API's own host ---------------------------------------

KEY = "secret-api-key"


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    authorization: str | None


class Recorder:
    """A local HTTP server that records each request; ``answer`` decides the reply."""

    def __init__(self, answer: Callable[[str, str], tuple[int, dict[str, str], bytes]]) -> None:
        self.seen: list[Seen] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._handle()

            def do_POST(self) -> None:
                self._handle()

            def do_DELETE(self) -> None:
                self._handle()

            def _handle(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.seen.append(
                    Seen(self.command, self.path, self.headers.get("Authorization"))
                )
                status, headers, body = answer(self.command, self.path)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _json(data: Any) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json"}, json.dumps(data).encode()


@pytest.fixture
def elsewhere() -> Iterator[Recorder]:
    """Another host (here: another port) that would like the API key."""
    with Recorder(lambda method, path: _json({"stolen": True})) as server:
        yield server


def _redirecting(code: int, location: str) -> Recorder:
    def answer(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        if path.startswith("/moved"):
            return code, {"Location": location}, b""
        return _json({"path": path})

    return Recorder(answer)


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_host_is_not_followed(
    elsewhere: Recorder, code: int, method: str
) -> None:
    with _redirecting(code, f"{elsewhere.url}/steal") as api_server:
        api = JsonApi.bearer("lambda", api_server.url, KEY)
        with pytest.raises(ProviderError, match=r"redirected .* to another host") as caught:
            api.request(method, "/moved", body={"x": 1} if method == "POST" else None)
        assert [(s.path, s.authorization) for s in api_server.seen] == [("/moved", f"Bearer {KEY}")]
    assert elsewhere.seen == []
    assert isinstance(caught.value, ProviderUnknownOutcome)
    assert not caught.value.retryable
    assert elsewhere.url.removeprefix("http://") in caught.value.message
    assert KEY not in caught.value.user_text()
    assert "Check GPUBOT_LAMBDA_API_URL" in caught.value.user_text()


@pytest.mark.parametrize(
    "location",
    [
        "https://{host}/moved-on",  # the same host and port, but another scheme
        "http://localhost:{port}/moved-on",  # the same machine under another name
    ],
)
def test_another_scheme_or_host_name_counts_as_another_host(location: str) -> None:
    with Recorder(lambda method, path: (302, {"Location": target}, b"")) as api_server:
        host = api_server.url.removeprefix("http://")
        target = location.format(host=host, port=api_server.server.server_address[1])
        api = JsonApi.bearer("runpod", api_server.url, KEY)
        with pytest.raises(ProviderError, match="another host"):
            api.get("/pods")
        assert len(api_server.seen) == 1


@pytest.mark.parametrize("method", ["POST", "DELETE"])
@pytest.mark.parametrize("code", [301, 302, 307, 308])
def test_a_redirected_change_is_an_unknown_outcome(code: int, method: str) -> None:
    with _redirecting(code, "/v2/pods") as api_server:
        api = JsonApi.bearer("vast", api_server.url, KEY)
        with pytest.raises(ProviderUnknownOutcome, match="redirect") as caught:
            api.request(method, "/moved", body={"x": 1} if method == "POST" else None)
        assert [s.path for s in api_server.seen] == ["/moved"]
    assert caught.value.retryable


@pytest.mark.parametrize("code", [301, 302, 307, 308])
def test_a_redirect_within_the_api_is_followed_with_the_key(code: int) -> None:
    with _redirecting(code, "/v2/pods") as api_server:
        api = JsonApi.bearer("vast", api_server.url, KEY)
        assert api.get("/moved") == {"path": "/v2/pods"}
        assert [(s.path, s.authorization) for s in api_server.seen] == [
            ("/moved", f"Bearer {KEY}"),
            ("/v2/pods", f"Bearer {KEY}"),
        ]


def test_origin_fills_in_default_ports_and_ignores_case() -> None:
    assert origin("HTTPS://API.Example.com/v1") == ("https", "api.example.com", 443)
    assert origin("http://api.example.com:80/x") == ("http", "api.example.com", 80)
    assert origin("http://api.example.com:8080") != origin("http://api.example.com")


# --- what a 404 means: only the platform's own not-found document ------------------------------


def _answering(status: int, content_type: str, body: bytes) -> Recorder:
    headers = {"Content-Type": content_type} if content_type else {}
    return Recorder(lambda method, path: (status, headers, body))


def _is_ours(document: object) -> bool:
    return isinstance(document, dict) and document.get("code") == "object-does-not-exist"


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/html", b"<html><body>404 page not found</body></html>"),
        ("text/plain", b"404 page not found"),
        ("", b""),
        ("application/json", b'{"message": "no route"}'),
        ("application/json", b"not json at all"),
    ],
)
@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_404_that_is_not_the_platforms_document_is_an_unknown_outcome(
    method: str, content_type: str, body: bytes
) -> None:
    with _answering(404, content_type, body) as server:
        api = JsonApi.bearer("lambda", server.url, KEY, not_found=_is_ours)
        with pytest.raises(ProviderUnknownOutcome) as caught:
            api.request(method, "/instances/abc")
    assert not isinstance(caught.value, ProviderNotFound)
    assert caught.value.retryable
    assert caught.value.status == 404
    assert "unknown" in caught.value.message


def test_the_platforms_own_not_found_document_is_not_found() -> None:
    body = json.dumps({"code": "object-does-not-exist"}).encode()
    with _answering(404, "application/json; charset=utf-8", body) as server:
        api = JsonApi.bearer("lambda", server.url, KEY, not_found=_is_ours)
        with pytest.raises(ProviderNotFound):
            api.get("/instances/abc")


def test_a_problem_document_counts_as_json() -> None:
    body = json.dumps({"title": "Not Found", "status": 404, "detail": "no pod"}).encode()
    with _answering(404, "application/problem+json", body) as server:
        api = JsonApi.bearer("runpod", server.url, KEY, not_found=lambda d: d.get("status") == 404)
        with pytest.raises(ProviderNotFound, match="no pod"):
            api.get("/pods/x")


def test_a_success_that_is_not_json_is_an_unknown_outcome() -> None:
    with _answering(200, "text/html", b"<html>Welcome to nginx</html>") as server:
        api = JsonApi.bearer("vast", server.url, KEY)
        with pytest.raises(ProviderUnknownOutcome, match="not JSON"):
            api.get("/api/v1/instances/")


def test_a_plain_text_429_is_rate_limited_without_a_wait() -> None:
    with _answering(429, "text/plain", b"Too Many Requests") as server:
        api = JsonApi.bearer("vast", server.url, KEY)
        with pytest.raises(ProviderRateLimited) as caught:
            api.get("/api/v0/instances/1/")
    assert caught.value.retry_after_s is None


def test_ratelimit_headers_give_the_wait() -> None:
    assert rate_limit_wait_s({"RateLimit": "limit=10, remaining=0, reset=7"}) == 7
    assert rate_limit_wait_s({"RateLimit": '"default";r=0;t=3'}) == 3
    assert rate_limit_wait_s({"Retry-After": "2", "RateLimit": "reset=9"}) == 2
    assert rate_limit_wait_s({"RateLimit-Reset": "4"}) == 4
    assert rate_limit_wait_s({}) is None


def test_credentials_in_error_text_are_masked() -> None:
    text = "bad request: PublicKey=abc123&Signature=deadbeef Authorization: Bearer sk-1"
    masked = mask_credentials(text)
    assert "abc123" not in masked
    assert "deadbeef" not in masked
    assert "sk-1" not in masked
    assert masked.startswith("bad request: PublicKey=***")
