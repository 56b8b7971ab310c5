"""The Notifier (bot/notify.py) on Slack's Web API: DMs, channel posts, updates, file uploads."""

from __future__ import annotations

import logging
import urllib.error
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

from bot.errors import SlackError
from bot.notify import MessageRef

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


class SlackNotifier:
    """Posts, updates and uploads through ``client``. A user ID (``U...``/``W...``) as the
    channel opens a DM first. Rate-limited calls are retried (``max_rate_limit_retries``);
    every failure raises bot.errors.SlackError."""

    def __init__(self, client: WebClient, *, max_rate_limit_retries: int = 2) -> None:
        self.client = client
        if not any(isinstance(h, RateLimitErrorRetryHandler) for h in client.retry_handlers):
            client.retry_handlers.append(
                RateLimitErrorRetryHandler(max_retry_count=max_rate_limit_retries)
            )

    def post(
        self,
        channel: str,
        text: str,
        blocks: Sequence[dict[str, Any]] = (),
        *,
        thread_ts: str | None = None,
    ) -> MessageRef:
        """Post ``text`` (the fallback, always sent) with ``blocks``; returns where it landed."""
        target = self.conversation_for(channel)
        response = self._call(
            "chat.postMessage",
            lambda: self.client.chat_postMessage(
                channel=target, text=text, blocks=list(blocks) or None, thread_ts=thread_ts
            ),
        )
        return MessageRef(channel=str(response["channel"]), ts=str(response["ts"]))

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
            raise SlackError(
                f"Slack refused {method}: {code}", error=code, hint=_HINTS.get(code, "")
            ) from exc
        except (SlackClientError, urllib.error.URLError, OSError) as exc:
            raise SlackError(
                f"Could not reach Slack for {method}: {exc}",
                error="unreachable",
                hint="Check the network and GPUBOT_SLACK_API_URL.",
            ) from exc
