"""A small JSON-over-HTTPS client for the REST providers, on urllib.request.

Only the platform's own answer confirms anything. HTTP answers become the provider errors:

- 401/403 ProviderAuthError; 429 ProviderRateLimited (with the Retry-After header in seconds,
  else the ``reset`` of a ``RateLimit`` header, else None: a plain-text 429 says nothing);
  409 ProviderBusy (a transition under way: the platform is up); 5xx and a request that could
  not be sent (refused, no route) ProviderError(retryable=True); a request sent whose answer
  never came whole (a read that timed out, a connection dropped) ProviderUnknownOutcome;
  any other 4xx with the platform's JSON error document ProviderError(retryable=False).
- 404 is ProviderNotFound **only** when the body is JSON and the provider's ``not_found``
  recogniser accepts it as the platform's own not-found document. Any other 404 (a proxy's
  catch-all HTML page, a retired API version, a moved host), a redirect that is not a GET's
  within the API, a body that is not JSON or one of another content type is
  ProviderUnknownOutcome: the request may or may not have happened.

Redirects are followed only for GET and only within the API's own scheme, host and port: the API
key must never reach another host, and a redirected DELETE or POST would come back as a GET that
proves nothing.

What is read is bounded (``MAX_ANSWER_BYTES``); error excerpts are cut and their credentials
masked (``mask_credentials``). Every request names the bot in its User-Agent (``USER_AGENT``):
APIs behind Cloudflare often refuse urllib's default ``Python-urllib/3.x`` with 403.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.message import Message
from email.utils import parsedate_to_datetime
from http.client import HTTPException, HTTPMessage
from typing import IO, Any

from bot import __version__
from bot.errors import (
    ProviderAuthError,
    ProviderBusy,
    ProviderError,
    ProviderNotFound,
    ProviderRateLimited,
    ProviderUnknownOutcome,
)
from bot.i18n import N_, t

DEFAULT_TIMEOUT_S = 30.0
#: What every request says it is (never urllib's default, which Cloudflare-fronted APIs refuse).
USER_AGENT = f"gpubot/{__version__}"
#: The most bytes read from one answer (a list of thousands of instances fits many times over).
MAX_ANSWER_BYTES = 32 * 1024 * 1024
_DETAIL_CHARS = 300
_JSON_TYPES = ("application/json", "application/problem+json")
_A_REDIRECT = N_("a redirect")
_A_FOREIGN_404 = N_("a 404 that is not the platform's")
_NOT_JSON_ERROR = N_("an error page that is not JSON")
_NOT_JSON = N_("an answer that is not JSON")

#: Recognises a platform's own not-found document, given the parsed JSON of a 404.
NotFoundRecogniser = Callable[[Any], bool]


def never(_document: Any) -> bool:
    """The recogniser of an API that has no not-found document: every 404 is unknown."""
    return False


class JsonApi:
    """Requests to one platform's API: ``base_url`` plus a path, with fixed headers.

    ``not_found`` tells the platform's own not-found document from any other 404."""

    def __init__(
        self,
        provider: str,
        base_url: str,
        *,
        headers: Mapping[str, str],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        not_found: NotFoundRecogniser = never,
    ) -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers)
        self.timeout_s = timeout_s
        self.not_found = not_found
        self._opener = urllib.request.build_opener(_SameOriginRedirects(provider))

    @classmethod
    def bearer(
        cls,
        provider: str,
        base_url: str,
        api_key: str | None,
        *,
        not_found: NotFoundRecogniser = never,
    ) -> JsonApi:
        """An API that sends ``Authorization: Bearer KEY``; no key gets the platform's 401."""
        return cls(
            provider,
            base_url,
            headers={"Authorization": f"Bearer {api_key or ''}"},
            not_found=not_found,
        )

    def get(self, path: str, *, query: Mapping[str, str] | None = None) -> Any:
        """GET ``path`` and return the parsed JSON (None for an empty body)."""
        return self.request("GET", path, query=query)

    def post(self, path: str, body: Any = None) -> Any:
        """POST JSON to ``path``."""
        return self.request("POST", path, body=body)

    def put(self, path: str, body: Any = None) -> Any:
        """PUT JSON to ``path``."""
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: Any = None) -> Any:
        """PATCH JSON to ``path``."""
        return self.request("PATCH", path, body=body)

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
        form: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one request (a JSON ``body``, or a ``form`` sent form-encoded); raises the
        provider errors described in the module docstring."""
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
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **self.headers}
        data: bytes | None = None
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
        what = f"{self.provider}: {method} {urllib.parse.urlsplit(url).path}"
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                raw = _read_bounded(response, what)
                status = response.status
                content_type = response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            raise self._http_error(what, exc) from exc
        except urllib.error.URLError as exc:
            # urllib wraps what fails before the request is sent (no route, refused, a timeout
            # connecting): the platform never saw it.
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ProviderError):
                raise reason from exc
            raise ProviderError(
                t("{what} failed: cannot reach the API ({reason})", what=what, reason=reason),
                retryable=True,
            ) from exc
        except (TimeoutError, ConnectionError, HTTPException) as exc:
            # Sent, but the answer never came whole (timed out, the connection dropped): the
            # platform may have done it.
            raise ProviderUnknownOutcome(
                t(
                    "{what} was sent, but no answer came ({reason}): it may have been done",
                    what=what,
                    reason=exc.__class__.__name__,
                ),
                answer=t("no answer ({reason})", reason=exc.__class__.__name__),
            ) from exc
        return _parse_success(what, status, content_type, raw)

    def _http_error(self, what: str, exc: urllib.error.HTTPError) -> ProviderError:
        content_type = exc.headers.get("Content-Type", "") if exc.headers else ""
        try:
            raw = _read_bounded(exc, what)
        except (OSError, ProviderError):
            raw = b""
        document = _json_document(content_type, raw)
        excerpt = mask_credentials(_excerpt(raw, document))
        message = f"{what} answered HTTP {exc.code}" + (f": {excerpt}" if excerpt else "")
        if 300 <= exc.code < 400:
            return _unknown(what, exc.code, content_type, raw, _A_REDIRECT)
        if exc.code == 404:
            if document is not None and self.not_found(document):
                return ProviderNotFound(message)
            return _unknown(what, exc.code, content_type, raw, _A_FOREIGN_404)
        if exc.code in (401, 403):
            return ProviderAuthError(message)
        if exc.code == 429:
            return ProviderRateLimited(message, retry_after_s=rate_limit_wait_s(exc.headers))
        if exc.code == 409:
            # The resource is busy (a transition under way, a lock): later may succeed.
            return ProviderBusy(message)
        if exc.code >= 500:
            return ProviderError(message, retryable=True)
        if document is None:
            return _unknown(what, exc.code, content_type, raw, _NOT_JSON_ERROR)
        return ProviderError(message, retryable=False)


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a GET's redirect only to the same scheme, host and port, so the API key in the
    request's headers never goes to another host; any other redirect raises
    ProviderUnknownOutcome."""

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
        path = urllib.parse.urlsplit(req.full_url).path
        if origin(newurl) != origin(req.full_url):
            fp.close()
            target = urllib.parse.urlsplit(newurl)
            raise ProviderUnknownOutcome(
                t(
                    "{provider}: the API redirected {get_method} {path} to another "
                    "host ({scheme}://{netloc}); the bot does not send its API key "
                    "there",
                    provider=self.provider,
                    get_method=req.get_method(),
                    path=path,
                    scheme=target.scheme,
                    netloc=target.netloc,
                ),
                status=code,
                answer=f"{code} Location: {target.scheme}://{target.netloc}",
                retryable=False,
                hint=t(
                    "Check GPUBOT_{upper}_API_URL: it must be the platform's API "
                    "address itself, which answers without redirecting.",
                    upper=self.provider.upper(),
                ),
            )
        if req.get_method() != "GET":
            fp.close()
            raise ProviderUnknownOutcome(
                t(
                    "{provider}: {get_method} {path} answered with a redirect ({code}); "
                    "whether it happened is unknown",
                    provider=self.provider,
                    get_method=req.get_method(),
                    path=path,
                    code=code,
                ),
                status=code,
                answer=f"{code} Location: {urllib.parse.urlsplit(newurl).path}",
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


_RESET = re.compile(r"(?:^|[;,\s])(?:reset|t)\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


def rate_limit_wait_s(headers: Mapping[str, str] | Message | None) -> float | None:
    """How long a 429 asks to wait, in seconds: ``Retry-After``, else the ``reset`` (or ``t``)
    of the IETF ``RateLimit`` header (``limit=10, remaining=0, reset=5`` or
    ``"default";r=0;t=5``), else ``RateLimit-Reset``; None when the answer says nothing."""
    if headers is None:
        return None
    wait = retry_after_s(headers.get("Retry-After"))
    if wait is not None:
        return wait
    combined = headers.get("RateLimit") or ""
    match = _RESET.search(combined)
    if match:
        return float(match.group(1))
    return retry_after_s(headers.get("RateLimit-Reset"))


_CREDENTIALS = re.compile(
    r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?(?:bearer\s+)?|bearer\s+|"
    r"(?:publickey|privatekey|signature|api[_-]?key|token|secret|password)[\"']?\s*[:=]\s*[\"']?)"
    r"([^\s\"'&,;}]+)"
)


def mask_credentials(text: str) -> str:
    """``text`` with what follows a key, token, signature or password replaced by ``***``."""
    return _CREDENTIALS.sub(lambda m: m.group(1) + "***", text)


def _read_bounded(response: IO[bytes], what: str) -> bytes:
    raw = response.read(MAX_ANSWER_BYTES + 1)
    if len(raw) > MAX_ANSWER_BYTES:
        raise ProviderUnknownOutcome(
            t(
                "{what} answered with more than {limit} MiB; the bot reads no more",
                what=what,
                limit=MAX_ANSWER_BYTES // (1024 * 1024),
            ),
            answer=f"over {MAX_ANSWER_BYTES} bytes",
        )
    return raw


def _is_json_type(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind in _JSON_TYPES or kind.endswith("+json")


def _json_document(content_type: str, raw: bytes) -> Any | None:
    """The parsed body when it is declared JSON and is; None otherwise."""
    if not _is_json_type(content_type) or not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _parse_success(what: str, status: int, content_type: str, raw: bytes) -> Any:
    if not raw.strip():
        return None
    document = _json_document(content_type, raw)
    if document is None:
        raise _unknown(what, status, content_type, raw, _NOT_JSON)
    return document


def _unknown(
    what: str, status: int, content_type: str, raw: bytes, kind: str
) -> ProviderUnknownOutcome:
    kind_type = content_type.split(";", 1)[0].strip() or "no content type"
    excerpt = mask_credentials(_excerpt(raw, None))
    return ProviderUnknownOutcome(
        t(
            "{what} answered HTTP {status} with {kind} ({content_type}): not the platform's "
            "own answer, so the outcome is unknown",
            what=what,
            status=status,
            kind=t(kind),
            content_type=kind_type,
        ),
        status=status,
        answer=f"{status} {kind_type} {excerpt}".strip(),
    )


def _excerpt(raw: bytes, document: Any | None) -> str:
    if document is not None:
        return _message_in(document)[:_DETAIL_CHARS]
    text = raw.decode("utf-8", errors="replace")
    text = re.sub(r"<[^>]{0,200}>", " ", text)
    return " ".join(text.split())[:_DETAIL_CHARS]


def _message_in(data: Any) -> str:
    """The human part of an error document: RFC 9457's ``detail`` (RunPod v2), Lambda's
    {"error": {"message"}}, Vast's {"msg": "..."} and the like."""
    if isinstance(data, dict):
        for key in ("detail", "error", "message", "msg", "title"):
            value = data.get(key)
            if isinstance(value, dict):
                return _message_in(value)
            if isinstance(value, str) and value:
                return value
    return json.dumps(data)[:_DETAIL_CHARS]
