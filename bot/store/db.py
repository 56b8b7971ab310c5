"""The database: engine, sessions and migrations, for SQLite (default) and PostgreSQL.

SQLite runs in WAL mode with foreign keys on and a busy timeout; every transaction of
:meth:`Database.session` starts with ``BEGIN IMMEDIATE`` so that concurrent writers from the
bot's many threads queue up instead of failing half-way; :meth:`Database.read_session` (reports)
starts deferred and reads a snapshot without the write lock. PostgreSQL is reached through
psycopg 3. Times are naive UTC.

Nothing waits on the database without end: a new PostgreSQL connection gives up after
:data:`POSTGRES_CONNECT_TIMEOUT_S`, a statement the server runs longer than
:data:`POSTGRES_STATEMENT_TIMEOUT_MS` is cancelled by the server, and a session waits at most
:data:`POOL_TIMEOUT_S` for a pooled connection (all of them held by statements a hung database
has not answered); SQLite waits at most its busy timeout for the write lock. A statement already
sent to a database that stops answering is not bounded here (no driver can take it back):
callers that must answer in time run it with bot.store.deadline.

Connection-level failures (``OperationalError``, ``InterfaceError``) become
:class:`bot.errors.StoreError`; an ``IntegrityError`` (a unique key hit) is left to the caller,
which knows what the clash means.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.pool import StaticPool
from sqlmodel import Session, create_engine

from bot.errors import StoreError
from bot.settings import Settings

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: Seconds a new PostgreSQL connection may take (libpq's connect_timeout).
POSTGRES_CONNECT_TIMEOUT_S = 5
#: Milliseconds the PostgreSQL server lets one statement run before it cancels it.
POSTGRES_STATEMENT_TIMEOUT_MS = 60_000
#: Seconds a session waits for a connection from the pool.
POOL_TIMEOUT_S = 10.0


class Database:
    """One database. ``url`` is any SQLAlchemy URL; ``postgresql://`` and ``postgres://`` are
    read as psycopg 3. Raises StoreError when the URL cannot be used."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = normalize_url(url)
        self.is_sqlite = self.url.get_backend_name() == "sqlite"
        self.engine: Engine = _make_engine(self.url, echo=echo)

    @classmethod
    def from_settings(cls, settings: Settings, *, echo: bool = False) -> Database:
        """The database ``settings`` name (GPUBOT_DATABASE_URL, or SQLite in the data dir)."""
        return cls(settings.effective_database_url, echo=echo)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits when the block ends and rolls back when it raises.

        Objects stay readable after the commit (``expire_on_commit=False``). Keep the block
        short and free of network calls, and open no second session inside it on the same
        thread (on SQLite the second would wait for the first). Raises StoreError when the
        database fails.
        """
        try:
            with Session(self.engine, expire_on_commit=False) as session:
                try:
                    yield session
                    session.commit()
                except BaseException:
                    session.rollback()
                    raise
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
            raise StoreError(f"the database failed: {_reason(exc)}") from exc
        except sa_exc.TimeoutError as exc:
            raise StoreError(_POOL_EXHAUSTED) from exc

    @contextmanager
    def read_session(self) -> Iterator[Session]:
        """A session for reading only (reports): on SQLite its transaction starts deferred, so
        it reads a WAL snapshot without taking the write lock and never holds a writer back.
        Writing in it fails on SQLite once another connection writes. Raises StoreError when
        the database fails."""
        try:
            with Session(
                self.engine.execution_options(gpubot_read_only=True), expire_on_commit=False
            ) as session:
                try:
                    yield session
                finally:
                    session.close()  # ends the transaction; what was read stays readable
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
            raise StoreError(f"the database failed: {_reason(exc)}") from exc
        except sa_exc.TimeoutError as exc:
            raise StoreError(_POOL_EXHAUSTED) from exc

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` (Alembic upgrade). Safe to run from two processes at
        once: PostgreSQL takes an advisory lock, SQLite an immediate transaction. Alembic keeps
        global state, so within one process run it from one thread at a time.
        Raises StoreError when the database fails or another process holds the SQLite
        migration lock for longer than the busy timeout."""
        with self._sqlite_migration_lock():
            try:
                with self.engine.connect() as connection:
                    command.upgrade(alembic_config(self, connection), revision)
            except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
                raise StoreError(f"migrating the database failed: {_reason(exc)}") from exc

    @contextmanager
    def _sqlite_migration_lock(self) -> Iterator[None]:
        """Hold an exclusive lock on a file beside a SQLite database for the whole migration,
        connecting included: the first connection switches a new file to WAL and a batch
        migration rebuilds tables, and SQLite answers a second process doing the same with
        "database is locked" rather than waiting. Waits at most the busy timeout."""
        database = self.url.database or ""
        if not self.is_sqlite or database in ("", ":memory:") or database.startswith("file:"):
            yield
            return
        lock_path = Path(database).expanduser().with_name(Path(database).name + ".migrate-lock")
        deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
        with open(lock_path, "a+b") as handle:
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError as exc:
                    if time.monotonic() >= deadline:
                        raise StoreError(
                            "another process has been migrating the database for too long",
                            hint="Wait for the other gpubot process to finish, then try again.",
                        ) from exc
                    time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def current_revision(self) -> str | None:
        """The Alembic revision the schema is at, or None before the first migration."""
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({self.url.render_as_string(hide_password=True)!r})"


