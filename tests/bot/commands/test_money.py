"""`/gpu spend`, `budget`, `fit` and `estimate` through the real Bolt app and the Slack stand-in."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from sqlmodel import select

from bot.local_slack import ResponseUrlPost, SharedFile, check_blocks
from bot.store.db import Database
from bot.store.models import Budget, Person
from tests.bot.services.support import Clock, add_instance
from tests.fixtures.slack import SlackBot, payload_json, start_slack_bot

pytestmark = pytest.mark.integration

USD = 1_000_000


@pytest.fixture
def bot(sqlite_db: Database, tmp_path: Path) -> Iterator[SlackBot]:
    clock = Clock(datetime(2026, 4, 2, 12, 0))
    add_instance(
        sqlite_db,
        name="trainer",
        owner_id="U0BOB",
        project="llm",
        gpu_model="h100-sxm",
        price_micros=3 * USD,
        created_at=datetime(2026, 3, 10, 8, 0),
        released_at=datetime(2026, 3, 10, 18, 0),
        state="released",
    )
    with start_slack_bot(
        sqlite_db, tmp_path, clock=clock, admins=frozenset({"U0ALICE"})
    ) as slack_bot:
        yield slack_bot


def ask(bot: SlackBot, text: str, **kwargs: str) -> ResponseUrlPost:
    """Send one command and wait for its answer (commands answer one at a time here)."""
    before = len(bot.slack.responses)
    assert bot.command(text, **kwargs) == 200
    return bot.replies(before + 1)[before]


def files(bot: SlackBot) -> list[SharedFile]:
    return [event for event in bot.slack.events if isinstance(event, SharedFile)]


def test_spend_answers_and_uploads_chart_and_csv(bot: SlackBot) -> None:
    assert bot.command("spend 2026-03 --by project --share") == 200
    (reply,) = bot.replies(1)
    assert reply.payload["response_type"] == "in_channel"
    assert not check_blocks(reply.payload["blocks"])
    shown = payload_json(reply)
    assert "GPU spend, March 2026" in shown
    assert "$30.00" in shown
    assert "llm" in shown
    assert bot.slack.wait_for(lambda s: len(files(bot)) == 2)
    assert len(bot.slack.calls_to("files.getUploadURLExternal")) == 2
    assert len(bot.slack.calls_to("files.completeUploadExternal")) == 2
    chart, table = files(bot)
    assert chart.filename == "gpu-spend-2026-03-by-project.png"
    assert chart.content.startswith(b"\x89PNG")
    assert chart.channel == "C0GENERAL"
    rows = list(csv.DictReader(io.StringIO(table.content.decode("utf-8-sig"))))
    assert [(r["instance"], r["total_USD"]) for r in rows] == [("trainer", "30.000000")]


def test_spend_answers_only_the_caller_unless_shared(bot: SlackBot, sqlite_db: Database) -> None:
    with sqlite_db.session() as session:
        bob = session.get(Person, "U0BOB")
        assert bob is not None
        bob.display_name = "鲍勃"
        session.add(bob)
    private = ask(bot, "spend 2026-03")
    assert private.payload["response_type"] == "ephemeral"
    assert "add `--share`" in payload_json(private)
    assert files(bot) == []
    shared = ask(bot, "spend 2026-03 --share")
    assert shared.payload["response_type"] == "in_channel"
    assert bot.slack.wait_for(lambda s: len(files(bot)) == 2)
    _, table = files(bot)
    assert table.content.startswith(b"\xef\xbb\xbf")
    (row,) = csv.DictReader(io.StringIO(table.content.decode("utf-8-sig")))
    assert (row["owner"], row["owner_name"]) == ("U0BOB", "鲍勃")
    assert "--share" in ask(bot, "help spend").payload["text"] + payload_json(
        ask(bot, "help spend")
    )


def test_estimate_prices_are_per_card(bot: SlackBot) -> None:
    shown = payload_json(
        ask(bot, "estimate --gpu a100-sxm4-80gb --count 2 --hours 50 --price 1.74/h --buy 4031")
    )
    assert "*$174.00* a month" in shown  # 50 h x $1.74 x 2 cards
    assert "*$8,062.00* once" in shown
    assert "buy $4,031.00 a card (as given)" in shown
    assert "one card" not in shown
    assert "*2,317 h* of renting by the hour: *46 months* at 50 h a month" in shown
    plan = payload_json(ask(bot, "estimate --gpu a100-sxm4-80gb --hours 50 --price 0.869/h"))
    assert "*never pays off*" in plan
    refused = ask(bot, "estimate --gpu 4090 --hours 50 --buy 0").payload["text"]
    assert "--buy 0 means nothing to compare" in refused


def test_amounts_in_another_currency_are_refused(bot: SlackBot, sqlite_db: Database) -> None:
    refused = ask(bot, "budget set project llm 2000元").payload["text"]
    assert "is in CNY" in refused
    assert "amounts here are in USD" in refused
    with sqlite_db.session() as session:
        assert list(session.exec(select(Budget))) == []
    assert "Budget set" in ask(bot, "budget set project llm 2,000.50").payload["text"]
    with sqlite_db.session() as session:
        assert [b.limit_micros for b in session.exec(select(Budget))] == [2_000_500_000]
    price = ask(bot, "estimate --gpu 4090 --hours 50 --price ¥2/h").payload["text"]
    assert "is in CNY or JPY" in price


def test_spend_of_an_empty_month_uploads_nothing(bot: SlackBot) -> None:
    assert bot.command("spend 2026-01") == 200
    assert "Nothing was charged" in payload_json(bot.replies(1)[0])
    assert files(bot) == []


def test_spend_with_bad_arguments_changes_nothing(bot: SlackBot) -> None:
    texts = [
        ask(bot, text).payload["text"]
        for text in ("spend 2026-13", "spend --by team", "spend 2027-01")
    ]
    assert all(r.payload["response_type"] == "ephemeral" for r in bot.slack.responses)
    assert "not a month" in texts[0]
    assert "--by 'team' is not known" in texts[1]
    assert "has not started yet" in texts[2]
    assert files(bot) == []


def test_budgets_need_an_admin(bot: SlackBot, sqlite_db: Database) -> None:
    denied = ask(bot, "budget set user <@U0BOB|bob> 500", user="U0BOB")
    assert "Only an admin can set budgets" in denied.payload["text"]
    with sqlite_db.session() as session:
        assert list(session.exec(select(Budget))) == []
    assert "Budget set" in ask(bot, "budget set user <@U0BOB|bob> 500").payload["text"]
    ask(bot, "budget set project llm 2,000")
    listing = ask(bot, "budget list", user="U0BOB")
    shown = payload_json(listing)
    assert "<@U0BOB>" in shown
    assert "project *llm*" in shown
    assert "$2,000.00" in shown
    assert not check_blocks(listing.payload["blocks"])
    assert "removed" in ask(bot, "budget rm project llm").payload["text"]
    with sqlite_db.session() as session:
        assert [(b.scope, b.subject) for b in session.exec(select(Budget))] == [("user", "U0BOB")]


def test_budget_usage_errors(bot: SlackBot) -> None:
    texts = [
        ask(bot, text).payload["text"]
        for text in ("budget set user @bob", "budget grow user U0BOB 5", "budget set team x 5")
    ]
    assert "needs a kind, who and an amount" in texts[0]
    assert "`budget grow` is not known" in texts[1]
    assert "not a budget kind" in texts[2]


def test_fit_and_estimate(bot: SlackBot) -> None:
    fit = ask(bot, "fit 7b lora --seq 4096")
    estimate = ask(bot, "estimate --gpu 4090 --hours 600 --monthly 350 --buy 1800")
    assert not check_blocks(fit.payload["blocks"])
    assert not check_blocks(estimate.payload["blocks"])
    assert "Fits on" in payload_json(fit)
    assert "RTX 4090" in payload_json(fit)
    shown = payload_json(estimate)
    assert "Cheapest: *monthly plan*" in shown
    assert "$350.00" in shown


def test_fit_and_estimate_errors(bot: SlackBot) -> None:
    commands = (
        "fit 7b full --bits 4",
        "fit 7b lora --seq many",
        "estimate --gpu voodoo --hours 3",
        "estimate --gpu 4090",
    )
    texts = [ask(bot, text).payload["text"] for text in commands]
    assert "full fine-tune trains 16-bit" in texts[0]
    assert "--context 'many' is not a whole number" in texts[1]
    assert "not a GPU model I know" in texts[2]
    assert "--hours" in texts[3]


def test_budget_user_as_mention_id_or_name(bot: SlackBot, sqlite_db: Database) -> None:
    with sqlite_db.session() as session:
        bob = session.get(Person, "U0BOB")
        assert bob is not None
        bob.display_name = "bob"
        session.add(bob)
    for who, amount in (("<@U0BOB>", "100"), ("U0BOB", "200"), ("@bob", "300")):
        reply = ask(bot, f"budget set user {who} {amount}")
        assert "Budget set" in reply.payload["text"], who
        with sqlite_db.session() as session:
            rows = [(b.subject, b.limit_micros) for b in session.exec(select(Budget))]
        assert rows == [("U0BOB", int(amount) * USD)], who
    unknown = ask(bot, "budget set user @nobody 50").payload["text"]
    assert "nobody called @nobody" in unknown
    with sqlite_db.session() as session:
        assert [b.limit_micros for b in session.exec(select(Budget))] == [300 * USD]
    assert "removed" in ask(bot, "budget rm user @bob").payload["text"]
    with sqlite_db.session() as session:
        assert list(session.exec(select(Budget))) == []
