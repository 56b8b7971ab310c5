"""The Notifier (bot/notify.py) on Slack's Web API: DMs, channel posts, updates, file uploads.

A failed call is counted in bot.metrics by method and by :func:`error_label`: one of Slack's
documented error codes in :data:`SLACK_ERROR_CODES`, ``unreachable`` when no answer came,
``http_5xx`` for a server error whose body is not Slack's JSON (a proxy's HTML page), else
``other``, so the label's values stay a fixed, small set whatever Slack answers.
"""

from __future__ import annotations

import http.client
import logging
import socket
import urllib.error
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
)
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState

from bot.errors import SlackError
from bot.metrics import Metrics
from bot.notify import MessageRef
from bot.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

_HINTS = {
    "channel_not_found": "Check GPUBOT_CHANNEL, and invite the bot to that channel.",
    "not_in_channel": "Invite the bot to the channel (/invite @gpubot).",
    "invalid_auth": "Check SLACK_BOT_TOKEN: it must be the bot token (xoxb-...) of this app.",
    "not_authed": "Set SLACK_BOT_TOKEN to the app's bot token (xoxb-...).",
    "missing_scope": "Add the missing scope from deploy/manifest.yaml and reinstall the app.",
    "ratelimited": "Slack asked the bot to slow down; it will try again later.",
}


#: Slack's documented error codes the error metric names as they are (any other is ``other``).
SLACK_ERROR_CODES = frozenset(
    {
        "access_denied",
        "account_inactive",
        "cant_update_message",
        "channel_not_found",
        "ekm_access_denied",
        "expired_trigger_id",
        "fatal_error",
        "file_not_found",
        "internal_error",
        "invalid_arguments",
        "invalid_auth",
        "invalid_blocks",
        "invalid_trigger_id",
        "is_archived",
        "message_not_found",
        "missing_scope",
        "msg_too_long",
        "no_text",
        "not_authed",
        "not_in_channel",
        "ratelimited",
        "request_timeout",
        "restricted_action",
        "service_unavailable",
        "team_access_not_granted",
        "token_expired",
        "token_revoked",
        "too_many_attachments",
        "unknown_method",
        "user_not_found",
    }
)
#: Labels of failures that carry no Slack error code.
UNREACHABLE = "unreachable"
HTTP_5XX = "http_5xx"
OTHER = "other"