def normalize_url(url: str) -> URL:
    """Parse ``url``; rewrite plain PostgreSQL URLs to the psycopg 3 driver.

    Raises StoreError for a URL SQLAlchemy cannot read."""
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError as exc:
        raise StoreError(
            f"{url!r} is not a database URL",
            hint="Set GPUBOT_DATABASE_URL to sqlite:///PATH or postgresql://USER@HOST/DB.",
        ) from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def alembic_config(db: Database, connection: Connection | None = None) -> Config:
    """An Alembic configuration for ``db``, built in code (no alembic.ini needed).

    With ``connection`` the migrations run on it, so they see the same engine settings."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    config.set_main_option("version_locations", str(MIGRATIONS_DIR / "versions"))
    config.set_main_option(
        "sqlalchemy.url", db.url.render_as_string(hide_password=False).replace("%", "%%")
    )
    config.attributes["connection"] = connection
    config.attributes["configure_logger"] = False
    return config


def sqlite_in_memory(database: str | None) -> bool:
    """Whether a SQLite URL's database is in memory (no file to make or check)."""
    name = database or ""
    return name in ("", ":memory:") or name.startswith("file::memory:")


_POOL_EXHAUSTED = (
    f"no database connection came free within {POOL_TIMEOUT_S:g} s (the database is not answering)"
)


def _make_engine(url: URL, *, echo: bool) -> Engine:
    if url.get_backend_name() != "sqlite":
        connect_args: dict[str, Any] = {}
        if url.get_backend_name() == "postgresql":
            connect_args = {
                "connect_timeout": POSTGRES_CONNECT_TIMEOUT_S,
                "options": f"-c statement_timeout={POSTGRES_STATEMENT_TIMEOUT_MS}",
            }
        return create_engine(
            url,
            echo=echo,
            pool_pre_ping=True,
            pool_timeout=POOL_TIMEOUT_S,
            connect_args=connect_args,
        )
    database = url.database or ""
    in_memory = sqlite_in_memory(database)
    kwargs: dict[str, Any] = {
        "connect_args": {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
    }
    if in_memory:
        kwargs["poolclass"] = StaticPool
    else:
        _create_parent(Path(database))
    engine = create_engine(url, echo=echo, **kwargs)
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _create_parent(path: Path) -> None:
    try:
        path.expanduser().parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"cannot create the directory for the database file {path}: {exc.strerror}",
            hint="Set GPUBOT_DATA_DIR or GPUBOT_DATABASE_URL to a writable place.",
        ) from exc


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's own is deferred and late).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()


def _sqlite_on_begin(connection: Connection) -> None:
    read_only = connection.get_execution_options().get("gpubot_read_only", False)
    connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def _reason(exc: sa_exc.DBAPIError) -> str:
    original = getattr(exc, "orig", None)
    text = str(original if original is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
