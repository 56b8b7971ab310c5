"""What the store holds now, for the metrics' gauges: a fixed number of aggregate queries.

:func:`read_stats` makes six ``SELECT``s with ``GROUP BY`` or ``min``/``count``/``sum`` in one
short read, however many instances, releases, charges or messages there are; the database adds
up, the bot never loads a row per instance. :func:`ping` is the readiness check's round trip.
Both raise bot.errors.StoreError when the database fails.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import case, func, select, text
from sqlalchemy import exc as sa_exc
from sqlmodel import Session, col

from bot.errors import GpubotError, StoreError
from bot.metrics import RELEASE_STATES, StoreStats
from bot.providers.registry import PLATFORM_BILLING
from bot.store.db import Database
from bot.store.models import Charge, Instance, OutboxMessage, Prompt, Release

#: Releases the clock works on when their next attempt is due (as bot.services.instances.releases).
_OPEN_RELEASES = ("pending", "in_progress", "escalated", "awaiting_owner")


def read_stats(db: Database, now: datetime, *, tz: ZoneInfo, poll_interval_s: float) -> StoreStats:
    """The gauges' figures at ``now`` (naive UTC); the month of the charges is taken in
    ``tz``; a poll is late ``poll_interval_s`` seconds after the previous one. Raises
    StoreError."""
    try:
        with db.read_session() as session:
            return _read(session, now, tz=tz, poll_interval_s=poll_interval_s)
    except sa_exc.SQLAlchemyError as exc:
        raise StoreError(f"reading the metrics failed: {type(exc).__name__}") from exc


def ping(db: Database) -> None:
    """One round trip to the database. Raises StoreError when it fails."""
    try:
        with db.read_session() as session:
            session.execute(text("SELECT 1"))
    except sa_exc.SQLAlchemyError as exc:
        raise StoreError(f"the database failed: {type(exc).__name__}") from exc


def month_bounds(now: datetime, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """The calendar month in ``tz`` holding ``now`` (naive UTC), as ``[start, end)`` in naive
    UTC."""
    local = now.replace(tzinfo=UTC).astimezone(tz)
    year, month = local.year, local.month
    following = (year + 1, 1) if month == 12 else (year, month + 1)
    return _local_midnight_utc(year, month, tz), _local_midnight_utc(*following, tz)


def _read(session: Session, now: datetime, *, tz: ZoneInfo, poll_interval_s: float) -> StoreStats:
    instances, gpus, idle, oldest_poll = _instances(session)
    releases, release_due = _releases(session)
    pending, oldest_created, outbox_due = _outbox(session)
    lag = {
        "poll": _late(now, oldest_poll, poll_interval_s),
        "release": _late(now, release_due, 0),
        "prompt": _late(now, _oldest_prompt(session, now), 0),
        "outbox": _late(now, outbox_due, 0),
    }
    return StoreStats(
        instances=instances,
        gpus=gpus,
        gpus_idle=idle,
        spend_micros_per_hour=_spend_rate(session),
        charges_this_month_micros=_charges(session, *month_bounds(now, tz)),
        releases=releases,
        outbox_pending=pending,
        outbox_oldest_age_s=_late(now, oldest_created, 0),
        due_lag_s=lag,
    )


def _instances(
    session: Session,
) -> tuple[dict[tuple[str, str], int], dict[str, int], dict[str, int], datetime | None]:
    """Live instances by (state, provider); GPUs and idle GPUs of the active ones by provider;
    the last poll of the active instance polled longest ago (its registration if never)."""
    gpus = func.coalesce(col(Instance.delivered_gpu_count), col(Instance.gpu_count), 0)
    active = col(Instance.state) == "active"
    rows = session.execute(
        select(
            col(Instance.state),
            col(Instance.provider),
            func.count(),
            func.sum(case((active, gpus), else_=0)),
            func.sum(case((active & col(Instance.idle_since).is_not(None), gpus), else_=0)),
            func.min(func.coalesce(col(Instance.last_polled_at), col(Instance.created_at))),
        )
        .where(col(Instance.state) != "released")
        .group_by(col(Instance.state), col(Instance.provider))
    ).all()
    by_state: dict[tuple[str, str], int] = {}
    all_gpus: dict[str, int] = {}
    idle_gpus: dict[str, int] = {}
    polls: list[datetime] = []
    for state, provider, count, state_gpus, state_idle, oldest_poll in rows:
        by_state[(str(state), str(provider))] = int(count)
        if state != "active":
            continue
        all_gpus[str(provider)] = all_gpus.get(str(provider), 0) + int(state_gpus or 0)
        idle_gpus[str(provider)] = idle_gpus.get(str(provider), 0) + int(state_idle or 0)
        polled = _naive(oldest_poll)
        if polled is not None:
            polls.append(polled)
    return by_state, all_gpus, idle_gpus, min(polls, default=None)


def _spend_rate(session: Session) -> dict[str, int]:
    """Micros per hour of the compute that bills now (as bot.billing: started, neither stopped
    nor released), by currency."""
    gpu_count = func.coalesce(
        func.nullif(col(Instance.gpu_count), 0),
        func.nullif(col(Instance.delivered_gpu_count), 0),
        1,
    )
    hourly = case(
        (col(Instance.price_per) == "gpu_hour", col(Instance.price_micros) * gpu_count),
        else_=col(Instance.price_micros),
    )
    rows = session.execute(
        select(col(Instance.currency), func.sum(hourly))
        .where(
            col(Instance.state) != "released",
            col(Instance.stopped_at).is_(None),
            col(Instance.released_at).is_(None),
            _billing_started(),
        )
        .group_by(col(Instance.currency))
    ).all()
    return {str(currency): int(total or 0) for currency, total in rows}


def _billing_started() -> Any:
    """Billing has started: from creation, or from SSH-ready once it was; a rule the
    registration did not give is the platform's (bot.providers.registry.PLATFORM_BILLING)."""
    from_ssh = [name for name, rule in PLATFORM_BILLING.items() if rule.billing_from == "ssh_ready"]
    waits = func.coalesce(
        col(Instance.billing_from),
        case((col(Instance.provider).in_(from_ssh), "ssh_ready"), else_="created"),
    )
    return (waits != "ssh_ready") | col(Instance.ssh_ready_at).is_not(None)


