"""The database wrapper: sessions, SQLite settings, URLs, errors, concurrency, on both backends."""

from __future__ import annotations

import socket
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlmodel import select

from bot.errors import StoreError
from bot.settings import Settings
from bot.store.db import Database, normalize_url
from bot.store.models import Charge, Instance, Person
from bot.values import MICROS
from tests.bot.services.support import add_instance


def _instance(name: str = "box", *, state: str = "active", owner: str = "U1") -> Instance:
    return Instance(name=name, owner_id=owner, host="10.0.0.1", ssh_user="root", state=state)


def _count_people(db: Database) -> int:
    with db.session() as session:
        return len(session.exec(select(Person)).all())


def _add_person(db: Database, slack_id: str = "U1") -> None:
    with db.session() as session:
        session.add(Person(slack_id=slack_id))


def test_session_commits_when_the_block_ends(db: Database) -> None:
    _add_person(db)
    with db.session() as session:
        assert session.get(Person, "U1") is not None


def test_session_rolls_back_when_the_block_raises(db: Database) -> None:
    def add_then_fail() -> None:
        with db.session() as session:
            session.add(Person(slack_id="U2"))
            session.flush()
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        add_then_fail()
    with db.session() as session:
        assert session.get(Person, "U2") is None


def test_objects_stay_readable_after_the_session(db: Database) -> None:
    _add_person(db)
    with db.session() as session:
        row = _instance()
        session.add(row)
    assert row.id is not None
    assert row.name == "box"


def test_times_round_trip_as_naive_utc(db: Database) -> None:
    _add_person(db)
    at = datetime(2026, 3, 29, 1, 30, 15, 123456)
    with db.session() as session:
        row = _instance()
        row.deadline_at = at
        session.add(row)
    with db.session() as session:
        loaded = session.exec(select(Instance)).one()
    assert loaded.deadline_at == at
    assert loaded.deadline_at is not None
    assert loaded.deadline_at.tzinfo is None


def test_money_columns_hold_more_than_32_bits(db: Database) -> None:
    _add_person(db)
    big = 10**15  # a billion dollars in micro-units
    with db.session() as session:
        row = _instance()
        row.price_micros = big
        session.add(row)
        session.flush()
        assert row.id is not None
        session.add(
            Charge(
                instance_id=row.id,
                kind="compute",
                start_at=datetime(2026, 1, 1),
                end_at=datetime(2026, 1, 2),
                amount_micros=5_000_000 * MICROS,
            )
        )
    with db.session() as session:
        assert session.exec(select(Instance.price_micros)).one() == big
        assert session.exec(select(Charge.amount_micros)).one() == 5_000_000 * MICROS


def test_live_instance_names_are_unique(db: Database) -> None:
    _add_person(db)
    with db.session() as session:
        session.add(_instance("box"))
    with pytest.raises(sa_exc.IntegrityError), db.session() as session:
        session.add(_instance("box", state="registering"))
    with db.session() as session:
        assert len(session.exec(select(Instance)).all()) == 1


def test_a_released_name_can_be_used_again(db: Database) -> None:
    _add_person(db)
    with db.session() as session:
        session.add(_instance("box", state="released"))
        session.add(_instance("box", state="released"))
        session.add(_instance("box", state="active"))
    with db.session() as session:
        states = sorted(session.exec(select(Instance.state)).all())
    assert states == ["active", "released", "released"]


def test_foreign_keys_are_enforced(db: Database) -> None:
    with pytest.raises(sa_exc.IntegrityError), db.session() as session:
        session.add(_instance(owner="U-nobody"))
    with db.session() as session:
        assert session.exec(select(Instance)).all() == []


def test_sqlite_runs_in_wal_with_foreign_keys_and_a_busy_timeout(sqlite_db: Database) -> None:
    with sqlite_db.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000


