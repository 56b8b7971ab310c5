"""The Slack stand-in answers like Slack: errors, limits, response URLs, files, signing."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier

from bot.local_slack import TRIGGER_TTL_S, LocalSlack, Message, check_blocks, check_view
from bot.slack_requests import (
    app_home_opened_body,
    block_actions_body,
    signed_headers,
    slash_command_body,
    state_value,
    view_submission_body,
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


def test_a_response_url_takes_five_posts_within_thirty_minutes(local_slack: LocalSlack) -> None:
    url = local_slack.response_url("C0GENERAL", "U0ALICE")
    for n in range(5):
        assert _post_json(url, {"text": f"reply {n}"}) == (200, "ok")
    assert _post_json(url, {"text": "a sixth"}) == (404, "used_url")
    fresh = local_slack.response_url("C0GENERAL", "U0ALICE")
    local_slack.expire_response_url(fresh)
    assert _post_json(fresh, {"text": "late"}) == (404, "expired_url")
    assert len(local_slack.responses) == 5


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


# --- views --------------------------------------------------------------------------------------


def _modal(**changes: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "type": "modal",
        "callback_id": "thing_form",
        "title": {"type": "plain_text", "text": "A thing"},
        "submit": {"type": "plain_text", "text": "Make it"},
        "blocks": [
            {
                "type": "input",
                "block_id": "what",
                "label": {"type": "plain_text", "text": "What"},
                "element": {"type": "plain_text_input", "action_id": "value"},
            }
        ],
    }
    view.update(changes)
    return view


def _home(blocks: int = 1) -> dict[str, Any]:
    return {"type": "home", "blocks": [_section("x")] * blocks}


@pytest.mark.parametrize(
    ("view", "kind", "problem"),
    [
        (_home(101), "home", "between 1 and 100 blocks"),
        ({**_home(), "submit": {"type": "plain_text", "text": "Go"}}, "home", "submit"),
        (_modal(title={"type": "plain_text", "text": "t" * 25}), "modal", "title"),
        (_modal(title=None), "modal", "needs a title"),
        (_modal(submit=None), "modal", "submit button"),
        (_modal(blocks=[]), "modal", "blocks"),
        (_home(), "modal", "not 'modal'"),
        (_modal(blocks=[_section("s" * 3001)]), "modal", "3000"),
    ],
)
def test_check_view_finds_what_slack_refuses(view: Any, kind: str, problem: str) -> None:
    problems = check_view(view, kind)
    assert any(problem in p for p in problems), problems


def test_views_are_kept_and_refused_like_slacks(local_slack: LocalSlack) -> None:
    client = WebClient(token=BOT_TOKEN, base_url=local_slack.api_url)
    published = client.views_publish(user_id="U0ALICE", view=_home(100))
    assert local_slack.home_view("U0ALICE") == published["view"]
    again = client.views_publish(user_id="U0ALICE", view=_home(2))
    assert again["view"]["id"] == published["view"]["id"]
    trigger = local_slack.new_trigger("U0ALICE")
    opened = client.views_open(trigger_id=trigger, view=_modal())["view"]
    stored = local_slack.opened_view(trigger)
    assert stored is not None
    assert (stored.view_id, stored.user) == (opened["id"], "U0ALICE")
    updated = client.views_update(
        view_id=opened["id"],
        hash=opened["hash"],
        view=_modal(title={"type": "plain_text", "text": "Another"}),
    )
    assert updated["view"]["title"] == {"type": "plain_text", "text": "Another"}
    old = f"{int(time.time() - TRIGGER_TTL_S - 5)}.1.x"
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: client.views_publish(user_id="U0ALICE", view=_home(101)), "invalid_arguments"),
        (lambda: client.views_open(trigger_id=trigger, view=_modal()), "exchanged_trigger_id"),
        (lambda: client.views_open(trigger_id=old, view=_modal()), "expired_trigger_id"),
        (lambda: client.views_open(trigger_id="nonsense", view=_modal()), "invalid_trigger_id"),
        (
            lambda: client.views_open(trigger_id=local_slack.new_trigger(), view=_home()),
            "invalid_arguments",
        ),
        (
            lambda: client.views_update(view_id=opened["id"], hash="stale", view=_modal()),
            "hash_conflict",
        ),
        (lambda: client.views_update(view_id="V404", view=_modal()), "not_found"),
    ]
    for call, code in cases:
        with pytest.raises(SlackApiError) as err:
            call()
        assert err.value.response["error"] == code
    refused = local_slack.calls_to("views.publish")[-1]
    assert refused.error == "invalid_arguments"


def test_the_bodies_of_events_and_submissions() -> None:
    event = json.loads(app_home_opened_body(user_id="U1"))
    assert event["type"] == "event_callback"
    assert event["event"] == event["event"] | {
        "type": "app_home_opened",
        "user": "U1",
        "tab": "home",
    }
    view = {**_modal(), "id": "V1"}
    values = {"what": {"value": state_value(view["blocks"][0]["element"], "tea")}}
    body = view_submission_body(view=view, values=values, user_id="U1", user_name="a")
    payload = json.loads(urllib.parse.parse_qs(body)["payload"][0])
    assert payload["type"] == "view_submission"
    assert payload["view"]["state"]["values"]["what"]["value"]["value"] == "tea"
    home_click = block_actions_body(
        action_id="go", value="7", user_id="U1", user_name="a", view=view
    )
    clicked = json.loads(urllib.parse.parse_qs(home_click)["payload"][0])
    assert clicked["container"] == {"type": "view", "view_id": "V1"}
    assert "response_url" not in clicked
    assert "channel" not in clicked


def test_typed_field_values_become_slacks_state() -> None:
    options = [
        {"text": {"type": "plain_text", "text": "NVIDIA A100"}, "value": "a100"},
        {"text": {"type": "plain_text", "text": "NVIDIA H100"}, "value": "h100"},
    ]
    select = {"type": "static_select", "action_id": "value", "options": options}
    assert state_value(select, "2") == {"type": "static_select", "selected_option": options[1]}
    assert state_value(select, "a100")["selected_option"] == options[0]  # type: ignore[index]
    assert state_value(select, "nvidia h100")["selected_option"] == options[1]  # type: ignore[index]
    assert state_value(select, "tpu") is None
    assert state_value(select, "") == {"type": "static_select", "selected_option": None}
    text = {"type": "plain_text_input", "action_id": "value", "initial_value": "3h"}
    assert state_value(text, "") == {"type": "plain_text_input", "value": "3h"}
    assert state_value(text, " 5h ") == {"type": "plain_text_input", "value": "5h"}
    boxes = {"type": "checkboxes", "action_id": "value", "options": options}
    assert state_value(boxes, "1, h100") == {"type": "checkboxes", "selected_options": options}
