"""The Home tab: rendered within Slack's limits in the viewer's language, published when they
open it (a signed ``app_home_opened`` event into the real app), its Extend and Release buttons
(Release asks first), and published again after their commands, at most once per interval."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.models.views import View

from bot import listeners
from bot.blocks.home import HOME_EXTEND, HOME_REGISTER, MINE_SHOWN
from bot.blocks.home import home_view as render_home
from bot.executor import BotExecutor
from bot.i18n import speaking
from bot.listeners import HomeTabs
from bot.local_slack import check_view
from bot.services.home import HomeInstance, HomeJob, HomeView
from bot.slack_requests import app_home_opened_body, block_actions_body, signed_headers
from bot.store.db import Database
from bot.store.models import Instance, Person
from tests.bot.services.support import T0, Clock, add_instance, make_runtime
from tests.chinese import assert_chinese
from tests.fixtures.slack import SIGNING_SECRET, SlackBot, start_slack_bot

NOW = datetime(2026, 12, 2, 12, 0)


def _instance(n: int, *, owner: str = "UALICE", state: str = "active") -> HomeInstance:
    return HomeInstance(
        id=n,
        name=f"box{n}",
        owner_id=owner,
        state=state,
        gpu_model="A100",
        gpu_count=2,
        util_pct=48,
        deadline_at=NOW + timedelta(hours=2, minutes=10),
        cost_micros=12_300_000,
        burn_micros_per_hour=2_100_000,
        currency="USD",
    )


def _view(
    mine: int = 1, fleet: int = 2, jobs: int = 1, budget: int | None = 50_000_000
) -> HomeView:
    mine_items = tuple(_instance(n) for n in range(1, mine + 1))
    others = tuple(_instance(100 + n, owner="UBOB") for n in range(max(fleet - mine, 0)))
    return HomeView(
        user_id="UALICE",
        now=NOW,
        timezone="UTC",
        currency="USD",
        month="2026-12",
        mine=mine_items,
        jobs=tuple(
            HomeJob(40 + n, "box1", "python train.py", NOW - timedelta(hours=1))
            for n in range(jobs)
        ),
        spent_micros=45_000_000,
        budget_micros=budget,
        fleet=mine_items + others,
    )


def _buttons(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        element
        for block in view["blocks"]
        if block["type"] == "actions"
        for element in block["elements"]
    ]


def _button(view: dict[str, Any], action_id: str, value: str | None = None) -> dict[str, Any]:
    (found,) = [
        b for b in _buttons(view) if b["action_id"] == action_id and value in (None, b["value"])
    ]
    return found


# --- rendering ----------------------------------------------------------------------------------


def test_the_home_shows_instances_with_buttons_jobs_spend_and_the_fleet() -> None:
    view = render_home(_view())
    assert check_view(view, "home") == []
    View(**view).validate_json()
    text = json.dumps(view, ensure_ascii=False)
    assert "Your GPUs" in text
    assert "*box1*  ·  2x A100  ·  utilisation 48%  ·  2h 10m left  ·  $" in text
    assert "`#40` on *box1*: `python train.py`, running for 1h" in text
    assert "$45.00 of your $50.00 budget in 2026-12 (90%)." in text
    assert "<@UBOB>" in text
    assert "2 instances, $4.20/h together." in text
    release = _button(view, "instance_release_confirm", "1")
    assert release["style"] == "danger"
    assert release["confirm"]["title"]["text"] == "Release box1?"
    assert "$12.30" in release["confirm"]["text"]["text"]
    extend = _button(view, HOME_EXTEND, "1")
    assert extend["confirm"]["title"]["text"] == "Extend box1 by 1h?"
    assert _button(view, HOME_REGISTER)["value"] == "register"


def test_without_instances_or_budget_the_home_says_so() -> None:
    text = json.dumps(render_home(_view(mine=0, fleet=0, jobs=0, budget=None)))
    assert "You have no instances." in text
    assert "You have no monthly budget." in text
    assert "No jobs of yours are running." in text
    assert "The team has no instances." in text


def test_a_big_fleet_stays_within_slacks_limits_and_keeps_the_register_button() -> None:
    view = render_home(_view(mine=60, fleet=600, jobs=300))
    assert check_view(view, "home") == []
    assert len(view["blocks"]) <= 100
    assert "50 more instances, with later deadlines; `/gpu status` lists them all." in (
        json.dumps(view)
    )
    assert _button(view, HOME_REGISTER)


def test_thirty_instances_show_the_nearest_deadlines_first_with_buttons_the_rest_collapsed() -> (
    None
):
    """30 instances given in an order unrelated to their deadlines (and some without one): the
    nearest deadlines come first with their buttons, none of them hidden; the rest are one
    line each, counted, with the command that lists them."""
    hours = [(n * 7) % 30 + 1 for n in range(30)]  # 1..30 h, shuffled
    items = tuple(
        replace(
            _instance(n + 1),
            deadline_at=None if n in (3, 11) else NOW + timedelta(hours=h),
            state="stopped" if n == 5 else "active",
        )
        for n, h in enumerate(hours)
    )
    view = render_home(HomeView(**{**vars(_view()), "mine": items, "fleet": items}))
    assert check_view(view, "home") == []
    by_deadline = sorted(
        (item for item in items if item.deadline_at is not None),
        key=lambda item: (item.deadline_at, item.name),
    )
    nearest = [item.id for item in by_deadline[:MINE_SHOWN]]
    with_buttons = [
        int(block["block_id"].removeprefix("home-inst-"))
        for block in view["blocks"]
        if block.get("block_id", "").startswith("home-inst-")
    ]
    assert with_buttons == nearest
    for item_id in nearest:
        [row] = [b for b in view["blocks"] if b.get("block_id") == f"home-inst-{item_id}"]
        following = view["blocks"][view["blocks"].index(row) + 1]
        assert following["type"] == "actions"
    text = json.dumps(view, ensure_ascii=False)
    assert "20 more instances, with later deadlines; `/gpu status` lists them all." in text
    mine_part = text.split("Your running jobs")[0]
    for item in items:  # every one of them is on the Home, the nearest first
        assert f"*{item.name}*" in mine_part
    undated = (items[11], items[3])  # no deadline: last, by name (box12 before box4)
    order = [mine_part.index(f"*{item.name}*  ·") for item in (*by_deadline, *undated)]
    assert order == sorted(order)


def test_the_collapsed_count_in_chinese() -> None:
    with speaking("zh"):
        view = render_home(_view(mine=12, fleet=12))
    assert_chinese(view)
    text = json.dumps(view, ensure_ascii=False)
    assert "还有 2 个实例" in text
    assert "`/gpu status`" in text


def test_a_long_command_is_cut_with_an_ellipsis_and_the_time_shows_its_date() -> None:
    view = _view()
    long_job = HomeJob(41, "box1", "python train.py " + "x" * 300, NOW - timedelta(hours=1))
    text = json.dumps(
        render_home(HomeView(**{**vars(view), "jobs": (long_job,)})), ensure_ascii=False
    )
    assert "x" * 100 + "…`" in text
    assert "Updated Wed 02 Dec 12:00 UTC." in text


def test_the_home_in_chinese() -> None:
    with speaking("zh"):
        view = render_home(_view(budget=40_000_000))
    assert_chinese(view)
    text = json.dumps(view, ensure_ascii=False)
    assert "box1" in text
    assert "$45.00" in text
    assert check_view(view, "home") == []


# --- through the app ----------------------------------------------------------------------------


@pytest.fixture
def bot(sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlackBot]:
    """The app on HTTP, publishing a Home again at once after a command."""
    monkeypatch.setattr(listeners, "HOME_REFRESH_S", 0.0)
    with start_slack_bot(sqlite_db, tmp_path) as running:
        yield running


def _published(bot: SlackBot) -> int:
    return len(bot.slack.calls_to("views.publish"))


def _open_home(bot: SlackBot, user: str = "U0ALICE", tab: str = "home") -> int:
    body = app_home_opened_body(user_id=user, tab=tab)
    return bot.post(body, signed_headers(body, SIGNING_SECRET, content_type="application/json"))


def _home(bot: SlackBot, user: str = "U0ALICE") -> dict[str, Any]:
    before = _published(bot)
    assert _open_home(bot, user) == 200
    assert bot.slack.wait_for(lambda s: len(s.calls_to("views.publish")) > before)
    call = bot.slack.calls_to("views.publish")[-1]
    assert call.ok, call.error
    assert call.args["user_id"] == user
    view = bot.slack.home_view(user)
    assert view is not None
    return view


def _click_home(bot: SlackBot, view: dict[str, Any], action_id: str, value: str) -> int:
    body = block_actions_body(
        action_id=action_id, value=value, user_id="U0ALICE", user_name="alice", view=view
    )
    return bot.post(body, signed_headers(body, SIGNING_SECRET))


def _dms(bot: SlackBot, count: int) -> list[str]:
    assert bot.slack.wait_for(lambda s: len(s.calls_to("chat.postMessage")) >= count)
    return [str(c.args.get("text")) for c in bot.slack.calls_to("chat.postMessage")]


def test_opening_the_home_tab_publishes_a_valid_home(bot: SlackBot) -> None:
    add_instance(bot.rt.db, name="box", owner_id="U0ALICE")
    add_instance(bot.rt.db, name="bobs", owner_id="U0BOB")
    view = _home(bot)
    assert check_view(view, "home") == []
    sent = bot.slack.calls_to("views.publish")[-1].args["view"]
    View(**(json.loads(sent) if isinstance(sent, str) else sent)).validate_json()
    text = json.dumps(view)
    assert "*box*" in text
    assert "*bobs*" in text
    assert _button(view, "instance_release_confirm")["confirm"]
    # The Messages tab is no Home: nothing is published for it.
    assert _open_home(bot, tab="messages") == 200
    assert isinstance(bot.rt.executor, BotExecutor)
    assert bot.rt.executor.wait_idle(5)
    assert _published(bot) == 1


def test_the_home_of_a_chinese_speaker_is_in_chinese(bot: SlackBot) -> None:
    add_instance(bot.rt.db, name="box", owner_id="U0ALICE", deadline_at=T0 + timedelta(days=400))
    with bot.rt.db.session() as session:
        person = session.get(Person, "U0ALICE")
        assert person is not None
        person.language = "zh"
        session.add(person)
    view = _home(bot)
    assert_chinese(view)
    assert "box" in json.dumps(view)
    assert "我的 GPU 实例" in json.dumps(view, ensure_ascii=False)


def test_release_on_the_home_asks_first_then_releases_and_the_home_follows(
    bot: SlackBot,
) -> None:
    iid = add_instance(bot.rt.db, name="box", owner_id="U0ALICE")
    view = _home(bot)
    release = _button(view, "instance_release_confirm", str(iid))
    assert release["confirm"]["confirm"]["text"] == "Yes, release it"
    # Slack shows the dialog; only a confirmed click reaches the app.
    assert _click_home(bot, view, "instance_release_confirm", str(iid)) == 200
    (text,) = _dms(bot, 1)
    assert "box" in text
    assert bot.slack.wait_for(lambda s: len(s.calls_to("views.publish")) >= 2)
    with bot.rt.db.session() as session:
        inst = session.get(Instance, iid)
        assert inst is not None
        assert inst.state != "active"
    assert bot.slack.responses == []  # a click on the Home has no response URL


def test_extend_on_the_home_moves_the_deadline_an_hour(bot: SlackBot) -> None:
    deadline = bot.rt.now() + timedelta(hours=2)
    iid = add_instance(bot.rt.db, name="box", owner_id="U0ALICE", deadline_at=deadline)
    view = _home(bot)
    assert _click_home(bot, view, HOME_EXTEND, str(iid)) == 200
    (text,) = _dms(bot, 1)
    assert "The deadline of *box* is now" in text
    with bot.rt.db.session() as session:
        inst = session.get(Instance, iid)
        assert inst is not None
        assert inst.deadline_at == deadline + timedelta(hours=1)


def test_extend_on_an_old_home_does_not_reach_a_new_instance_of_that_name(
    bot: SlackBot,
) -> None:
    """The button carries the id of the instance shown: once that one is released, a new
    instance given its name is not extended by it."""
    deadline = bot.rt.now() + timedelta(hours=2)
    old = add_instance(bot.rt.db, name="box", owner_id="U0ALICE", deadline_at=deadline)
    view = _home(bot)
    with bot.rt.db.session() as session:
        inst = session.get(Instance, old)
        assert inst is not None
        inst.state = "released"
        session.add(inst)
    new = add_instance(bot.rt.db, name="box", owner_id="U0ALICE", deadline_at=deadline)
    assert _click_home(bot, view, HOME_EXTEND, str(old)) == 200
    (text,) = _dms(bot, 1)
    assert "box is already released." in text
    with bot.rt.db.session() as session:
        inst = session.get(Instance, new)
        assert inst is not None
        assert inst.deadline_at == deadline


def test_the_home_offers_no_extend_past_an_admins_cap(bot: SlackBot) -> None:
    deadline = bot.rt.now() + timedelta(hours=2)
    capped = add_instance(
        bot.rt.db,
        name="capped",
        owner_id="U0ALICE",
        deadline_at=deadline,
        lifetime_cap_at=deadline + timedelta(minutes=30),
    )
    room = add_instance(
        bot.rt.db,
        name="room",
        owner_id="U0ALICE",
        deadline_at=deadline,
        lifetime_cap_at=deadline + timedelta(hours=1),
    )
    view = _home(bot)
    extends = [b["value"] for b in _buttons(view) if b["action_id"] == HOME_EXTEND]
    assert extends == [str(room)]
    assert _button(view, "instance_release_confirm", str(capped))


def test_a_command_publishes_the_home_again_for_who_opened_it(bot: SlackBot) -> None:
    _home(bot)
    assert bot.command("help") == 200
    assert bot.slack.wait_for(lambda s: len(s.calls_to("views.publish")) >= 2)
    assert bot.command("help", user="U0BOB", user_name="bob") == 200
    bot.replies(2)
    assert isinstance(bot.rt.executor, BotExecutor)
    assert bot.rt.executor.wait_idle(5)
    assert {c.args["user_id"] for c in bot.slack.calls_to("views.publish")} == {"U0ALICE"}


# --- publishing at most once per interval -------------------------------------------------------


class _Client:
    """Slack's views.publish as a boundary: records, or fails when told to."""

    def __init__(self) -> None:
        self.published: list[str] = []
        self.fail = False
        self.done = threading.Semaphore(0)

    def views_publish(self, *, user_id: str, view: dict[str, Any]) -> None:
        try:
            if self.fail:
                raise ConnectionError("Slack is down")
            assert check_view(view, "home") == []
            self.published.append(user_id)
        finally:
            self.done.release()


