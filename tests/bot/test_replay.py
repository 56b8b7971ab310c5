"""Replay protection: a signed request sent again runs nothing, over HTTP into the real app."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from slack_bolt import BoltRequest
from sqlalchemy import select

from bot.app import BotExecutor
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.replay import MARGIN_S, SIGNATURE_WINDOW_S, ReplayGuard
from bot.services.access import Caller
from bot.slack_requests import signed_headers
from bot.store.db import Database
from bot.store.models import SeenSignature
from tests.fixtures.slack import SIGNING_SECRET, SlackBot, start_slack_bot

pytestmark = pytest.mark.integration

KEEP_S = SIGNATURE_WINDOW_S + MARGIN_S


class FakeClock:
    """Seconds since the epoch, moved by hand."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class Counted:
    """A `/gpu count` command that records every run."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self._lock = threading.Lock()

    def handler(self, rt: object, caller: Caller, args: argparse.Namespace) -> Reply:
        with self._lock:
            self.runs.append(" ".join(args.rest))
        return Reply(text="counted")

    def registry(self) -> Registry:
        def configure(parser: argparse.ArgumentParser) -> None:
            parser.add_argument("rest", nargs="*")

        registry = Registry()
        registry.command(CommandSpec("count", "count", "/gpu count", (), configure, self.handler))
        return registry


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def counted() -> Counted:
    return Counted()


@pytest.fixture
def bot(
    sqlite_db: Database, tmp_path: Path, clock: FakeClock, counted: Counted
) -> Iterator[SlackBot]:
    guard = ReplayGuard(clock=clock)
    with start_slack_bot(
        sqlite_db, tmp_path, registry=counted.registry(), replay_guard=guard
    ) as slack_bot:
        yield slack_bot


def _settled(bot: SlackBot) -> None:
    assert isinstance(bot.rt.executor, BotExecutor)
    assert bot.rt.executor.wait_idle(10)


def test_the_same_signed_gpu_command_runs_once(slack_bot: SlackBot) -> None:
    body = slack_bot.command_body("help")
    headers = signed_headers(body, SIGNING_SECRET)
    assert slack_bot.send(body, headers) == (200, b"")
    assert len(slack_bot.replies(1)) == 1
    _settled(slack_bot)
    assert isinstance(slack_bot.rt.executor, BotExecutor)
    ran = slack_bot.rt.executor.completed

    assert slack_bot.send(body, headers) == (200, b"")
    _settled(slack_bot)
    assert slack_bot.rt.executor.completed == ran  # the listener handed nothing to the pool
    assert len(slack_bot.slack.responses) == 1


def test_a_new_signature_of_the_same_body_runs(bot: SlackBot, counted: Counted) -> None:
    body = bot.command_body("count once")
    first = signed_headers(body, SIGNING_SECRET, timestamp=int(time.time()) - 5)
    # Slack's retries are new requests: a new timestamp, so a new signature.
    retry = {**signed_headers(body, SIGNING_SECRET), "x-slack-retry-num": "1"}
    assert first["x-slack-signature"] != retry["x-slack-signature"]
    assert bot.post(body, first) == 200
    assert bot.post(body, first) == 200
    assert bot.post(body, retry) == 200
    bot.replies(2)
    _settled(bot)
    assert counted.runs == ["once", "once"]


def test_a_forgotten_signature_runs_again(
    bot: SlackBot, clock: FakeClock, counted: Counted
) -> None:
    body = bot.command_body("count again")
    headers = signed_headers(body, SIGNING_SECRET, timestamp=int(clock.now))
    assert bot.post(body, headers) == 200
    bot.replies(1)
    clock.now += KEEP_S - 1
    assert bot.post(body, headers) == 200
    _settled(bot)
    assert counted.runs == ["again"]
    clock.now += 2
    assert bot.post(body, headers) == 200
    bot.replies(2)
    _settled(bot)
    assert counted.runs == ["again", "again"]


def test_a_signature_is_remembered_only_once_it_checked_out(
    bot: SlackBot, counted: Counted
) -> None:
    body = bot.command_body("count genuine")
    headers = signed_headers(body, SIGNING_SECRET)
    # The genuine signature on a forged body is refused and must not block the genuine request.
    assert bot.post(body.replace("genuine", "forged"), headers) == 401
    assert bot.post(body, headers) == 200
    bot.replies(1)
    _settled(bot)
    assert counted.runs == ["genuine"]


def test_concurrent_copies_run_once(bot: SlackBot, counted: Counted) -> None:
    body = bot.command_body("count burst")
    headers = signed_headers(body, SIGNING_SECRET)
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda _: bot.post(body, headers), range(16)))
    assert statuses == [200] * 16
    bot.replies(1)
    _settled(bot)
    assert counted.runs == ["burst"]


def test_socket_mode_requests_carry_no_signature_and_pass(bot: SlackBot, counted: Counted) -> None:
    body = bot.command_body("count socket")
    for _ in range(2):
        response = bot.app.dispatch(BoltRequest(body=body, mode="socket_mode"))
        assert response.status == 200
    bot.replies(2)
    _settled(bot)
    assert counted.runs == ["socket", "socket"]


# --- the memory itself ---------------------------------------------------------------------------


def test_memory_is_bounded_by_its_cap_oldest_first(clock: FakeClock) -> None:
    guard = ReplayGuard(clock=clock, max_entries=3)
    stamp = str(int(clock.now))
    assert [guard.first_time(f"v0={n}", stamp) for n in range(4)] == [True] * 4
    assert len(guard) == 3
    assert not guard.first_time("v0=3", stamp)
    assert guard.first_time("v0=0", stamp)  # pushed out by the cap


def test_expired_entries_leave_memory(clock: FakeClock) -> None:
    guard = ReplayGuard(clock=clock)
    for n in range(100):
        guard.first_time(f"v0={n}", str(int(clock.now)))
    assert len(guard) == 100
    clock.now += KEEP_S + 1
    assert guard.first_time("v0=new", str(int(clock.now)))
    assert len(guard) == 1


def test_a_timestamp_ahead_of_the_clock_is_kept_until_its_window_ends(clock: FakeClock) -> None:
    guard = ReplayGuard(clock=clock)
    ahead = clock.now + SIGNATURE_WINDOW_S  # Bolt accepts up to five minutes ahead
    assert guard.first_time("v0=ahead", str(int(ahead)))
    clock.now = ahead + SIGNATURE_WINDOW_S - 1  # the signature is still valid here
    assert not guard.first_time("v0=ahead", str(int(ahead)))


def test_threads_racing_with_one_signature_let_one_through(clock: FakeClock) -> None:
    guard = ReplayGuard(clock=clock)
    start = threading.Barrier(32)

    def attempt(_: int) -> bool:
        start.wait()
        return guard.first_time("v0=race", str(int(clock.now)))

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(attempt, range(32)))
    assert results.count(True) == 1


def test_a_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ReplayGuard(max_entries=0)


# --- the store decides: processes sharing one database ------------------------------------------


@pytest.fixture
def two_bots(db: Database, tmp_path: Path, counted: Counted) -> Iterator[tuple[SlackBot, SlackBot]]:
    """Two apps on one database, each with its own engine and its own replay memory, as two
    bot processes would have."""
    other = Database(db.url.render_as_string(hide_password=False))
    try:
        with (
            start_slack_bot(
                db, tmp_path / "a", registry=counted.registry(), replay_guard=ReplayGuard(db=db)
            ) as first,
            start_slack_bot(
                other,
                tmp_path / "b",
                registry=counted.registry(),
                replay_guard=ReplayGuard(db=other),
            ) as second,
        ):
            yield first, second
    finally:
        other.dispose()


def test_two_processes_on_one_store_apply_a_signed_request_once(
    two_bots: tuple[SlackBot, SlackBot], counted: Counted
) -> None:
    first, second = two_bots
    body = first.command_body("count extend")
    headers = signed_headers(body, SIGNING_SECRET)
    assert first.post(body, headers) == 200
    assert second.post(body, headers) == 200
    first.replies(1)
    _settled(first)
    _settled(second)
    assert counted.runs == ["extend"]


def test_copies_racing_into_two_processes_apply_once(
    two_bots: tuple[SlackBot, SlackBot], counted: Counted
) -> None:
    first, second = two_bots
    body = first.command_body("count race")
    headers = signed_headers(body, SIGNING_SECRET)
    targets = [first, second] * 8
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda bot: bot.post(body, headers), targets))
    assert statuses == [200] * 16
    first.replies(1)
    _settled(first)
    _settled(second)
    assert counted.runs == ["race"]


def test_the_default_app_guards_on_its_store(db: Database, tmp_path: Path) -> None:
    with start_slack_bot(db, tmp_path) as bot:
        body = bot.command_body("help")
        headers = signed_headers(body, SIGNING_SECRET)
        assert bot.post(body, headers) == 200
    with db.session() as session:
        seen = session.execute(select(SeenSignature.signature)).scalars().all()  # type: ignore[call-overload]
    assert seen == [headers["x-slack-signature"]]


def test_expired_rows_are_pruned_in_bounded_batches(db: Database, clock: FakeClock) -> None:
    guard = ReplayGuard(clock=clock, db=db, prune_batch=2, prune_every_s=10**9)
    for index in range(5):
        assert guard.first_time(f"v0=old{index}", str(int(clock.now)))
    assert not guard.first_time("v0=old0", str(int(clock.now)))
    clock.now += KEEP_S + 1
    assert guard.first_time("v0=new", str(int(clock.now)))
    assert guard.prune(db, clock.now) == 2
    assert guard.prune(db, clock.now) == 2
    assert guard.prune(db, clock.now) == 1
    assert guard.prune(db, clock.now) == 0
    with db.session() as session:
        left = session.execute(select(SeenSignature.signature)).scalars().all()  # type: ignore[call-overload]
    assert left == ["v0=new"]


def test_a_second_guard_on_the_store_refuses_what_the_first_let_through(
    db: Database, clock: FakeClock
) -> None:
    one, two = ReplayGuard(clock=clock, db=db), ReplayGuard(clock=clock, db=db)
    assert one.first_time("v0=abc", str(int(clock.now)))
    assert not two.first_time("v0=abc", str(int(clock.now)))
    assert not one.first_time("v0=abc", str(int(clock.now)))


def test_a_timestamp_more_than_30_s_ahead_is_refused(bot: SlackBot, counted: Counted) -> None:
    body = bot.command_body("count ahead")
    headers = signed_headers(body, SIGNING_SECRET, timestamp=int(time.time()) + 60)
    sent: dict[str, str | Sequence[str]] = {**headers}
    request = BoltRequest(body=body, headers=sent)
    assert bot.app.dispatch(request).status == 401
    assert counted.runs == []