def error_label(code: str, status: int | None = None) -> str:
    """The error metric's label for Slack's answer ``code`` with HTTP ``status``: the code
    when Slack documents it (:data:`SLACK_ERROR_CODES`), ``http_5xx`` for any other answer
    with a 5xx status (an HTML error page, say), else ``other``."""
    if code in SLACK_ERROR_CODES:
        return code
    if status is not None and 500 <= status <= 599:
        return HTTP_5XX
    return OTHER


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a failed call may still have reached Slack: the request went out and the answer
    was lost (a timeout, a reset or a closed connection). A refused or unresolvable connection
    never sent it."""
    reason: BaseException | None = exc
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException):
        reason = exc.reason
    never_sent = (ConnectionRefusedError, socket.gaierror)
    if isinstance(reason, never_sent) or isinstance(exc.__cause__, never_sent):
        return False
    lost = (TimeoutError, ConnectionResetError, http.client.HTTPException, ConnectionAbortedError)
    return isinstance(reason, lost) or isinstance(exc.__cause__, lost)


#: The metadata event type marking the bot's own posts, and how far back ``find`` looks.
OUTBOX_EVENT = "gpubot_outbox"
FIND_LIMIT = 200


def make_client(settings: Settings) -> WebClient:
    """A Web API client for the bot token, at ``settings.slack_api_url``; a call gives up after
    ``settings.slack_timeout_s`` seconds."""
    return WebClient(
        token=settings.slack_bot_token,
        base_url=settings.slack_api_url,
        timeout=max(1, round(settings.slack_timeout_s)),
    )


class SlackNotifier:
    """Posts, updates and uploads through ``client``. A user ID (``U...``/``W...``) as the
    channel opens a DM first. Rate-limited calls are retried (``max_rate_limit_retries``); a
    call whose answer was lost is not (SlackError.outcome_unknown says so); every failure raises
    bot.errors.SlackError."""

    def __init__(
        self,
        client: WebClient,
        *,
        max_rate_limit_retries: int = 2,
        metrics: Metrics | None = None,
    ) -> None:
        self.client = client
        #: Where Slack's errors and rate limits are counted (the runtime's).
        self.metrics = metrics if metrics is not None else Metrics()
        # slack_sdk retries a call whose connection dropped: for a post that may have landed
        # that is a blind repeat. Such an outcome is reported as unknown instead.
        client.retry_handlers[:] = [
            h for h in client.retry_handlers if not isinstance(h, ConnectionErrorRetryHandler)
        ]
        if not any(isinstance(h, RateLimitErrorRetryHandler) for h in client.retry_handlers):
            client.retry_handlers.append(
                CountedRateLimitRetryHandler(self.metrics, max_retry_count=max_rate_limit_retries)
            )

    def post(
        self,
        channel: str,
        text: str,
        blocks: Sequence[dict[str, Any]] = (),
        *,
        thread_ts: str | None = None,
        key: str | None = None,
    ) -> MessageRef:
        """Post ``text`` (the fallback, always sent) with ``blocks``; returns where it landed.
        ``key`` goes into the message's metadata (event type ``gpubot_outbox``)."""
        target = self.conversation_for(channel)
        metadata = {"event_type": OUTBOX_EVENT, "event_payload": {"key": key}} if key else None
        response = self._call(
            "chat.postMessage",
            lambda: self.client.chat_postMessage(
                channel=target,
                text=text,
                blocks=list(blocks) or None,
                thread_ts=thread_ts,
                metadata=metadata,
            ),
        )
        return MessageRef(channel=str(response["channel"]), ts=str(response["ts"]))

    def find(self, channel: str, key: str, *, since: datetime) -> MessageRef | None:
        """The message marked ``key`` among the conversation's messages since ``since`` (the
        newest ``FIND_LIMIT``), from conversations.history with its metadata."""
        target = self.conversation_for(channel)
        oldest = f"{since.replace(tzinfo=UTC).timestamp() - 1:.6f}"
        response = self._call(
            "conversations.history",
            lambda: self.client.conversations_history(
                channel=target, oldest=oldest, limit=FIND_LIMIT, include_all_metadata=True
            ),
        )
        for message in response.get("messages") or ():
            metadata = message.get("metadata") or {}
            payload = metadata.get("event_payload") or {}
            if metadata.get("event_type") == OUTBOX_EVENT and payload.get("key") == key:
                return MessageRef(channel=target, ts=str(message["ts"]))
        return None

    def update(self, ref: MessageRef, text: str, blocks: Sequence[dict[str, Any]] = ()) -> None:
        """Replace a message the bot posted (``chat.update``; ephemeral ones cannot be)."""
        self._call(
            "chat.update",
            lambda: self.client.chat_update(
                channel=ref.channel, ts=ref.ts, text=text, blocks=list(blocks)
            ),
        )

    def upload_file(
        self,
        channel: str,
        filename: str,
        content: bytes,
        *,
        title: str,
        comment: str = "",
        thread_ts: str | None = None,
    ) -> None:
        """Share a file in a channel (or a user's DM) with files_upload_v2's three steps."""
        target = self.conversation_for(channel)
        self._call(
            "files.upload",
            lambda: self.client.files_upload_v2(
                channel=target,
                filename=filename,
                content=content,
                title=title,
                initial_comment=comment or None,
                thread_ts=thread_ts,
            ),
        )

    def conversation_for(self, channel: str) -> str:
        """A channel ID as given; a user ID becomes the ID of the bot's DM with that user."""
        if channel[:1] not in ("U", "W"):
            return channel
        response = self._call(
            "conversations.open", lambda: self.client.conversations_open(users=channel)
        )
        return str(response["channel"]["id"])

    def _call(self, method: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except SlackApiError as exc:
            code = str(exc.response.get("error", "unknown_error"))
            status = getattr(exc.response, "status_code", None)
            self.metrics.slack_error(
                method, error_label(code, status if isinstance(status, int) else None)
            )
            raise SlackError(
                f"Slack refused {method}: {code}", error=code, hint=_HINTS.get(code, "")
            ) from exc
        except (SlackClientError, urllib.error.URLError, OSError) as exc:
            self.metrics.slack_error(method, UNREACHABLE)
            raise SlackError(
                f"Could not reach Slack for {method}: {exc}",
                error="unreachable",
                hint="Check the network and GPUBOT_SLACK_API_URL.",
                outcome_unknown=outcome_unknown(exc),
            ) from exc


class CountedRateLimitRetryHandler(RateLimitErrorRetryHandler):
    """slack_sdk's retry after HTTP 429, counting every 429 answer (the last one, no longer
    retried, too) in ``metrics`` by API method."""

    def __init__(self, metrics: Metrics, *, max_retry_count: int = 1) -> None:
        super().__init__(max_retry_count=max_retry_count)
        self.metrics = metrics

    def can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if response is not None and response.status_code == 429:
            self.metrics.slack_rate_limited(request.url.rstrip("/").rsplit("/", 1)[-1] or "unknown")
        return super().can_retry(state=state, request=request, response=response, error=error)