def test_the_home_is_published_at_most_once_per_interval(
    sqlite_db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    rt = make_runtime(sqlite_db, Clock())
    client = _Client()
    homes = HomeTabs(rt, client, every_s=3.0)  # type: ignore[arg-type]
    try:
        homes.changed("UALICE")  # never opened: nothing to keep fresh
        homes.opened("UALICE")
        assert client.done.acquire(timeout=5)
        assert client.published == ["UALICE"]
        homes.changed("UALICE")
        homes.changed("UALICE")
        assert client.published == ["UALICE"]  # within the interval: later, once
        assert client.done.acquire(timeout=10)
        assert not client.done.acquire(timeout=0.5)
        assert client.published == ["UALICE", "UALICE"]
        client.fail = True
        with caplog.at_level(logging.WARNING, logger="bot.listeners"):
            assert homes.publish("UALICE") is False
        assert "could not publish the Home tab of UALICE" in caplog.text
    finally:
        homes.close()
        rt.executor.shutdown(wait=True)


class _SlowClient:
    """views.publish that holds its answer until told to go on, counting the calls under way
    and keeping the views it was given (call number ``held``, from 0, waits at
    ``entered``/``go``)."""

    def __init__(self, *, held: int = 0) -> None:
        self.held = held
        self.views: list[dict[str, Any]] = []
        self.entered = threading.Event()
        self.go = threading.Event()
        self.under_way = 0
        self.most_under_way = 0
        self._lock = threading.Lock()

    def views_publish(self, *, user_id: str, view: dict[str, Any]) -> None:
        with self._lock:
            self.under_way += 1
            self.most_under_way = max(self.most_under_way, self.under_way)
            held = len(self.views) == self.held
            self.views.append(view)
        try:
            if held:
                self.entered.set()
                assert self.go.wait(10)
        finally:
            with self._lock:
                self.under_way -= 1


def test_a_home_asked_for_while_one_is_under_way_is_sent_once_after_it(
    sqlite_db: Database,
) -> None:
    rt = make_runtime(sqlite_db, Clock())
    client = _SlowClient()
    homes = HomeTabs(rt, client)  # type: ignore[arg-type]
    first = threading.Thread(target=homes.publish, args=("UALICE",))
    try:
        first.start()
        assert client.entered.wait(5)  # Slack is slow to answer the first
        add_instance(sqlite_db, name="fresh", owner_id="UALICE")
        assert homes.publish("UALICE") is True  # later, not beside it
        assert homes.publish("UALICE") is True
        assert len(client.views) == 1
        client.go.set()
        first.join(5)
        assert not first.is_alive()
        assert client.most_under_way == 1
        assert len(client.views) == 2  # the two asked for meanwhile: sent once
        assert "fresh" not in json.dumps(client.views[0])
        assert "fresh" in json.dumps(client.views[1])  # built after the change, sent last
        assert homes.publish("UALICE") is True  # nothing under way: sent at once
        assert len(client.views) == 3
    finally:
        client.go.set()
        first.join(5)
        homes.close()
        rt.executor.shutdown(wait=True)


def test_a_slow_home_holds_none_of_its_persons_command_places(sqlite_db: Database) -> None:
    rt = make_runtime(sqlite_db, Clock())
    rt.executor.shutdown(wait=True)
    executor = BotExecutor(4, per_user=1)
    rt.executor = executor
    client = _SlowClient(held=1)  # the Home after the command answers late
    homes = HomeTabs(rt, client, every_s=0.0)  # type: ignore[arg-type]
    try:
        homes.opened("UALICE")
        assert executor.wait_idle(5)
        command = executor.submit_command("UALICE", homes.changed, "UALICE")
        assert command.result(5) is None  # the command ended ...
        assert client.entered.wait(5)  # ... and its Home is on the way, slowly
        assert executor.pending_for("UALICE") == 0
        assert executor.submit_command("UALICE", lambda: "next").result(5) == "next"
    finally:
        client.go.set()
        homes.close()
        executor.shutdown(wait=True)
