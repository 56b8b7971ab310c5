"""bot.logging_setup: text or JSON lines, the level, and the ids of what a line is about, from
one call's ``extra`` or a block's context (as the release path logs); a request id on every line
of one signed command or click through the real app (another for the next); the limiter that
logs a repeated failure once a minute with a count."""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.ack_path import in_this_context
from bot.commands.registry import ActionSpec, CommandSpec, Registry, Reply
from bot.logging_setup import (
    REQUEST_ID_LENGTH,
    Repeat,
    RepeatLimiter,
    configure_logging,
    current_request_id,
    log_context,
    log_ids,
    request_context,
)
from bot.services.access import Caller
from bot.services.instances import releases
from bot.store.db import Database
from bot.store.models import Release
from tests.bot.services.support import T0, Clock, add_instance, make_runtime
from tests.fixtures.slack import start_slack_bot


@pytest.fixture(autouse=True)
def _root_logger_back() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_json_lines_carry_the_ids_and_the_traceback(tmp_path: Path) -> None:
    out = tmp_path / "bot.log"
    configure_logging("INFO", file=out, json_format=True)
    log = logging.getLogger("bot.test")
    log.debug("not at INFO")
    log.info("polled %s", "box1", extra=log_ids(instance_id=3, instance="box1"))
    with log_context(release_id=7, instance_id=3):
        try:
            raise RuntimeError("platform said no")
        except RuntimeError:
            log.exception("release failed: 名前")
    first, second = (json.loads(line) for line in _lines(out))
    assert first["message"] == "polled box1"
    assert (first["level"], first["logger"]) == ("INFO", "bot.test")
    assert (first["instance_id"], first["instance"]) == (3, "box1")
    assert "release_id" not in first
    assert first["time"].endswith("+00:00")
    assert second["message"] == "release failed: 名前"
    assert (second["release_id"], second["instance_id"]) == (7, 3)
    assert second["exception"].splitlines()[-1] == "RuntimeError: platform said no"


def test_text_lines_show_the_ids_after_the_message(tmp_path: Path) -> None:
    out = tmp_path / "bot.log"
    configure_logging("WARNING", file=out)
    log = logging.getLogger("bot.test")
    log.info("below the level")
    with log_context(release_id=7):
        log.warning("release %s: %s", 7, "slow", extra=log_ids(instance_id=3))
        try:
            raise ValueError("bad")
        except ValueError:
            log.exception("broke")
    lines = _lines(out)
    assert lines[0].endswith(
        "WARNING bot.test [MainThread] release 7: slow [instance_id=3 release_id=7]"
    )
    assert lines[1].endswith("broke [release_id=7]")
    assert lines[-1] == "ValueError: bad"
    assert all("below the level" not in line for line in lines)


def test_a_line_outside_the_context_carries_no_ids(tmp_path: Path) -> None:
    out = tmp_path / "bot.log"
    configure_logging("INFO", file=out, json_format=True)
    with log_context(job_id=5):
        pass
    logging.getLogger("bot.test").info("after")
    assert "job_id" not in json.loads(_lines(out)[0])


def test_unknown_id_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown log id"):
        log_ids(instance_id=1, user="U1")
    with pytest.raises(ValueError, match="unknown log id"), log_context(prompt=1):
        pass


def test_a_failed_release_is_logged_with_its_ids(sqlite_db: Database, tmp_path: Path) -> None:
    out = tmp_path / "bot.log"
    configure_logging("INFO", file=out, json_format=True)
    rt = make_runtime(sqlite_db, Clock(T0))
    # A platform the bot has no credentials for: the attempt fails and is logged.
    instance_id = add_instance(
        sqlite_db, name="box", provider="lambda", provider_instance_id="lam-1"
    )
    with sqlite_db.session() as session:
        release = Release(
            instance_id=instance_id,
            reason="user",
            requested_by="UOWNER",
            requested_at=T0 - timedelta(minutes=1),
        )
        session.add(release)
        session.flush()
        release_id = release.id
    assert releases.process_due_releases(rt, T0) == [release_id]
    failed = [
        record
        for record in map(json.loads, _lines(out))
        if record["message"].startswith(f"release {release_id} attempt 1 failed")
    ]
    assert len(failed) == 1
    assert (failed[0]["release_id"], failed[0]["instance_id"]) == (release_id, instance_id)


def test_a_request_id_is_on_every_line_of_its_block_and_not_after(tmp_path: Path) -> None:
    out = tmp_path / "bot.log"
    configure_logging("INFO", file=out)
    log = logging.getLogger("bot.test")
    with request_context() as first:
        log.info("one", extra=log_ids(instance_id=3))
        assert current_request_id() == first
    with request_context("feedc0ffee42"):
        log.info("two")
    log.info("three")
    one, two, three = _lines(out)
    assert len(first) == REQUEST_ID_LENGTH
    assert one.endswith(f"one [request_id={first} instance_id=3]")
    assert two.endswith("two [request_id=feedc0ffee42]")
    assert three.endswith("three")
    assert current_request_id() is None


