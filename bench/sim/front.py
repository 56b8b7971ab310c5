"""Slack's side of people's requests in the team-month simulation: the real Bolt app of a bot
process (bot.app.build_app on the process's runtime), given slash commands and button clicks
as Slack sends them, each signed with the app's signing secret (bot.slack_requests), and
dispatched to the app in this thread; a double click is two signed requests. What the app
answers on a response URL goes to Slack's stand-in (bot.local_slack.LocalSlack, on a free
loopback port); what the bot says on its own goes through the process's notifier, as every
other post of the simulation. After each request the process's executor is waited for, so
that the command has run before the simulated clock moves on (the run stays deterministic).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from slack_bolt import App
from slack_bolt.request import BoltRequest

from bot.app import build_app
from bot.executor import BotExecutor
from bot.local_slack import LocalSlack
from bot.runtime import Runtime
from bot.slack_requests import block_actions_body, signed_headers, slash_command_body

#: The app's signing secret and bot token in the simulation (made up; nothing leaves it).
SIGNING_SECRET = "team-month-signing-secret"
BOT_TOKEN = "xoxb-team-month"
#: How long one request may keep the process's executor busy, in (real) seconds.
REQUEST_TIMEOUT_S = 60.0


class SlackFront:
    """The Bolt app of one bot process, and the signed requests people send it."""

    def __init__(self, rt: Runtime, slack: LocalSlack, sent: Counter[str]) -> None:
        settings = rt.settings.with_(
            slack_bot_token=BOT_TOKEN,
            slack_signing_secret=SIGNING_SECRET,
            slack_api_url=slack.api_url,
        )
        self.rt = rt
        self.slack = slack
        self.app: App = build_app(settings, runtime=rt)
        #: Requests sent, by kind (``command``, ``click``) and the app's HTTP status (shared
        #: by the processes of a run).
        self.sent = sent

    def command(self, user: str, text: str, channel: str) -> int:
        """`/gpu TEXT` from ``user`` in ``channel``, signed; the app's HTTP status."""
        body = slash_command_body(
            text=text,
            user_id=user,
            user_name=user.lower(),
            channel_id=channel,
            response_url=self.slack.response_url(channel, user),
        )
        return self._send("command", body)

    def click(self, user: str, action_id: str, value: str, channel: str) -> int:
        """A click of the button ``action_id`` (its value ``value``) by ``user``, signed."""
        body = block_actions_body(
            action_id=action_id,
            value=value,
            user_id=user,
            user_name=user.lower(),
            channel_id=channel,
            response_url=self.slack.response_url(channel, user),
        )
        return self._send("click", body)

    def _send(self, kind: str, body: str) -> int:
        headers: dict[str, str | Sequence[str]] = dict(signed_headers(body, SIGNING_SECRET))
        request = BoltRequest(body=body, headers=headers)
        status = self.app.dispatch(request).status
        self.sent[f"{kind}_{status}"] += 1
        executor = self.rt.executor
        if isinstance(executor, BotExecutor):
            executor.wait_idle(REQUEST_TIMEOUT_S)
        return status
