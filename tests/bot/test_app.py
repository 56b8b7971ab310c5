"""End to end: correctly signed HTTP requests into the real Bolt app served on loopback, its
client pointed at the local Slack stand-in; assertions on what reached Slack."""

from __future__ import annotations

import argparse
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlmodel import SQLModel

from bot.app import BotExecutor, build_app
from bot.commands import build_registry
from bot.commands.forms import form_for_command
from bot.commands.registry import (
    MAX_BUTTON_ID,
    ActionSpec,
    CommandSpec,
    Registry,
    Reply,
    button_id,
    button_number,
)
from bot.errors import ConfigError, NotFound, UsageError
from bot.listeners import BAD_BUTTON_TEXT
from bot.local_slack import check_blocks
from bot.services.access import Caller
from bot.settings import Settings
from bot.slack_requests import slash_command_body
from bot.store.db import Database
from tests.bot.services.support import add_instance
from tests.fixtures.slack import SIGNING_SECRET, SlackBot, payload_json, start_slack_bot

pytestmark = pytest.mark.integration


def _no_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs="*")


def _spec(name: str, handler: Callable[..., Reply], **extra: Any) -> CommandSpec:
    return CommandSpec(name, f"{name} things", f"/gpu {name}", (), _no_args, handler, **extra)


