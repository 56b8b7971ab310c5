"""A hung database: the real PostgreSQL behind a TCP proxy that stops forwarding.

Signed slash commands to the real Bolt app are acked at once (no store on the threads that
ack) and told within Slack's 3 s that the store is not answering, in the caller's language;
``/readyz`` says 503 and why; the log says it once per failing part, not once per command; and
once the proxy forwards again each command runs once (or, when its store check failed, was said
not to have run), and new ones work. A signed command sent again runs once.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from bot.app import build_health, build_ops
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.executor import BotExecutor
from bot.http_server import ops_server
from bot.slack_requests import signed_headers
from bot.store.db import Database
from tests.fixtures.slack import SIGNING_SECRET, SlackBot, start_slack_bot
from tests.fixtures.store import fresh_database

pytestmark = pytest.mark.integration

#: Slack's limit for the answer to a request, seconds.
ACK_LIMIT_S = 3.0


class PausingProxy:
    """Forwards TCP connections from a loopback port to ``target``; while paused, accepts
    connections and reads nothing more from either side, as a dead network path does."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept: none are taken
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the pumps; the peers see the end
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._wait_flowing()
        try:
            server = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets += [client, server]
        threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _wait_flowing(self) -> None:
        while not self._flowing.wait(0.05):
            if self._closed.is_set():
                return

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                self._wait_flowing()
                data = source.recv(65536)
                if not data:
                    break
                self._wait_flowing()  # what arrived while paused is held, not sent
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


@contextmanager
def proxied_postgres(tmp_path: Path) -> Iterator[tuple[Database, PausingProxy]]:
    """A fresh, migrated PostgreSQL database reached through a :class:`PausingProxy`."""
    with fresh_database("postgresql", tmp_path) as direct:
        url = direct.url
        proxy = PausingProxy((url.host or "127.0.0.1", url.port or 5432))
        db = Database(url.set(port=proxy.port).render_as_string(hide_password=False))
        try:
            yield db, proxy
        finally:
            proxy.resume()
            db.dispose()
            proxy.close()


def timed_command(
    bot: SlackBot, text: str, *, user: str = "U0ALICE"
) -> tuple[int, str, float, str]:
    """POST a signed `/gpu TEXT`; the status, the text of the answer's body, the seconds it
    took and the command's response URL."""
    body = bot.command_body(text, user=user)
    started = time.monotonic()
    status, answer = bot.send(body, signed_headers(body, SIGNING_SECRET))
    took_s = time.monotonic() - started
    shown = json.loads(answer).get("text", "") if answer.strip() else ""
    return status, str(shown), took_s, parse_qs(body)["response_url"][0]


def texts_at(bot: SlackBot, url: str) -> list[str]:
    """The texts posted to response URL ``url``, in order."""
    return [str(r.payload.get("text", "")) for r in bot.slack.responses if r.url == url]