def test_sqlite_creates_the_directory_of_its_file(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "bot.sqlite3"
    db = Database(f"sqlite:///{path}")
    try:
        db.migrate()
    finally:
        db.dispose()
    assert path.is_file()


def test_from_settings_uses_a_sqlite_file_in_the_data_dir(tmp_path: Path) -> None:
    db = Database.from_settings(Settings(data_dir=tmp_path / "data"))
    try:
        db.migrate()
    finally:
        db.dispose()
    assert (tmp_path / "data" / "gpubot.sqlite3").is_file()


def test_in_memory_sqlite_is_shared_across_threads() -> None:
    db = Database("sqlite://")
    try:
        db.migrate()
        _add_person(db, "U9")
        found: list[bool] = []

        def look() -> None:
            with db.session() as session:
                found.append(session.get(Person, "U9") is not None)

        thread = threading.Thread(target=look)
        thread.start()
        thread.join(timeout=10)
        assert found == [True]
    finally:
        db.dispose()


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg"),
        ("postgres://u@h/db", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg"),
        ("sqlite:///x.db", "sqlite"),
    ],
)
def test_postgres_urls_use_psycopg_3(url: str, driver: str) -> None:
    assert normalize_url(url).drivername == driver


def test_a_url_that_is_not_one_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="not a database URL") as info:
        Database("no such thing")
    assert "GPUBOT_DATABASE_URL" in info.value.hint


def test_an_unreachable_database_is_a_store_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    db = Database(f"postgresql://postgres@127.0.0.1:{port}/nothing?connect_timeout=2")
    try:
        with pytest.raises(StoreError, match="the database failed") as info:
            _count_people(db)
        assert isinstance(info.value.__cause__, sa_exc.OperationalError)
        with pytest.raises(StoreError, match="migrating the database failed"):
            db.migrate()
    finally:
        db.dispose()


def test_an_unwritable_data_dir_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="cannot create the directory"):
        Database(f"sqlite:///{blocker / 'sub' / 'bot.sqlite3'}")


def test_concurrent_read_modify_write_loses_nothing(db: Database) -> None:
    """Many threads claim-and-increment one row: every increment lands (the bot's executor
    runs services on many threads at once)."""
    _add_person(db)
    with db.session() as session:
        row = _instance()
        session.add(row)
    threads, rounds = 6, 15
    errors: list[BaseException] = []

    def bump() -> None:
        try:
            for _ in range(rounds):
                with db.session() as session:
                    current = session.exec(
                        select(Instance).where(Instance.id == row.id).with_for_update()
                    ).one()
                    current.gpu_count = (current.gpu_count or 0) + 1
                    session.add(current)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=bump) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert errors == []
    with db.session() as session:
        assert session.exec(select(Instance.gpu_count)).one() == threads * rounds


def test_postgresql_is_reached_through_psycopg_3(db: Database) -> None:
    expected = ("sqlite", "pysqlite") if db.is_sqlite else ("postgresql", "psycopg")
    assert (db.engine.dialect.name, db.engine.dialect.driver) == expected
    with db.engine.connect() as connection:
        assert connection.execute(text("select 1")).scalar() == 1


def test_a_report_reading_never_holds_a_writer_back(sqlite_db: Database) -> None:
    """A read session takes no write lock on SQLite: a writer commits while a report is still
    reading (with ``session()`` the writer would wait the busy timeout out)."""
    add_instance(sqlite_db)
    with sqlite_db.read_session() as reading:
        assert len(reading.exec(select(Instance)).all()) == 1
        started = time.monotonic()
        writer = threading.Thread(target=add_instance, args=(sqlite_db,), kwargs={"name": "two"})
        writer.start()
        writer.join(timeout=10)
        assert not writer.is_alive()
        assert time.monotonic() - started < 5  # the busy timeout is 30 s
        assert len(reading.exec(select(Instance)).all()) == 1  # its own snapshot
    with sqlite_db.read_session() as reading:
        assert len(reading.exec(select(Instance)).all()) == 2