def _charges(session: Session, start: datetime, end: datetime) -> dict[str, int]:
    rows = session.execute(
        select(col(Charge.currency), func.sum(col(Charge.amount_micros)))
        .where(col(Charge.start_at) >= start, col(Charge.start_at) < end)
        .group_by(col(Charge.currency))
    ).all()
    return {str(currency): int(total or 0) for currency, total in rows}


def _releases(session: Session) -> tuple[dict[str, int], datetime | None]:
    """Unconfirmed releases by state, and when the longest-due open one came due."""
    rows = session.execute(
        select(
            col(Release.state),
            func.count(),
            func.min(func.coalesce(col(Release.next_attempt_at), col(Release.requested_at))),
        )
        .where(col(Release.state).in_(RELEASE_STATES))
        .group_by(col(Release.state))
    ).all()
    counts = {str(state): int(count) for state, count, _ in rows}
    due = [_naive(at) for state, _, at in rows if state in _OPEN_RELEASES]
    return counts, min((at for at in due if at is not None), default=None)


def _outbox(session: Session) -> tuple[int, datetime | None, datetime | None]:
    """How many messages wait to be posted, when the oldest was queued, the earliest due."""
    row = session.execute(
        select(
            func.count(),
            func.min(col(OutboxMessage.created_at)),
            func.min(col(OutboxMessage.due_at)),
        ).where(col(OutboxMessage.delivery).is_(None))
    ).one()
    return int(row[0]), _naive(row[1]), _naive(row[2])


def _oldest_prompt(session: Session, now: datetime) -> datetime | None:
    """When the longest-due prompt still to be posted came due."""
    at = session.execute(
        select(func.min(col(Prompt.due_at))).where(
            col(Prompt.message_ts).is_(None),
            col(Prompt.delivery).is_(None),
            col(Prompt.resolved_at).is_(None),
            col(Prompt.due_at) <= now,
        )
    ).scalar()
    return _naive(at)


def _late(now: datetime, since: datetime | None, allowed_s: float) -> float:
    """Seconds past ``since + allowed_s`` at ``now``; 0 when not yet (or nothing is due)."""
    if since is None:
        return 0.0
    return max(0.0, (now - since).total_seconds() - allowed_s)


def _naive(value: Any) -> datetime | None:
    """A datetime from a query as naive UTC (SQLite hands back text for a min() of dates)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise StoreError(f"the database returned {value!r} where a time was expected")
    moment: datetime = value if value.tzinfo is None else value.astimezone(UTC)
    return moment.replace(tzinfo=None)


def _local_midnight_utc(year: int, month: int, tz: ZoneInfo) -> datetime:
    """Midnight on the 1st of ``year-month`` in ``tz``, as naive UTC (as
    bot.services.money.ledger)."""
    return datetime(year, month, 1, tzinfo=tz).astimezone(UTC).replace(tzinfo=None)


class CachedStats:
    """The store's gauges as last read, for ``/metrics``: refreshed by the clock after each
    tick (:meth:`refresh`), so a scrape touches no database. A scrape before the first reading
    starts one on a thread of its own and waits for it at most ``wait_s`` seconds; a reading
    older than ``max_age_s`` is not served (the store has not answered since). Thread-safe:
    one reading at a time, never two."""

    def __init__(
        self,
        read: Callable[[], StoreStats],
        *,
        max_age_s: float,
        wait_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self.max_age_s = max_age_s
        self.wait_s = wait_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: tuple[float, StoreStats] | None = None
        self._error: str | None = None
        self._reading: threading.Event | None = None

    def refresh(self) -> None:
        """Read the gauges now (the clock's thread); a reading under way is not doubled.
        Never raises: a failure is kept and said by :meth:`stats`."""
        with self._lock:
            if self._reading is not None:
                return
            done = self._reading = threading.Event()
        try:
            stats = self._read()
        except GpubotError as exc:
            with self._lock:
                self._error = str(exc)
        else:
            with self._lock:
                self._last, self._error = (self._clock(), stats), None
        finally:
            with self._lock:
                self._reading = None
            done.set()

    def stats(self) -> StoreStats:
        """The last reading while it is fresh. Raises StoreError when there is none fresh: the
        first reading did not come within ``wait_s``, or the store has not answered for
        ``max_age_s``."""
        with self._lock:
            last, reading = self._last, self._reading
        if last is None:
            if reading is None:
                threading.Thread(target=self.refresh, name="store-gauges", daemon=True).start()
                time.sleep(0)  # let it begin
                with self._lock:
                    reading = self._reading
            if reading is not None:
                reading.wait(self.wait_s)
            with self._lock:
                last = self._last
        if last is None:
            raise StoreError(self._error or f"the store did not answer within {self.wait_s:g} s")
        age_s = self._clock() - last[0]
        if age_s > self.max_age_s:
            raise StoreError(
                f"the store's gauges are {age_s:.0f} s old: the store has not answered since"
                + (f" ({self._error})" if self._error else "")
            )
        return last[1]
