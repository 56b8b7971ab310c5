"""Forms through the real app: `/gpu register` alone opens the modal with the command's trigger,
a submission's mistakes go back onto its fields (nothing changes), an accepted one closes it and
answers where the command was typed (through the command's response URL; by direct message when
that URL is refused or a button opened the form), one too slow for Slack's 3 seconds answers
there too, and the Home tab's Register button opens the form."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.models.views import View
from sqlalchemy import select
from sqlmodel import SQLModel

from bot import listeners
from bot.blocks.forms import REGISTER_FORM
from bot.commands.forms import FormOutcome
from bot.commands.registry import Reply
from bot.executor import BotExecutor
from bot.i18n import active_language
from bot.listeners import Forms
from bot.local_slack import check_view
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.slack_requests import (
    app_home_opened_body,
    block_actions_body,
    signed_headers,
    slash_command_body,
    state_value,
    view_submission_body,
)
from bot.store.db import Database
from bot.store.models import Person
from tests.fixtures.slack import CHANNEL, SIGNING_SECRET, SlackBot, start_slack_bot

STAND_IN_FORM = "thing_form"


def _store_rows(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    with db.session() as session:
        return {
            table.name: sorted(map(tuple, session.execute(select(table)).all()), key=repr)
            for table in SQLModel.metadata.sorted_tables
            # whoever used the bot is remembered; bot.replay records each signed request
            if table.name not in {"person", "seen_signature"}
        }


def _idle(bot: SlackBot) -> None:
    assert isinstance(bot.rt.executor, BotExecutor)
    assert bot.rt.executor.wait_idle(10)


def _opened(bot: SlackBot, count: int = 1) -> dict[str, Any]:
    assert bot.slack.wait_for(lambda s: len(s.calls_to("views.open")) >= count)
    call = bot.slack.calls_to("views.open")[-1]
    assert call.ok, call.error
    stored = bot.slack.opened_view(str(call.args["trigger_id"]))
    assert stored is not None
    return stored.view


def _fill(view: Mapping[str, Any], typed: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The state Slack sends for a form into which ``typed`` was typed (by block id)."""
    values: dict[str, dict[str, Any]] = {}
    for block in view["blocks"]:
        if block["type"] != "input":
            continue
        element = block["element"]
        state = state_value(element, typed.get(block["block_id"], ""))
        assert state is not None, block["block_id"]
        values[block["block_id"]] = {element["action_id"]: state}
    return values


def _submit(
    bot: SlackBot, view: Mapping[str, Any], typed: Mapping[str, str]
) -> tuple[int, dict[str, Any]]:
    body = view_submission_body(
        view=view, values=_fill(view, typed), user_id="U0ALICE", user_name="alice"
    )
    status, answer = bot.send(body, signed_headers(body, SIGNING_SECRET))
    return status, (json.loads(answer) if answer.strip() else {})


def _answers(bot: SlackBot, count: int) -> list[str]:
    """What the bot answered through response URLs (where the command was typed)."""
    assert bot.slack.wait_for(lambda s: len(s.responses) >= count)
    return [str(r.payload.get("text")) for r in bot.slack.responses]


def _dm_texts(bot: SlackBot, count: int) -> list[str]:
    assert bot.slack.wait_for(lambda s: len(s.calls_to("chat.postMessage")) >= count)
    return [str(c.args.get("text")) for c in bot.slack.calls_to("chat.postMessage")]


# --- the bot's own forms ------------------------------------------------------------------------


def test_register_alone_opens_the_form_and_nothing_else(slack_bot: SlackBot) -> None:
    assert slack_bot.command("register") == 200
    view = _opened(slack_bot)
    assert view["callback_id"] == REGISTER_FORM
    assert check_view(view, "modal") == []
    View(**view).validate_json()
    _idle(slack_bot)
    assert slack_bot.slack.responses == []


