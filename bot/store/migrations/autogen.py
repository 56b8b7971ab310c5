"""Write the next migration from the difference between the models and the last revision.

Usage: ``python -m bot.store.migrations.autogen "what changed" [--url URL]``

Migrates a scratch SQLite database (or the database at ``--url``) to head, compares it with
``bot.store.models`` and writes ``versions/NNNN_<slug>.py`` when there is a difference. Review
the file before committing it: Alembic cannot see renames, and a column added to a table with
rows needs a server default.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from alembic import command
from alembic.script import ScriptDirectory

from bot.store.db import MIGRATIONS_DIR, Database, alembic_config
from bot.store.migrations import schema_diff


def main(argv: list[str] | None = None) -> int:
    """Write a revision; prints its path, or that nothing changed. Returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m bot.store.migrations.autogen")
    parser.add_argument("message", help="what the revision changes, e.g. 'add budget notes'")
    parser.add_argument("--url", help="compare against this database instead of scratch SQLite")
    args = parser.parse_args(argv)
    if args.url:
        return _generate(Database(args.url), args.message)
    with tempfile.TemporaryDirectory() as scratch:
        return _generate(Database(f"sqlite:///{Path(scratch) / 'autogen.sqlite3'}"), args.message)


def next_revision_id() -> str:
    """``0001``, ``0002`` ...: one more than the highest numbered revision so far."""
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    numbers = [int(rev.revision) for rev in script.walk_revisions() if rev.revision.isdigit()]
    return f"{max(numbers, default=0) + 1:04d}"


def _generate(db: Database, message: str) -> int:
    try:
        db.migrate()
        if not schema_diff(db):
            print("The models match the migrations; no revision written.")
            return 0
        rev_id = next_revision_id()
        with db.engine.connect() as connection:
            config = alembic_config(db, connection)
            config.set_main_option("file_template", "%%(rev)s_%%(slug)s")
            script = command.revision(config, message=message, autogenerate=True, rev_id=rev_id)
    finally:
        db.dispose()
    paths = [s.path for s in (script if isinstance(script, list) else [script]) if s is not None]
    for path in paths:
        print(f"Wrote {path}: review it before committing.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
