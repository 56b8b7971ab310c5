"""Replay protection for Slack's signed HTTP requests.

Slack signs each request with ``X-Slack-Signature`` over its timestamp and body, and Bolt accepts
a signature for five minutes either side of its timestamp. Within that window a captured request
could be sent again; :class:`ReplayGuard` remembers the signatures already accepted so that the
same request never runs its listener twice.

A replay is answered ``200`` with an empty body and its listener does not run: an empty 200 is
what Slack expects of a request it need not send again, so nothing keeps retrying it, and the
sender learns nothing. Slack's own retries (``X-Slack-Retry-Num``) are new requests with a new
timestamp and signature, so they are not replays here. Requests without a signature (Socket
Mode, which Bolt does not verify) pass untouched.

With a store (``db``), the store decides: the signature is inserted into ``seen_signature``
with ``ON CONFLICT DO NOTHING`` and only the process whose row went in runs the request, so two
processes on one database apply a request once, with no read-then-write race. The in-process
memory stays as a fast first check. Expired rows are pruned in bounded batches. A timestamp
more than :data:`FUTURE_SKEW_S` ahead of the clock is refused 401 (Slack's signing scheme:
https://api.slack.com/authentication/verifying-requests-from-slack).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from slack_bolt import BoltRequest, BoltResponse
from slack_bolt.middleware import Middleware
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlmodel import SQLModel

from bot.errors import StoreError
from bot.store.models import SeenSignature

if TYPE_CHECKING:
    from bot.store.db import Database

log = logging.getLogger(__name__)

#: How far a request's timestamp may be from now for Bolt to accept its signature (seconds).
SIGNATURE_WINDOW_S = 5 * 60
#: How much longer than the window a signature is remembered (clock skew, slow requests).
MARGIN_S = 60
#: The most signatures remembered; past it the oldest are forgotten first.
MAX_ENTRIES = 100_000
_TABLE: Any = SQLModel.metadata.tables[SeenSignature.__tablename__]

#: How far ahead of the clock a request's timestamp may be (seconds).
FUTURE_SKEW_S = 30
#: Seconds between two prunings of expired rows by one process.
PRUNE_EVERY_S = 60.0
#: The most expired rows one pruning deletes.
PRUNE_BATCH = 500


class ReplayGuard(Middleware):
    """A Bolt middleware that lets each verified signature through once.

    Register it after Bolt's request verification (``app.use`` does), so that only requests
    with a valid signature are remembered. Memory is bounded: an entry is dropped once its
    request's window plus :data:`MARGIN_S` has passed, and beyond ``max_entries`` the oldest
    go first. Safe to use from many threads at once."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        max_entries: int = MAX_ENTRIES,
        window_s: float = SIGNATURE_WINDOW_S,
        margin_s: float = MARGIN_S,
        db: Database | None = None,
        prune_every_s: float = PRUNE_EVERY_S,
        prune_batch: int = PRUNE_BATCH,
    ) -> None:
        if max_entries < 1 or prune_batch < 1:
            raise ValueError("max_entries and prune_batch must be at least 1")
        self._clock = clock
        self._db = db
        self._prune_every_s = prune_every_s
        self._prune_batch = prune_batch
        self._next_prune = clock()
        self._pruning = threading.Lock()
        self._max_entries = max_entries
        self._keep_s = window_s + margin_s
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)

    def first_time(self, signature: str, timestamp: str | None) -> bool:
        """Remember ``signature``; True when it was not already remembered (and unexpired).

        ``timestamp`` is the request's ``X-Slack-Request-Timestamp``; the signature is kept
        until that time (or now, when later) plus the window and the margin. With a store,
        the store decides. Raises StoreError when the store fails."""
        now = self._clock()
        stamp = _seconds(timestamp, default=now)
        keep_until = max(stamp, now) + self._keep_s
        with self._lock:
            self._drop_expired(now)
            expires_at = self._seen.get(signature)
            if expires_at is not None and expires_at > now:
                return False
            self._seen.pop(signature, None)
            self._seen[signature] = keep_until
            while len(self._seen) > self._max_entries:
                self._seen.popitem(last=False)
        if self._db is None:
            return True
        first = self._claim(self._db, signature, keep_until)
        self._prune_when_due(self._db, now)
        return first

    def prune(self, db: Database, now: float) -> int:
        """Delete at most ``prune_batch`` rows expired at ``now`` (epoch seconds); how many
        went. Raises StoreError when the database fails."""
        table = _TABLE
        expired = (
            select(table.c.signature)
            .where(table.c.expires_at <= _utc(now))
            .limit(self._prune_batch)
            .scalar_subquery()
        )
        with db.session() as session:
            result: Any = session.execute(delete(table).where(table.c.signature.in_(expired)))
            return int(result.rowcount or 0)

    def _claim(self, db: Database, signature: str, keep_until: float) -> bool:
        """Insert ``signature`` unless a row has it; True when this insert went in. Raises
        StoreError when the database fails."""
        table = _TABLE
        values = {"signature": signature, "expires_at": _utc(keep_until)}
        dialect = db.engine.dialect.name
        if dialect in ("postgresql", "sqlite"):
            make = postgresql_insert if dialect == "postgresql" else sqlite_insert
            statement = (
                make(table).values(values).on_conflict_do_nothing().returning(table.c.signature)
            )
            with db.session() as session:
                return session.execute(statement).first() is not None
        try:
            with db.session() as session:
                session.execute(table.insert().values(values))
        except IntegrityError:
            return False
        return True

    def _prune_when_due(self, db: Database, now: float) -> None:
        if now < self._next_prune or not self._pruning.acquire(blocking=False):
            return
        try:
            self._next_prune = now + self._prune_every_s
            self.prune(db, now)
        except StoreError as exc:
            log.warning("could not prune expired request signatures: %s", exc)
        finally:
            self._pruning.release()

    def process(
        self,
        *,
        req: BoltRequest,
        resp: BoltResponse,
        next: Callable[[], BoltResponse],
    ) -> BoltResponse | None:
        """Answer a replayed signature with an empty 200, a timestamp too far ahead 401 and a
        store that cannot be asked 503; anything else goes on."""
        signature = _header(req, "x-slack-signature")
        if not signature:
            return next()
        stamp = _header(req, "x-slack-request-timestamp")
        if _seconds(stamp, default=0.0) > self._clock() + FUTURE_SKEW_S:
            log.info("refused a signed request whose timestamp %s is in the future", stamp)
            return BoltResponse(status=401, body="")
        try:
            first = self.first_time(signature, stamp)
        except StoreError as exc:
            log.warning("could not check a signed request against the store: %s", exc)
            return BoltResponse(status=503, body="")
        if first:
            return next()
        log.warning(
            "a signed request was sent again (timestamp %s); answered without running it",
            _header(req, "x-slack-request-timestamp"),
        )
        return BoltResponse(status=200, body="")

    def _drop_expired(self, now: float) -> None:
        # Entries are in the order they were accepted; expiries follow it closely enough that
        # dropping from the front keeps memory near the live set (lookups check expiry anyway).
        while self._seen:
            oldest, expires_at = next(iter(self._seen.items()))
            if expires_at > now:
                return
            del self._seen[oldest]


def _header(req: BoltRequest, name: str) -> str | None:
    values = req.headers.get(name)
    return values[0] if values else None


def _seconds(timestamp: str | None, *, default: float) -> float:
    try:
        seconds = float(timestamp) if timestamp is not None else default
    except ValueError:
        return default
    return seconds if math.isfinite(seconds) and abs(seconds) < 1e11 else default


def _utc(epoch_s: float) -> datetime:
    """Epoch seconds as a naive UTC datetime, as the store keeps times."""
    return datetime.fromtimestamp(epoch_s, UTC).replace(tzinfo=None)