def test_a_form_whose_trigger_expired_runs_the_command_as_typed(slack_bot: SlackBot) -> None:
    body = slash_command_body(
        text="register",
        user_id="U0ALICE",
        user_name="alice",
        channel_id=CHANNEL,
        response_url=slack_bot.slack.response_url(CHANNEL, "U0ALICE"),
        trigger_id=f"{int(time.time()) - 60}.1.old",
    )
    assert slack_bot.post(body, signed_headers(body, SIGNING_SECRET)) == 200
    # The form is opened after the command is answered.
    assert slack_bot.slack.wait_for(lambda s: len(s.calls_to("views.open")) >= 1)
    (call,) = slack_bot.slack.calls_to("views.open")
    assert call.error == "expired_trigger_id"
    assert "Usage:" in slack_bot.reply_text()


def test_a_slow_views_open_does_not_hold_the_commands_answer(slack_bot: SlackBot) -> None:
    """Slack wants the command answered within 3 s; the form opens after the answer, so a
    views.open that answers late costs the answer nothing, and the form still opens."""
    slack_bot.slack.answer_late("views.open", 2.0)
    started = time.monotonic()
    assert slack_bot.command("register") == 200
    assert time.monotonic() - started < 1.5
    view = _opened(slack_bot)
    assert view["callback_id"] == REGISTER_FORM
    _idle(slack_bot)
    assert slack_bot.slack.responses == []


def test_mistakes_go_back_onto_the_fields_and_change_nothing(slack_bot: SlackBot) -> None:
    assert slack_bot.command("register") == 200
    view = _opened(slack_bot)
    _idle(slack_bot)
    before = _store_rows(slack_bot.rt.db)
    status, answer = _submit(
        slack_bot,
        view,
        {"name": "box1", "address": "root@203.0.113.7", "gpu": "1", "price": "cheap"},
    )
    assert status == 200
    assert answer["response_action"] == "errors"
    assert set(answer["errors"]) == {"price"}
    _idle(slack_bot)
    assert _store_rows(slack_bot.rt.db) == before
    assert slack_bot.slack.calls_to("chat.postMessage") == []


def test_the_home_register_button_opens_the_register_form(slack_bot: SlackBot) -> None:
    body = app_home_opened_body(user_id="U0ALICE")
    headers = signed_headers(body, SIGNING_SECRET, content_type="application/json")
    assert slack_bot.post(body, headers) == 200
    assert slack_bot.slack.wait_for(lambda s: s.home_view("U0ALICE") is not None)
    home = slack_bot.slack.home_view("U0ALICE")
    assert home is not None
    click = block_actions_body(
        action_id="home_register",
        value="register",
        user_id="U0ALICE",
        user_name="alice",
        view=home,
        trigger_id=slack_bot.slack.new_trigger("U0ALICE"),
    )
    assert slack_bot.post(click, signed_headers(click, SIGNING_SECRET)) == 200
    assert _opened(slack_bot)["callback_id"] == REGISTER_FORM


# --- the plumbing, with a form of its own -------------------------------------------------------