def get(url: str, timeout_s: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_a_hung_store_is_answered_in_time_said_by_readyz_and_each_command_runs_once_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        proxied_postgres(tmp_path) as (db, proxy),
        start_slack_bot(db, tmp_path, executor_workers=4) as bot,
    ):
        health = build_health(bot.rt)
        ops = ops_server(build_ops(bot.rt, health), host="127.0.0.1", port=0).start()
        try:
            assert bot.command("lang zh", user="U0BOB") == 200
            bot.replies(1)
            assert bot.command("help", user="U0BOB") == 200  # read in the language Bob chose
            bot.replies(2)
            assert "ok database" in get(f"{ops.base_url}/readyz")[1]

            proxy.pause()
            caplog.set_level(logging.INFO)
            caplog.clear()
            sent = time.monotonic()
            acks = [timed_command(bot, "help") for _ in range(4)]
            acks.append(timed_command(bot, "help", user="U0BOB"))
            assert [(status, text) for status, text, _, _ in acks] == [(200, "")] * 5
            assert max(took_s for _, _, took_s, _ in acks) < 1.0
            urls = [url for _, _, _, url in acks]
            assert bot.slack.wait_for(
                lambda s: all(texts_at(bot, url) for url in urls), ACK_LIMIT_S + 1
            )
            assert time.monotonic() - sent < ACK_LIMIT_S + 0.5
            told = [texts_at(bot, url)[0] for url in urls]
            assert all("The store is not answering" in text for text in told[:4]), told
            assert "数据库没有响应" in told[4], told

            started = time.monotonic()
            ready_status, ready_text = get(f"{ops.base_url}/readyz")
            assert time.monotonic() - started < ACK_LIMIT_S
            assert ready_status == 503
            assert "FAIL database: no answer for" in ready_text

            proxy.resume()
            # Each command runs once, or (its connection timed out) is said not to have run.
            assert bot.slack.wait_for(
                lambda s: all(len(texts_at(bot, url)) >= 2 for url in urls), 20
            )
            assert isinstance(bot.rt.executor, BotExecutor)
            assert bot.rt.executor.wait_idle(20)
            for url in urls:
                _, outcome, *more = texts_at(bot, url)
                assert more == [], more
                assert "/gpu" in outcome or "没有执行" in outcome or "nothing was run" in outcome
            # One line a minute per failing part (the commands waiting, their store check),
            # not one per command, and no traceback.
            noisy = [r for r in caplog.records if r.levelno >= logging.WARNING]
            by_logger = [r.name for r in noisy]
            assert len(by_logger) == len(set(by_logger)), [r.getMessage() for r in noisy]
            assert not any(r.exc_info for r in noisy)
            assert "the store is not answering" in " ".join(r.getMessage() for r in noisy)
            assert get(f"{ops.base_url}/readyz")[1].startswith("ok database")
            status, text, _, url = timed_command(bot, "help")
            assert (status, text) == (200, "")
            assert bot.slack.wait_for(lambda s: len(texts_at(bot, url)) == 1, 10)
            assert "/gpu" in texts_at(bot, url)[0]
        finally:
            proxy.resume()  # else stopping waits for the commands held by the store
            ops.shutdown()


def test_a_store_that_fails_runs_no_command_and_says_so(tmp_path: Path) -> None:
    ran: list[str] = []
    with (
        proxied_postgres(tmp_path) as (db, proxy),
        start_slack_bot(db, tmp_path, registry=_counting_registry(ran)) as bot,
    ):
        assert bot.command("count") == 200
        assert bot.slack.wait_for(lambda s: len(s.responses) >= 1, 10)
        proxy.close()  # connections cut, new ones refused
        assert bot.command("count") == 200
        assert bot.slack.wait_for(lambda s: len(s.responses) >= 2, ACK_LIMIT_S + 1)
        assert "nothing was run" in str(bot.slack.responses[1].payload.get("text"))
        assert isinstance(bot.rt.executor, BotExecutor)
        assert bot.rt.executor.wait_idle(10)
        assert ran == ["count"]


def test_a_signed_request_sent_again_is_acked_and_not_run(tmp_path: Path) -> None:
    ran: list[str] = []
    with (
        proxied_postgres(tmp_path) as (db, _proxy),
        start_slack_bot(db, tmp_path, registry=_counting_registry(ran)) as bot,
    ):
        body = bot.command_body("count")
        headers = signed_headers(body, SIGNING_SECRET)
        assert bot.send(body, headers) == (200, b"")
        assert bot.send(body, headers) == (200, b"")
        assert isinstance(bot.rt.executor, BotExecutor)
        assert bot.slack.wait_for(lambda s: len(s.responses) >= 1, 10)
        assert bot.rt.executor.wait_idle(10)
        assert ran == ["count"]
        assert len(bot.slack.responses) == 1


def _counting_registry(ran: list[str]) -> Registry:
    def count(rt: object, caller: object, args: argparse.Namespace) -> Reply:
        ran.append("count")
        return Reply(text="counted")

    registry = Registry()
    registry.command(
        CommandSpec(
            name="count",
            summary="count",
            usage="/gpu count",
            examples=(),
            configure=lambda parser: None,
            handler=count,
        )
    )
    return registry


def test_a_click_the_store_cannot_check_in_time_is_refused_unrun(tmp_path: Path) -> None:
    with (
        proxied_postgres(tmp_path) as (db, proxy),
        start_slack_bot(db, tmp_path) as bot,
    ):
        assert bot.command("help") == 200
        bot.replies(1)
        proxy.pause()
        try:
            started = time.monotonic()
            assert bot.click("release_instance", "1") == 503
            assert time.monotonic() - started < ACK_LIMIT_S
        finally:
            proxy.resume()
        assert len(bot.slack.responses) == 1
