"""bot.logging_setup: text or JSON lines, the level, and the ids of what a line is about, from
one call's ``extra`` or a block's context (as the release path logs)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bot.logging_setup import configure_logging, log_context, log_ids
from bot.services import releases
from bot.store.db import Database
from bot.store.models import Release
from tests.bot.services.support import T0, Clock, add_instance, make_runtime


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