def _store_rows(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    with db.session() as session:
        return {
            table.name: sorted(map(tuple, session.execute(select(table)).all()), key=repr)
            for table in SQLModel.metadata.sorted_tables
            if table.name != "seen_signature"  # bot.replay's record of each signed request
        }


def _changed_but_who_used_the_bot(
    db: Database, before: dict[str, list[tuple[Any, ...]]]
) -> dict[str, list[tuple[Any, ...]]]:
    """The tables that differ from ``before``, leaving out the person row of whoever sent the
    command (the bot remembers who used it, so that `@name` finds them)."""
    after = _store_rows(db)
    known = {row[0] for row in before.get("person", [])}
    after["person"] = [row for row in after["person"] if row[0] in known or row[0] != "U0ALICE"]
    return {name: rows for name, rows in after.items() if rows != before.get(name)}


# --- the real registry -----------------------------------------------------------------------


def test_help_answers_ephemerally_with_every_command(slack_bot: SlackBot) -> None:
    assert slack_bot.command("help") == 200
    (reply,) = slack_bot.replies(1)
    assert reply.payload["response_type"] == "ephemeral"
    assert not check_blocks(reply.payload["blocks"])
    shown = payload_json(reply)
    for spec in build_registry().primary_commands():
        assert f"/gpu {spec.name}" in shown


def test_help_for_one_command_shows_usage_and_examples(slack_bot: SlackBot) -> None:
    assert slack_bot.command("help help") == 200
    text = slack_bot.reply_text()
    assert "Usage: /gpu help [COMMAND]" in text
    assert "/gpu help register" in text


def test_unknown_command_gets_a_suggestion(slack_bot: SlackBot) -> None:
    assert slack_bot.command("hlep") == 200
    (reply,) = slack_bot.replies(1)
    assert reply.payload["response_type"] == "ephemeral"
    assert "Unknown command `hlep`. Did you mean `help`?" in reply.payload["text"]


def test_unbalanced_quote_gets_a_usage_message(slack_bot: SlackBot) -> None:
    assert slack_bot.command('help "status') == 200
    assert "no closing quotation" in slack_bot.reply_text()


def test_bad_signature_is_refused_and_nothing_runs(slack_bot: SlackBot) -> None:
    assert slack_bot.command("help", secret="not-the-secret") == 401
    assert isinstance(slack_bot.rt.executor, BotExecutor)
    assert slack_bot.rt.executor.wait_idle(5)
    assert slack_bot.slack.responses == []


def test_timestamp_older_than_five_minutes_is_refused(slack_bot: SlackBot) -> None:
    assert slack_bot.command("help", timestamp=int(time.time()) - 301) == 401
    assert slack_bot.command("help", timestamp=int(time.time()) - 290) == 200
    assert len(slack_bot.replies(1)) == 1


def test_unsigned_request_is_refused(slack_bot: SlackBot) -> None:
    body = slash_command_body(
        text="help",
        user_id="U0ALICE",
        user_name="alice",
        channel_id="C0GENERAL",
        response_url=slack_bot.slack.response_url("C0GENERAL", "U0ALICE"),
    )
    assert slack_bot.post(body, {"content-type": "application/x-www-form-urlencoded"}) == 401


def test_body_changed_after_signing_is_refused(slack_bot: SlackBot) -> None:
    body = slash_command_body(
        text="help",
        user_id="U0ALICE",
        user_name="alice",
        channel_id="C0GENERAL",
        response_url=slack_bot.slack.response_url("C0GENERAL", "U0ALICE"),
    )
    from bot.slack_requests import signed_headers

    headers = signed_headers(body, SIGNING_SECRET)
    assert slack_bot.post(body.replace("alice", "mallory"), headers) == 401


def test_build_app_needs_a_bot_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SLACK_BOT_TOKEN"):
        build_app(Settings(data_dir=tmp_path))


# --- the plumbing, with a registry of its own ---------------------------------------------------


def test_ack_comes_before_slow_work_whatever_the_load(sqlite_db: Database, tmp_path: Path) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def slow(rt: object, caller: Caller, args: argparse.Namespace) -> Reply:
        started.release()
        assert release.wait(20)
        return Reply(text=f"done {args.rest[0]}")

    registry = Registry()
    registry.command(_spec("slow", slow))
    with start_slack_bot(
        sqlite_db, tmp_path, registry=registry, executor_workers=40, commands_per_user=30
    ) as bot:
        with ThreadPoolExecutor(30) as pool:
            statuses = list(pool.map(lambda i: bot.command(f"slow {i}"), range(30)))
        assert statuses == [200] * 30
        assert bot.slack.responses == []  # every ack returned while every handler still waits
        for _ in range(30):
            assert started.acquire(timeout=10)
        release.set()
        replies = bot.replies(30)
    assert sorted(r.payload["text"] for r in replies) == sorted(f"done {i}" for i in range(30))


def test_expected_error_reaches_the_user_with_its_hint(sqlite_db: Database, tmp_path: Path) -> None:
    def missing(rt: object, caller: Caller, args: argparse.Namespace) -> Reply:
        raise NotFound("No instance named `box`.", hint="See `/gpu list` for the names.")

    registry = Registry()
    registry.command(_spec("missing", missing))
    with start_slack_bot(sqlite_db, tmp_path, registry=registry) as bot:
        assert bot.command("missing") == 200
        (reply,) = bot.replies(1)
    assert reply.payload["response_type"] == "ephemeral"
    assert reply.payload["text"] == (
        ":warning: No instance named `box`.\nSee `/gpu list` for the names."
    )


def test_usage_error_shows_the_usage_line(sqlite_db: Database, tmp_path: Path) -> None:
    def configure(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name")

    registry = Registry()
    registry.command(
        CommandSpec("health", "health", "/gpu health NAME [--full]", (), configure, _echo)
    )
    with start_slack_bot(sqlite_db, tmp_path, registry=registry) as bot:
        assert bot.command("health") == 200
        text = bot.reply_text()
    assert "The following arguments are required: name." in text
    assert "Usage: `/gpu health NAME [--full]`" in text


def test_crash_gives_an_error_id_that_is_in_the_log(
    sqlite_db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def crash(rt: object, caller: Caller, args: argparse.Namespace) -> Reply:
        raise RuntimeError("disk on fire")

    registry = Registry()
    registry.command(_spec("crash", crash))
    caplog.set_level(logging.ERROR, logger="bot.listeners")
    with start_slack_bot(sqlite_db, tmp_path, registry=registry) as bot:
        assert bot.command("crash") == 200
        text = bot.reply_text()
    assert text.startswith(":x: Something went wrong (error id ")
    assert "an admin can find it in the bot's log" in text
    assert "disk on fire" not in text
    error_id = text.split("error id ")[1][:8]
    (record,) = [r for r in caplog.records if error_id in r.getMessage()]
    assert record.exc_info is not None
    assert "disk on fire" in str(record.exc_info[1])


def test_reply_in_channel_and_caller_fields(sqlite_db: Database, tmp_path: Path) -> None:
    seen: list[Caller] = []

    def announce(rt: object, caller: Caller, args: argparse.Namespace) -> Reply:
        seen.append(caller)
        return Reply(text="for everyone", ephemeral=False)

    registry = Registry()
    registry.command(_spec("announce", announce))
    with start_slack_bot(sqlite_db, tmp_path, registry=registry) as bot:
        assert bot.command("announce", user="U0BOB", user_name="bob", channel="C0OPS") == 200
        (reply,) = bot.replies(1)
    assert reply.payload["response_type"] == "in_channel"
    assert seen == [Caller(user_id="U0BOB", channel_id="C0OPS", user_name="bob")]


def test_button_click_runs_its_action_and_replaces_the_message(
    sqlite_db: Database, tmp_path: Path
) -> None:
    clicks: list[tuple[Caller, str]] = []

    def confirm(rt: object, caller: Caller, value: str) -> Reply:
        clicks.append((caller, value))
        return Reply(text=f"Released {value}", replace_original=True)

    registry = Registry()
    registry.action(ActionSpec("thing_confirm", confirm))
    with start_slack_bot(sqlite_db, tmp_path, registry=registry) as bot:
        assert (
            bot.click(
                "thing_confirm", "42", user="U0BOB", user_name="bob", message_ts="1700000000.000100"
            )
            == 200
        )
        (reply,) = bot.replies(1)
        assert bot.click("not_registered", "1") == 404
    assert reply.payload["replace_original"] is True
    assert reply.payload["text"] == "Released 42"
    assert clicks == [(Caller(user_id="U0BOB", channel_id="C0GENERAL", user_name="bob"), "42")]


def test_action_errors_reach_the_clicker(sqlite_db: Database, tmp_path: Path) -> None:
    def refuse(rt: object, caller: Caller, value: str) -> Reply:
        raise NotFound(f"Instance {value} is gone.")

    registry = Registry()
    registry.action(ActionSpec("thing_refuse", refuse))
    with start_slack_bot(sqlite_db, tmp_path, registry=registry) as bot:
        assert bot.click("thing_refuse", "7") == 200
        (reply,) = bot.replies(1)
    assert reply.payload == {
        "text": ":warning: Instance 7 is gone.",
        "response_type": "ephemeral",
        "replace_original": False,
    }


def test_blocks_slack_refuses_fall_back_to_the_text(sqlite_db: Database, tmp_path: Path) -> None:
    def too_big(rt: object, caller: Caller, args: argparse.Namespace) -> Reply:
        block = {"type": "section", "text": {"type": "mrkdwn", "text": "x"}}
        return Reply(text="the whole fleet", blocks=(block,) * 51)

    registry = Registry()
    registry.command(_spec("big", too_big))
    with start_slack_bot(sqlite_db, tmp_path, registry=registry) as bot:
        assert bot.command("big") == 200
        (reply,) = bot.replies(1)
        assert isinstance(bot.rt.executor, BotExecutor)
        assert bot.rt.executor.wait_idle(5)
    assert reply.payload["text"] == "the whole fleet"
    assert "blocks" not in reply.payload


def _echo(rt: object, caller: Caller, args: argparse.Namespace) -> Reply:
    return Reply(text=repr(vars(args)))


# --- bad input of any kind changes nothing ------------------------------------------------------

_WORDS = st.one_of(
    st.sampled_from(
        [
            *sorted(build_registry().commands),
            *["--", "--gpu", "--count", "--price", "--release-in", "--full", "local", "-h", "2h"],
        ]
    ),
    st.text(max_size=10),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=st.one_of(st.text(max_size=80), st.lists(_WORDS, max_size=8).map(" ".join)))
def test_bad_input_gets_an_ephemeral_message_and_changes_nothing(
    slack_bot: SlackBot, text: str
) -> None:
    before = _store_rows(slack_bot.rt.db)
    count = len(slack_bot.slack.responses)
    forms = len(slack_bot.slack.calls_to("views.open"))
    assert slack_bot.command(text) == 200
    if form_for_command(text) is not None:  # `register` alone opens its form
        assert slack_bot.slack.wait_for(lambda s: len(s.calls_to("views.open")) > forms)
        assert _store_rows(slack_bot.rt.db) == before
        return
    reply = slack_bot.replies(count + 1)[count]
    assert reply.payload.get("text")
    if reply.payload["text"].startswith((":warning:", ":x:")):
        assert reply.payload["response_type"] == "ephemeral"
        assert _changed_but_who_used_the_bot(slack_bot.rt.db, before) == {}
    assert not reply.payload["text"].startswith(":x:"), reply.payload["text"]


def test_http_server_paths_and_limits(slack_bot: SlackBot) -> None:
    base = slack_bot.server.url.removesuffix("/slack/events")
    for request in (
        urllib.request.Request(base + "/healthz"),  # probes have a listener of their own
        urllib.request.Request(base + "/other", data=b"x"),
        urllib.request.Request(base + "/slack/other"),
    ):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == 404
    too_big = urllib.request.Request(slack_bot.server.url, data=b"x" * (1024 * 1024 + 1))
    with pytest.raises(urllib.error.URLError) as refused:  # 413, or reset while still sending
        urllib.request.urlopen(too_big, timeout=10)
    code = getattr(refused.value, "code", None)
    assert code == 413 or isinstance(refused.value.reason, ConnectionError)
    assert slack_bot.slack.responses == []


# --- button values that are no id ---------------------------------------------------------------

BAD_BUTTON_VALUES = [
    "",
    "abc",
    "-1",
    "0",
    "+1",
    " 1",
    "1 ",
    "1\n",
    "01",
    "1.0",
    "1e3",
    "0x1",
    "1,2",
    "\u0661",  # ARABIC-INDIC DIGIT ONE: a digit to str.isdigit, not an id
    str(2**31),  # one past the largest INTEGER, the type of the id columns
    str(2**63),
    "9" * 40,
    "null",
]


@pytest.mark.parametrize("value", BAD_BUTTON_VALUES)
def test_a_button_value_that_is_no_id_gets_a_clear_message_and_changes_nothing(
    sqlite_db: Database, tmp_path: Path, value: str
) -> None:
    add_instance(sqlite_db)  # instance 1: what a lenient reading of "01" or " 1" would hit
    before = _store_rows(sqlite_db)
    actions = sorted(build_registry().actions)
    # Every click from one person at once: the per-person limit would turn some away.
    with start_slack_bot(sqlite_db, tmp_path, commands_per_user=len(actions)) as bot:
        for action_id in actions:
            assert bot.click(action_id, value, user="U0OWNER") == 200, action_id
        replies = bot.replies(len(actions))
        assert isinstance(bot.rt.executor, BotExecutor)
        assert bot.rt.executor.wait_idle(5)
    assert [r.payload for r in replies] == [
        {"text": BAD_BUTTON_TEXT, "response_type": "ephemeral", "replace_original": False}
    ] * len(actions)
    assert _store_rows(sqlite_db) == before


def test_the_largest_id_reaches_the_handler_on_every_store(db: Database, tmp_path: Path) -> None:
    actions = sorted(build_registry().actions)
    with start_slack_bot(db, tmp_path, commands_per_user=len(actions)) as bot:
        for action_id in actions:
            assert bot.click(action_id, str(MAX_BUTTON_ID)) == 200, action_id
        texts = [str(r.payload["text"]) for r in bot.replies(len(actions))]
    assert len(texts) == len(actions)
    for text in texts:
        assert text.startswith(":warning:"), text  # not found, not a crash
        assert text != BAD_BUTTON_TEXT


def test_button_id_reads_only_canonical_ids_in_bigint_range() -> None:
    assert button_id("1") == 1
    assert button_id("42") == 42
    assert button_id(str(MAX_BUTTON_ID)) == MAX_BUTTON_ID
    assert [v for v in BAD_BUTTON_VALUES if button_id(v) is not None] == []


def test_the_handlers_read_a_button_value_as_the_listeners_check_it() -> None:
    assert button_number(str(MAX_BUTTON_ID)) == MAX_BUTTON_ID
    for value in BAD_BUTTON_VALUES:
        with pytest.raises(UsageError, match="button is broken"):
            button_number(value)


def test_whoever_used_the_bot_is_known_by_name(sqlite_db: Database, tmp_path: Path) -> None:
    add_instance(sqlite_db, name="box", owner_id="U0BOB")
    with start_slack_bot(sqlite_db, tmp_path) as bot:
        assert bot.command("allow box @carol", user="U0BOB", user_name="bob") == 200
        (unknown,) = bot.replies(1)
        assert "I don't know who @carol is" in unknown.payload["text"]
        assert bot.command("list", user="U0CAROL", user_name="carol") == 200
        assert bot.click("deadline_extend_1h", "999", user="U0DAVE", user_name="dave") == 200
        bot.replies(3)
        assert bot.command("allow box @carol", user="U0BOB", user_name="bob") == 200
        allowed = bot.replies(4)[3]
        assert "I don't know" not in allowed.payload["text"]
    rows = _store_rows(sqlite_db)
    assert ("U0CAROL", "carol") in [row[:2] for row in rows["person"]]
    assert ("U0DAVE", "dave") in [row[:2] for row in rows["person"]]
    assert any("U0CAROL" in row for row in rows["instanceaccess"])
