"""The REST helper's pieces that need no server: Retry-After and error documents."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bot.errors import ProviderError
from bot.providers.http import JsonApi, retry_after_s


def test_retry_after_in_seconds_and_as_a_date():
    now = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
    assert retry_after_s("30") == 30
    assert retry_after_s("Wed, 02 Dec 2026 12:01:30 GMT", now=now) == 90
    assert retry_after_s("Wed, 02 Dec 2026 11:00:00 GMT", now=now) == 0
    assert retry_after_s("soon") is None
    assert retry_after_s(None) is None


def test_a_non_http_url_is_refused_without_a_request():
    api = JsonApi("vast", "file:///etc", headers={})
    with pytest.raises(ProviderError, match="not an http") as caught:
        api.get("/passwd")
    assert not caught.value.retryable


def test_unreachable_is_retryable():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = JsonApi("runpod", f"http://127.0.0.1:{port}", headers={}, timeout_s=2)
    with pytest.raises(ProviderError, match="cannot reach") as caught:
        api.get("/pods")
    assert caught.value.retryable