def test_work_handed_to_another_thread_keeps_the_request_id(tmp_path: Path) -> None:
    out = tmp_path / "bot.log"
    configure_logging("INFO", file=out, json_format=True)
    log = logging.getLogger("bot.test")
    with request_context() as rid:
        work = in_this_context(log.info)
    thread = threading.Thread(target=work, args=("on another thread",))
    thread.start()
    thread.join()
    (line,) = map(json.loads, _lines(out))
    assert (line["message"], line["request_id"]) == ("on another thread", rid)
    assert line["thread"] != "MainThread"


def test_the_limiter_lets_one_line_a_minute_through_with_a_count() -> None:
    limiter = RepeatLimiter(every_s=60)
    assert limiter.admit("jobs", 1000.0) == Repeat(first=True, count=1, window_s=0.0)
    assert [limiter.admit("jobs", 1000.0 + s) for s in (10, 20, 59.9)] == [None] * 3
    assert limiter.admit("ledger", 1010.0) == Repeat(first=True, count=1, window_s=0.0)
    assert limiter.admit("jobs", 1060.0) == Repeat(first=False, count=4, window_s=60.0)
    assert limiter.admit("jobs", 1070.0) is None
    # Working again within the minute of the last line says nothing; the run goes on.
    assert limiter.settle("jobs", 1080.0) is None
    assert limiter.admit("jobs", 1090.0) is None
    # Once that minute is over it is said, with the failures held back; the run ends.
    assert limiter.settle("jobs", 1120.0) == 2
    assert limiter.settle("jobs", 1130.0) is None
    assert limiter.admit("jobs", 1140.0) == Repeat(first=True, count=1, window_s=0.0)
    assert limiter.settle("never_failed", 1140.0) is None
    # A failure timed just before the last line (its thread read the clock before another
    # took the lock) is in the same window; a clock that went back a window starts a new one.
    assert limiter.admit("ledger", 1009.99) is None
    assert limiter.admit("ledger", 900.0) == Repeat(first=False, count=2, window_s=0.0)


def _logs_and_replies(rt: Any, caller: Caller, what: str) -> Reply:
    log = logging.getLogger("bot.test.handler")
    log.info("%s: started", what)
    log.info("%s: done", what)
    return Reply(text=what)


def test_every_line_of_a_command_or_click_carries_its_own_request_id(
    sqlite_db: Database, tmp_path: Path
) -> None:
    def loud(rt: Any, caller: Caller, args: argparse.Namespace) -> Reply:
        return _logs_and_replies(rt, caller, "loud")

    def crash(rt: Any, caller: Caller, args: argparse.Namespace) -> Reply:
        logging.getLogger("bot.test.handler").info("crash: started")
        raise RuntimeError("disk on fire")

    def click(rt: Any, caller: Caller, value: str) -> Reply:
        return _logs_and_replies(rt, caller, f"click {value}")

    def no_args(parser: argparse.ArgumentParser) -> None:
        pass

    registry = Registry()
    registry.command(CommandSpec("loud", "loud", "/gpu loud", (), no_args, loud))
    registry.command(CommandSpec("crash", "crash", "/gpu crash", (), no_args, crash))
    registry.action(ActionSpec("loud_click", click))
    out = tmp_path / "bot.log"
    with start_slack_bot(sqlite_db, tmp_path, registry=registry) as bot:
        configure_logging("INFO", file=out, json_format=True)
        assert bot.command("loud") == 200
        bot.replies(1)
        assert bot.command("crash") == 200
        bot.replies(2)
        assert bot.click("loud_click", "7") == 200
        bot.replies(3)
        # The bot's own lines (the HTTP server's, e.g. waitress' queue warnings, are no
        # command's).
        lines = [line for line in map(json.loads, _lines(out)) if line["logger"].startswith("bot.")]
    by_request: dict[object, list[str]] = {}
    for line in lines:
        message = str(line["message"])
        shown = "error id" if message.startswith("error id ") else message
        by_request.setdefault(line.get("request_id"), []).append(shown)
    # Every line has a request id, each request its own, and one request's lines share it.
    assert sorted(by_request.values()) == [
        ["click 7: started", "click 7: done"],
        ["crash: started", "error id"],
        ["loud: started", "loud: done"],
    ]
    assert all(len(str(rid)) == REQUEST_ID_LENGTH for rid in by_request)
