"""SlackNotifier against the local Slack stand-in: DMs, posts, updates, uploads, errors."""

from __future__ import annotations

import pytest
from slack_sdk import WebClient

from bot.errors import SlackError
from bot.local_slack import LocalSlack, Message, SharedFile
from bot.notify import MessageRef
from bot.slack_notifier import SlackNotifier
from tests.fixtures.slack import BOT_TOKEN

BLOCKS = [{"type": "section", "text": {"type": "mrkdwn", "text": "*hello*"}}]


def _notifier(slack: LocalSlack, token: str = BOT_TOKEN) -> SlackNotifier:
    return SlackNotifier(WebClient(token=token, base_url=slack.api_url))


def test_post_to_a_channel_sends_text_and_blocks(local_slack: LocalSlack) -> None:
    ref = _notifier(local_slack).post("C0GENERAL", "hello", BLOCKS)
    assert ref.channel == "C0GENERAL"
    (call,) = local_slack.calls_to("chat.postMessage")
    assert call.args["text"] == "hello"
    assert call.args["blocks"] == BLOCKS
    assert local_slack.message("C0GENERAL", ref.ts) == Message(
        channel="C0GENERAL", ts=ref.ts, text="hello", blocks=tuple(BLOCKS)
    )


def test_post_to_a_user_opens_a_dm_first(local_slack: LocalSlack) -> None:
    ref = _notifier(local_slack).post("U0ALICE", "deadline in 30 min", thread_ts=None)
    assert [c.method for c in local_slack.calls] == ["conversations.open", "chat.postMessage"]
    assert local_slack.calls[0].args["users"] == "U0ALICE"
    assert ref.channel.startswith("D")
    assert local_slack.calls[1].args["channel"] == ref.channel
    message = local_slack.message(ref.channel, ref.ts)
    assert message is not None
    assert message.user == "U0ALICE"


def test_thread_reply_carries_thread_ts(local_slack: LocalSlack) -> None:
    notifier = _notifier(local_slack)
    parent = notifier.post("C0GENERAL", "job queued")
    notifier.post("C0GENERAL", "job done", thread_ts=parent.ts)
    assert local_slack.calls_to("chat.postMessage")[1].args["thread_ts"] == parent.ts


def test_update_replaces_the_message(local_slack: LocalSlack) -> None:
    notifier = _notifier(local_slack)
    ref = notifier.post("C0GENERAL", "Release box in 30 min?", BLOCKS)
    notifier.update(ref, "Extended 1h by @alice")
    message = local_slack.message(ref.channel, ref.ts)
    assert message is not None
    assert (message.text, message.blocks, message.replaces) == ("Extended 1h by @alice", (), ref.ts)


def test_upload_file_takes_the_three_steps(local_slack: LocalSlack) -> None:
    content = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    _notifier(local_slack).upload_file(
        "C0GENERAL", "spend.png", content, title="Spend 2026-11", comment="November"
    )
    methods = [c.method for c in local_slack.calls]
    assert methods == ["files.getUploadURLExternal", "files.completeUploadExternal"]
    assert local_slack.calls[0].args["length"] == str(len(content))
    (shared,) = [e for e in local_slack.events if isinstance(e, SharedFile)]
    assert (shared.filename, shared.title, shared.channel) == (
        "spend.png",
        "Spend 2026-11",
        "C0GENERAL",
    )
    assert shared.content == content
    assert shared.comment == "November"


def test_upload_to_a_user_goes_to_their_dm(local_slack: LocalSlack) -> None:
    _notifier(local_slack).upload_file("U0BOB", "a.csv", b"a,b\n1,2\n", title="CSV")
    (shared,) = [e for e in local_slack.events if isinstance(e, SharedFile)]
    assert shared.channel is not None
    assert shared.channel.startswith("D")


def test_unknown_channel_is_a_slack_error_with_a_hint(local_slack: LocalSlack) -> None:
    with pytest.raises(SlackError) as err:
        _notifier(local_slack).post("C0NOWHERE", "hello")
    assert err.value.error == "channel_not_found"
    assert "GPUBOT_CHANNEL" in err.value.hint
    assert isinstance(err.value.__cause__, Exception)


def test_wrong_token_is_invalid_auth(local_slack: LocalSlack) -> None:
    with pytest.raises(SlackError) as err:
        _notifier(local_slack, token="xoxb-wrong").post("C0GENERAL", "hello")
    assert err.value.error == "invalid_auth"
    assert "SLACK_BOT_TOKEN" in err.value.hint


def test_update_of_an_unknown_message_fails(local_slack: LocalSlack) -> None:
    with pytest.raises(SlackError) as err:
        _notifier(local_slack).update(MessageRef("C0GENERAL", "1.000001"), "x")
    assert err.value.error == "message_not_found"


def test_invalid_blocks_are_refused(local_slack: LocalSlack) -> None:
    too_long = [{"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}]
    with pytest.raises(SlackError) as err:
        _notifier(local_slack).post("C0GENERAL", "x", too_long)
    assert err.value.error == "invalid_blocks"
    assert local_slack.events == []


def test_rate_limited_call_is_retried(local_slack: LocalSlack) -> None:
    local_slack.rate_limit("chat.postMessage", times=1)
    ref = _notifier(local_slack).post("C0GENERAL", "hello")
    calls = local_slack.calls_to("chat.postMessage")
    assert [c.error for c in calls] == ["ratelimited", None]
    assert local_slack.message(ref.channel, ref.ts) is not None


def test_rate_limited_beyond_the_retries_is_a_slack_error(local_slack: LocalSlack) -> None:
    local_slack.rate_limit("chat.postMessage", times=5)
    notifier = SlackNotifier(
        WebClient(token=BOT_TOKEN, base_url=local_slack.api_url), max_rate_limit_retries=0
    )
    with pytest.raises(SlackError) as err:
        notifier.post("C0GENERAL", "hello")
    assert err.value.error == "ratelimited"


def test_unreachable_slack_is_a_slack_error() -> None:
    slack = LocalSlack(token=BOT_TOKEN).start()
    url = slack.api_url
    slack.stop()
    notifier = SlackNotifier(WebClient(token=BOT_TOKEN, base_url=url, timeout=2))
    with pytest.raises(SlackError) as err:
        notifier.post("C0GENERAL", "hello")
    assert err.value.error == "unreachable"
