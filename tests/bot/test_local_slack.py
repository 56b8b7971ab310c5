"""The Slack stand-in answers like Slack: errors, limits, response URLs, files, signing."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier

from bot.local_slack import (
    LocalSlack,
    Message,
    block_actions_body,
    check_blocks,
    signed_headers,
    slash_command_body,
)
from tests.fixtures.slack import BOT_TOKEN


def _button(text: str = "Go", value: str = "1") -> dict[str, Any]:
    return {
        "type": "button",
        "action_id": "go",
        "text": {"type": "plain_text", "text": text},
        "value": value,
    }


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def test_check_blocks_accepts_blocks_within_the_limits() -> None:
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": "h" * 150}},
        _section("s" * 3000),
        {"type": "actions", "elements": [_button("b" * 75, "v" * 2000)]},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "c"}]},
        {"type": "divider"},
    ]
    assert check_blocks(blocks) == []
    assert check_blocks([_section("x")] * 50) == []


@pytest.mark.parametrize(
    ("blocks", "problem"),
    [
        ([_section("x")] * 51, "51 blocks"),
        ([{"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}], "150"),
        ([_section("s" * 3001)], "3000"),
        ([{"type": "actions", "elements": [_button("b" * 76)]}], "75"),
        ([{"type": "actions", "elements": [_button(value="v" * 2001)]}], "2000"),
        ([{"type": "nonsense"}], "unknown type"),
        (["not a block"], "not an object"),
        (
            [{"type": "section", "fields": [{"type": "mrkdwn", "text": "f"}] * 11}],
            "10",
        ),
    ],
)
def test_check_blocks_finds_what_slack_refuses(blocks: list[Any], problem: str) -> None:
    problems = check_blocks(blocks)
    assert problems
    assert any(problem in p for p in problems), problems


@pytest.mark.filterwarnings("ignore:The top-level `text` argument is missing")
def test_web_api_errors_are_slacks(local_slack: LocalSlack) -> None:
    client = WebClient(token=BOT_TOKEN, base_url=local_slack.api_url)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: client.chat_postMessage(channel="C0GENERAL"), "no_text"),
        (lambda: client.chat_postMessage(channel="C0NOPE", text="x"), "channel_not_found"),
        (lambda: client.api_call("chat.teleport"), "unknown_method"),
        (lambda: client.users_info(user="U0NOBODY"), "user_not_found"),
        (
            lambda: client.files_completeUploadExternal(files=[{"id": "F404"}]),
            "file_not_found",
        ),
        (lambda: WebClient(base_url=local_slack.api_url).auth_test(), "not_authed"),
    ]
    for call, code in cases:
        with pytest.raises(SlackApiError) as err:
            call()
        assert err.value.response["error"] == code
    assert [c.error for c in local_slack.calls] == [code for _, code in cases]


def test_users_info_and_auth_test(local_slack: LocalSlack) -> None:
    client = WebClient(token=BOT_TOKEN, base_url=local_slack.api_url)
    assert client.users_info(user="U0ALICE")["user"]["name"] == "alice"
    assert client.auth_test()["user_id"] == local_slack.bot_user_id


def _post_json(url: str, payload: object) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_response_urls_record_replies_and_replace_messages(local_slack: LocalSlack) -> None:
    client = WebClient(token=BOT_TOKEN, base_url=local_slack.api_url)
    posted = client.chat_postMessage(channel="C0GENERAL", text="Release box?")
    url = local_slack.response_url("C0GENERAL", "U0ALICE", message_ts=posted["ts"])
    assert _post_json(url, {"text": "Released", "replace_original": True}) == (200, "ok")
    assert local_slack.message("C0GENERAL", posted["ts"]) == Message(
        channel="C0GENERAL",
        ts=posted["ts"],
        text="Released",
        ephemeral=False,
        user="U0ALICE",
        replaces=posted["ts"],
        via_response_url=True,
    )
    assert _post_json(url, {}) == (400, "no_text")
    assert _post_json(url, {"text": "x", "blocks": [{"type": "nonsense"}]}) == (
        400,
        "invalid_blocks",
    )
    assert _post_json(local_slack.base_url + "respond/R404", {"text": "x"})[0] == 404
    assert [r.payload["text"] for r in local_slack.responses] == ["Released"]


def test_signed_bodies_verify_with_slacks_verifier() -> None:
    body = slash_command_body(
        text="run box -- echo a > b & c",
        user_id="U1",
        user_name="a",
        channel_id="C1",
        response_url="http://127.0.0.1/respond/R1",
    )
    assert urllib.parse.parse_qs(body)["text"] == ["run box -- echo a &gt; b &amp; c"]
    headers = signed_headers(body, "s3cret", timestamp=1_700_000_000)
    verifier = SignatureVerifier("s3cret")
    assert (
        verifier.is_valid(
            body,
            headers["x-slack-request-timestamp"],
            headers["x-slack-signature"],
        )
        is False
    )  # too old for the verifier's 5-minute window
    fresh = signed_headers(body, "s3cret")
    assert verifier.is_valid_request(body, fresh)
    assert not SignatureVerifier("other").is_valid_request(body, fresh)
    click = block_actions_body(
        action_id="go", value="7", user_id="U1", user_name="a", channel_id="C1", response_url="u"
    )
    payload = json.loads(urllib.parse.parse_qs(click)["payload"][0])
    assert payload["actions"][0]["action_id"] == "go"
    assert payload["actions"][0]["value"] == "7"