class _StandIn:
    """A form with one required field ``what``; ``delay_s`` makes its answer slow."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.languages: list[str] = []
        self.crash = False
        self.runs = 0

    def forms(self) -> Forms:
        return Forms(
            callback_ids=frozenset({STAND_IN_FORM}),
            form_for_command=lambda text: STAND_IN_FORM if text.strip() == "thing" else None,
            form_view=self.view,
            submit_form=self.submit,
        )

    def view(self, rt: Runtime, caller: Caller, callback_id: str) -> dict[str, Any]:
        self.languages.append(active_language())
        return {
            "type": "modal",
            "callback_id": callback_id,
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

    def submit(
        self,
        rt: Runtime,
        caller: Caller,
        callback_id: str,
        values: Mapping[str, Mapping[str, Any]],
    ) -> FormOutcome:
        self.runs += 1
        threading.Event().wait(self.delay_s)
        if self.crash:
            raise RuntimeError("the form fell over")
        what = values["what"]["value"]["value"]
        if not what:
            return FormOutcome(errors={"what": "Say what."})
        return FormOutcome(reply=Reply(text=f"Made {what} for {caller.user_id}"))


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> _StandIn:
    form = _StandIn()
    monkeypatch.setattr(listeners, "default_forms", form.forms)
    return form


@pytest.fixture
def bot(sqlite_db: Database, tmp_path: Path, stand_in: _StandIn) -> Iterator[SlackBot]:
    with start_slack_bot(sqlite_db, tmp_path) as running:
        yield running


def test_an_accepted_form_closes_and_answers_where_the_command_was_typed(
    bot: SlackBot, stand_in: _StandIn
) -> None:
    assert bot.command("thing") == 200
    view = _opened(bot)
    status, answer = _submit(bot, view, {"what": ""})
    assert (status, answer) == (200, {"response_action": "errors", "errors": {"what": "Say what."}})
    status, answer = _submit(bot, view, {"what": "tea"})
    assert (status, answer) == (200, {})
    assert _answers(bot, 1) == ["Made tea for U0ALICE"]
    [message] = [m for m in bot.slack.events if getattr(m, "via_response_url", False)]
    assert (message.channel, message.user) == (CHANNEL, "U0ALICE")
    assert bot.slack.calls_to("chat.postMessage") == []


def test_a_form_whose_response_url_expired_answers_by_direct_message(
    bot: SlackBot, stand_in: _StandIn
) -> None:
    """Slack takes a response URL for 30 minutes: a form left open longer answers by DM."""
    assert bot.command("thing") == 200
    view = _opened(bot)
    bot.slack.expire_response_url(json.loads(view["private_metadata"])["reply_url"])
    assert _submit(bot, view, {"what": "tea"}) == (200, {})
    assert _dm_texts(bot, 1) == ["Made tea for U0ALICE"]
    _idle(bot)
    assert bot.slack.responses == []
    assert len(bot.slack.calls_to("chat.postMessage")) == 1


def test_a_form_with_unreadable_private_metadata_answers_by_direct_message(
    bot: SlackBot, stand_in: _StandIn
) -> None:
    assert bot.command("thing") == 200
    view = {**_opened(bot), "private_metadata": "not json"}
    assert _submit(bot, view, {"what": "tea"}) == (200, {})
    assert _dm_texts(bot, 1) == ["Made tea for U0ALICE"]


def test_the_form_opens_in_the_callers_language(bot: SlackBot, stand_in: _StandIn) -> None:
    with bot.rt.db.session() as session:
        session.add(Person(slack_id="U0ALICE", display_name="alice", language="zh"))
    assert bot.command("thing") == 200
    _opened(bot)
    assert stand_in.languages == ["zh"]


def test_a_slow_form_closes_and_its_mistakes_come_where_the_command_was_typed(
    bot: SlackBot, stand_in: _StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listeners, "FORM_ANSWER_WAIT_S", 0.1)
    stand_in.delay_s = 1.0
    assert bot.command("thing") == 200
    view = _opened(bot)
    assert _submit(bot, view, {"what": ""}) == (200, {})
    (text,) = _answers(bot, 1)
    assert text == ":warning: The form was not sent:\nSay what."


def test_a_form_that_crashes_answers_with_an_error_id(bot: SlackBot, stand_in: _StandIn) -> None:
    stand_in.crash = True
    assert bot.command("thing") == 200
    assert _submit(bot, _opened(bot), {"what": "tea"}) == (200, {})
    (text,) = _answers(bot, 1)
    assert "Something went wrong (error id " in text
    assert "fell over" not in text


def test_a_form_sent_twice_runs_once(
    bot: SlackBot, stand_in: _StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slack sends a submission again when it missed the answer (and the person may press the
    button again): while the first runs, and after it was accepted, the form closes unrun."""
    monkeypatch.setattr(listeners, "FORM_ANSWER_WAIT_S", 0.1)
    stand_in.delay_s = 1.0
    assert bot.command("thing") == 200
    view = _opened(bot)
    assert _submit(bot, view, {"what": "tea"}) == (200, {})  # too slow: closed, still running
    assert _submit(bot, view, {"what": "tea"}) == (200, {})
    _idle(bot)
    assert _submit(bot, view, {"what": "tea"}) == (200, {})  # accepted before
    _idle(bot)
    assert stand_in.runs == 1
    assert _answers(bot, 1) == ["Made tea for U0ALICE"]
    assert len(bot.slack.responses) == 1
