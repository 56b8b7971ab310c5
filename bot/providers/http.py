"""A small JSON-over-HTTPS client for the REST providers, on urllib.request.

HTTP answers become the provider errors: 401/403 ProviderAuthError, 404 ProviderNotFound, 429
ProviderRateLimited (with the Retry-After header in seconds), 5xx and network trouble
ProviderError(retryable=True), any other 4xx ProviderError(retryable=False).

Redirects are followed only within the API's own scheme, host and port: the API key must never
reach another host, so a redirect elsewhere is not followed and raises ProviderError.

Every request names the bot in its User-Agent (``USER_AGENT``): APIs behind Cloudflare often
refuse urllib's default ``Python-urllib/3.x`` with 403.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from http.client import HTTPMessage
from typing import IO, Any

from bot import __version__
from bot.errors import ProviderAuthError, ProviderError, ProviderNotFound, ProviderRateLimited
from bot.i18n import t

DEFAULT_TIMEOUT_S = 30.0
#: What every request says it is (never urllib's default, which Cloudflare-fronted APIs refuse).
USER_AGENT = f"gpubot/{__version__}"
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
        self._opener = urllib.request.build_opener(_SameOriginRedirects(provider))

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
                t(
                    "{provider}: {base_url!r} is not an http(s) URL",
                    provider=self.provider,
                    base_url=self.base_url,
                ),
                retryable=False,
                hint=t("Fix the provider's API URL in the bot's environment."),
            )
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **self.headers}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
        what = f"{self.provider}: {method} {path}"
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _http_error(what, exc) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ProviderError(
                t("{what} failed: cannot reach the API ({reason})", what=what, reason=reason),
                retryable=True,
            ) from exc
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ProviderError(
                t("{what} answered with something that is not JSON", what=what)
            ) from exc


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the same scheme, host and port, so the API key in the
    request's headers never goes to another host; any other redirect raises ProviderError."""

    def __init__(self, provider: str) -> None:
        self.provider = provider

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if origin(newurl) != origin(req.full_url):
            fp.close()
            target = urllib.parse.urlsplit(newurl)
            raise ProviderError(
                t(
                    "{provider}: the API redirected {get_method} {path} to another "
                    "host ({scheme}://{netloc}); the bot does not send its API key "
                    "there",
                    provider=self.provider,
                    get_method=req.get_method(),
                    path=urllib.parse.urlsplit(req.full_url).path,
                    scheme=target.scheme,
                    netloc=target.netloc,
                ),
                retryable=False,
                hint=t(
                    "Check GPUBOT_{upper}_API_URL: it must be the platform's API "
                    "address itself, which answers without redirecting.",
                    upper=self.provider.upper(),
                ),
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def origin(url: str) -> tuple[str, str, int | None]:
    """A URL's scheme, host (lower case) and port (the scheme's default when not given)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = _DEFAULT_PORTS.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


_DEFAULT_PORTS = {"http": 80, "https": 443}


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
