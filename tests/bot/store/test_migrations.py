"""Migrations: the migrated schema matches the models, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlmodel import SQLModel

from bot.store.db import MIGRATIONS_DIR, Database, alembic_config
from bot.store.migrations import schema_diff
from bot.store.migrations.autogen import next_revision_id


def _head() -> str:
    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None
    return head


def test_migrated_schema_matches_the_models(db: Database) -> None:
    # When this fails, a model changed without a migration:
    # run `python -m bot.store.migrations.autogen "what changed"` and review the file.
    assert schema_diff(db) == []
    assert db.current_revision() == _head()


def test_every_model_table_exists_after_migrating(db: Database) -> None:
    tables = set(inspect(db.engine).get_table_names())
    assert set(SQLModel.metadata.tables) <= tables
    assert "alembic_version" in tables


def test_migrate_twice_changes_nothing(db: Database) -> None:
    db.migrate()
    assert db.current_revision() == _head()
    assert schema_diff(db) == []


def test_downgrade_to_base_and_back(db: Database) -> None:
    with db.engine.connect() as connection:
        command.downgrade(alembic_config(db, connection), "base")
    assert db.current_revision() is None
    assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}
    db.migrate()
    assert schema_diff(db) == []


def test_two_processes_migrating_at_once_both_succeed(empty_db: Database) -> None:
    url = empty_db.url.render_as_string(hide_password=False)
    script = "import sys; from bot.store.db import Database; Database(sys.argv[1]).migrate()"
    procs = [
        subprocess.Popen([sys.executable, "-c", script, url], stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    results = [
        (proc.wait(timeout=120), proc.stderr.read() if proc.stderr else b"") for proc in procs
    ]
    for proc in procs:
        if proc.stderr:
            proc.stderr.close()
    assert [code for code, _ in results] == [0, 0], results
    assert empty_db.current_revision() == _head()
    assert schema_diff(empty_db) == []


def test_a_fresh_database_reports_no_revision(empty_db: Database) -> None:
    assert empty_db.current_revision() is None
    assert schema_diff(empty_db) != []


def test_next_revision_id_follows_the_numbered_revisions() -> None:
    assert next_revision_id() == f"{int(_head()) + 1:04d}"
