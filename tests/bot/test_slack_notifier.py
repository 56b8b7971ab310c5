"""SlackNotifier against the local Slack stand-in: DMs, posts, updates, uploads, errors; against
a stand-in that answers with HTML pages (as a proxy in front of Slack does), the error metric's
label stays within a fixed set."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from slack_sdk import WebClient

from bot.errors import SlackError
from bot.local_slack import LocalSlack, Message, SharedFile
from bot.metrics import Metrics
from bot.notify import MessageRef
from bot.slack_notifier import HTTP_5XX, OTHER, SLACK_ERROR_CODES, SlackNotifier, error_label
from tests.fixtures.slack import BOT_TOKEN

#: Every value the Slack error metric's ``error`` label may take.
BOUNDED_LABELS = SLACK_ERROR_CODES | {"unreachable", HTTP_5XX, OTHER}


@contextmanager
def html_slack(statuses: Sequence[int]) -> Iterator[str]:
    """A stand-in of Slack's Web API that answers each call, in turn, with the next of
    ``statuses`` and an HTML page unlike any other (a request number in it); yields its API
    URL."""
    serial = itertools.count(1)
    turns = itertools.cycle(statuses)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            n = next(serial)
            body = (
                f"<html><head><title>{n} Bad Gateway</title></head><body><h1>Error {n}</h1>"
                f"<p>upstream {self.path} failed (request {n:08d})</p></body></html>"
            ).encode()
            self.send_response(next(turns))
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api/"
    finally:
        server.shutdown()
        server.server_close()


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


def test_documented_codes_keep_their_name_and_anything_else_is_bounded() -> None:
    assert error_label("channel_not_found", 200) == "channel_not_found"
    assert error_label("ratelimited", 429) == "ratelimited"
    assert error_label("Received a response in a non-JSON format: <html>...", 502) == HTTP_5XX
    assert error_label("Received a response in a non-JSON format: <html>...", 200) == OTHER
    assert error_label("some_new_code_slack_adds_one_day") == OTHER
    assert error_label("x" * 10_000, 403) == OTHER


def _error_labels(metrics: Metrics, method: str) -> dict[str, float]:
    """The Slack error counter's samples for ``method``, by error label."""
    found: dict[str, float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            errors = sample.name == "gpubot_slack_api_errors_total"
            if errors and sample.labels["method"] == method:
                found[sample.labels["error"]] = sample.value
    return found


def test_html_answers_keep_the_error_label_bounded() -> None:
    method = "chat.postMessage"
    metrics = Metrics()
    before = _error_labels(metrics, method)
    statuses = (502, 503, 200, 500, 403)
    with html_slack(statuses) as url:
        notifier = SlackNotifier(
            WebClient(token=BOT_TOKEN, base_url=url, timeout=5), metrics=metrics
        )
        for _ in range(4 * len(statuses)):
            with pytest.raises(SlackError) as err:
                notifier.post("C0GENERAL", "hello")
            assert "non-JSON" in err.value.error  # what Slack said is still in the error
    after = _error_labels(metrics, method)
    assert set(after) <= BOUNDED_LABELS, sorted(after)
    assert after[HTTP_5XX] - before.get(HTTP_5XX, 0.0) == 12  # 502, 503 and 500, four times
    assert after[OTHER] - before.get(OTHER, 0.0) == 8  # 200 and 403 with a page, four times
    assert not any("<" in label or " " in label for label in after)
