"""Migrations: the migrated schema matches the models, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlmodel import SQLModel, col, select

from bot.services.money import ledger
from bot.store.db import MIGRATIONS_DIR, Database, alembic_config
from bot.store.migrations import schema_diff
from bot.store.migrations.autogen import next_revision_id
from bot.store.models import Charge, Instance, LedgerState, UtilHour, UtilSample
from tests.bot.services.support import add_instance


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


def test_ledger_states_are_filled_in_from_the_charges_written_before(db: Database) -> None:
    start = datetime(2026, 3, 1, 0, 0)
    iid = add_instance(db, created_at=start, price_micros=1_000_000)
    with db.session() as session:
        for hour in range(3):
            session.add(
                Charge(
                    instance_id=iid,
                    kind="compute",
                    start_at=start + timedelta(hours=hour),
                    end_at=start + timedelta(hours=hour + 1),
                    billed_s=3600,
                    amount_micros=1_000_000,
                )
            )
        for minute in (5, 35, 65):
            session.add(
                UtilSample(
                    instance_id=iid,
                    at=start + timedelta(minutes=minute),
                    ok=minute != 35,
                    util_avg_pct=2.5 * minute,
                )
            )
    with db.engine.connect() as connection:  # back to before the states, charges kept
        command.downgrade(alembic_config(db, connection), "0003")
        connection.commit()
    db.migrate()
    with db.session() as session:
        (state,) = session.exec(select(LedgerState)).all()
        hours = session.exec(select(UtilHour).order_by(col(UtilHour.bucket_start))).all()
    assert (state.charged_micros, state.billed_s, state.month) == (3_000_000, 3 * 3600, "")
    assert [(h.bucket_start, h.polls, h.bad_polls, h.max_util_pct) for h in hours] == [
        (start, 2, 1, 12.5),
        (start + timedelta(hours=1), 1, 0, 162.5),
    ]
    with db.session() as session:
        charges = session.exec(select(Charge).order_by(col(Charge.start_at))).all()
    assert [(c.polls, c.bad_polls, c.max_util_pct) for c in charges] == [
        (2, 1, 12.5),
        (1, 0, 162.5),
        (0, 0, None),
    ]
    assert state.last_end_at == start + timedelta(hours=3)
    utc = ZoneInfo("UTC")
    ledger.accrue(db, start + timedelta(hours=5, minutes=10), utc)
    with db.session() as session:
        (state,) = session.exec(select(LedgerState)).all()
        month = ledger.month_charged_micros(session, "2026-03", utc)
    assert (state.charged_micros, state.month, state.month_micros) == (
        5_000_000,
        "2026-03",
        5_000_000,
    )
    assert month == {iid: 5_000_000}


def test_billing_rules_left_at_the_old_defaults_become_not_said(db: Database) -> None:
    said = {"billing_increment": "second", "min_charge_s": 0, "billing_from": "created"}
    aws = add_instance(db, name="aws", provider="aws", provider_instance_id="i-1", **said)
    manual = add_instance(db, name="manual", **said)
    typed = add_instance(
        db,
        name="typed",
        provider="compshare",
        provider_instance_id="uhost-1",
        billing_increment="minute",  # not Compshare's documented hour, which 0018 makes NULL
        min_charge_s=60,
        billing_from="ssh_ready",
    )
    with db.engine.connect() as connection:  # back to when the defaults meant "not said"
        command.downgrade(alembic_config(db, connection), "0012")
        connection.commit()
    db.migrate()
    with db.session() as session:
        rows = {
            inst.id: (inst.billing_increment, inst.min_charge_s, inst.billing_from)
            for inst in session.exec(select(Instance)).all()
        }
    assert rows == {
        aws: (None, None, None),  # the platform's rules, as before: 60 s minimum on AWS
        manual: ("second", 0, "created"),  # manual bills exactly as typed
        typed: ("minute", 60, "ssh_ready"),
    }
