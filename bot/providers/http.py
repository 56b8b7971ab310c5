"""A small JSON-over-HTTPS client for the REST providers, on urllib.request.

HTTP answers become the provider errors: 401/403 ProviderAuthError, 404 ProviderNotFound, 429
ProviderRateLimited (with the Retry-After header in seconds), 5xx and network trouble
ProviderError(retryable=True), any other 4xx ProviderError(retryable=False).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from bot.errors import ProviderAuthError, ProviderError, ProviderNotFound, ProviderRateLimited

DEFAULT_TIMEOUT_S = 30.0
_DETAIL_CHARS = 300


class JsonApi:
    """Requests to one platform's API: ``base_url`` plus a path, with fixed headers."""

    def __init__(
        self,
        provider: str,
        base_url: str,
        *,
        headers: Mapping[str, str],
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers)
        self.timeout_s = timeout_s

    @classmethod
    def bearer(cls, provider: str, base_url: str, api_key: str | None) -> JsonApi:
        """An API that sends ``Authorization: Bearer KEY``; no key gets the platform's 401."""
        return cls(provider, base_url, headers={"Authorization": f"Bearer {api_key or ''}"})

    def get(self, path: str, *, query: Mapping[str, str] | None = None) -> Any:
        """GET ``path`` and return the parsed JSON (None for an empty body)."""
        return self.request("GET", path, query=query)

    def post(self, path: str, body: Any = None) -> Any:
        """POST JSON to ``path``."""
        return self.request("POST", path, body=body)

    def put(self, path: str, body: Any = None) -> Any:
        """PUT JSON to ``path``."""
        return self.request("PUT", path, body=body)

    def delete(self, path: str) -> Any:
        """DELETE ``path``."""
        return self.request("DELETE", path)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one request; raises the provider errors described in the module docstring."""
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        if not url.startswith(("http://", "https://")):
            raise ProviderError(
                f"{self.provider}: {self.base_url!r} is not an http(s) URL",
                retryable=False,
                hint="Fix the provider's API URL in the bot's environment.",
            )
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", **self.headers}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
        what = f"{self.provider}: {method} {path}"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _http_error(what, exc) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ProviderError(
                f"{what} failed: cannot reach the API ({reason})", retryable=True
            ) from exc
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ProviderError(f"{what} answered with something that is not JSON") from exc


def _http_error(what: str, exc: urllib.error.HTTPError) -> ProviderError:
    detail = _detail(exc)
    message = f"{what} answered HTTP {exc.code}" + (f": {detail}" if detail else "")
    if exc.code in (401, 403):
        return ProviderAuthError(message)
    if exc.code == 404:
        return ProviderNotFound(message)
    if exc.code == 429:
        return ProviderRateLimited(
            message, retry_after_s=retry_after_s(exc.headers.get("Retry-After"))
        )
    if exc.code >= 500:
        return ProviderError(message, retryable=True)
    return ProviderError(message, retryable=False)


def retry_after_s(value: str | None, *, now: datetime | None = None) -> float | None:
    """A Retry-After header (seconds, or an HTTP date) as seconds from now; None if absent or
    unreadable."""
    if not value:
        return None
    text = value.strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    try:
        at = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return max((at - (now or datetime.now(UTC))).total_seconds(), 0.0)


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read()
    except OSError:
        return ""
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:_DETAIL_CHARS]
    return _message_in(data)[:_DETAIL_CHARS]


def _message_in(data: Any) -> str:
    """The human part of an error document: Lambda's {"error": {"message"}}, RunPod's
    {"error": "..."}, Vast's {"msg": "..."} and the like."""
    if isinstance(data, dict):
        for key in ("error", "message", "msg", "detail"):
            value = data.get(key)
            if isinstance(value, dict):
                return _message_in(value)
            if isinstance(value, str) and value:
                return value
    return json.dumps(data)[:_DETAIL_CHARS]
