"""The ledger: what each instance owes, as Charge rows over hourly buckets.

Buckets are aligned to UTC hours and also split at the first moment of each month in the
configured time zone, so a month's spend is exactly the sum of the charges that start in it
(zones with half-hour offsets included).

Each charge is the difference between what the billing session owes at the bucket's end and what
is already charged, so buckets always add up to the session's cost (see bot.billing):

- a running session is charged only for complete buckets, at the metered price (no increment
  rounding yet); the bucket that holds ``now`` is left for a later run;
- when compute stops (stop or release) the last bucket ends there and carries the rest: the
  rounding up to the increment and any minimum charge of the session;
- storage is charged the same way, from creation until the disk is deleted.

Runs are idempotent: a bucket starts where the last charge ended and ``(instance, kind,
start_at)`` is unique, so running twice, from two processes at once, or after a crash never
charges twice and never skips a bucket.

Each compute charge carries its bucket's GPU-samples (idle, in use, not measured: see
bot.services.money.samples) as they stood when it was written, and reports split its amount in
proportion, in integer micro-units (:func:`split_compute`): idle and not measured rounded down,
in use the rest, so the three add up to the charge exactly.

Work is done in slices that resume where they stopped, whatever process does the next one:
an instance is charged at most ``SLICE_BUCKETS`` buckets of each kind per pass and a
transaction writes about ``BATCH_CHARGES`` charges at most; an instance with buckets left
stays due (its ledger state is the cursor), and :func:`accrue` with a time box takes no new
batch once the next one would not fit. The charges are the same however the work is sliced.
On PostgreSQL each batch locks its instances' rows (``FOR UPDATE SKIP LOCKED``), so two
processes share the due instances rather than racing for them.

The spend summary (SpendDay) holds a month's charges summed per instance and local day, for a
zone and an idle threshold, once a report asked for the month or the tick reached its start
(:func:`build_summary`, marked by a SpendMonth row). A summary is built in short committed
transactions, one range of instance ids each (INSERT ... SELECT over their charges in the
month), sized to take about ``SUMMARY_CHUNK_S``; the marker's ``summed_to_id`` says how far it
got, so a build resumes where it stopped and any other writer waits at most one range (on
SQLite, whose waiting writers poll for the lock, the build leaves it free as long again
between ranges). The
ledger adds every charge it writes to the summaries of its month in the configured zone,
whatever their threshold, for the instances already summed up, in the same transaction (a
charge that clashes rolls back with its summary); the build sums up the others from their
charges. It drops the summaries of other zones its charges fall in, to be built again when
asked: reports read only whole summaries, never stale sums.
On PostgreSQL each range of a build holds an advisory lock exclusively and the ledger holds it
shared while it reads how far each summary got, so that no charge is committed between the two
unseen (SQLite's writers queue up already).

Why one module of this size: it is the only writer of Charge rows. Buckets, the increments and
minimums of each session, adjustments for what is learnt later, slices and the summaries'
ranges must agree to the micro-unit, and keeping every write of a charge in one module is how
that is read and reviewed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from sqlalchemy import (
    Date,
    Float,
    Integer,
    String,
    and_,
    case,
    cast,
    delete,
    func,
    insert,
    literal,
    literal_column,
    or_,
    tuple_,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy import select as sql_select
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from bot import billing, timebox
from bot.providers.registry import platform_billing
from bot.store.models import Charge, Instance, LedgerState, SpendDay, SpendMonth, UtilHour
from bot.timebox import Timebox

if TYPE_CHECKING:
    from bot.runtime import Runtime
    from bot.store.db import Database

log = logging.getLogger(__name__)

#: Instances charged per transaction when many are due at once (the hour's turn).
ACCRUE_BATCH = 250
#: A transaction takes no further instance once it holds this many charges.
BATCH_CHARGES = 400
#: With a time box, no batch is begun unless this many times the longest so far is left, and
#: at least this share of the box (a loaded machine makes one batch slower than the last).
BATCH_MARGIN = 2.0
BATCH_FLOOR = 0.2
#: Buckets of one kind charged per instance and pass: a long catch-up goes in slices.
SLICE_BUCKETS = 24
#: Seconds one range of a summary build should take (the longest a writer waits for it).
SUMMARY_CHUNK_S = 0.025
#: Instance ids per range of a summary build, at first and at most (adapted to the time taken).
SUMMARY_CHUNK_IDS = 4
SUMMARY_CHUNK_IDS_MAX = 4096
#: Buckets whose polls are read per query when charges are written.
POLLS_CHUNK = 1000

COMPUTE = "compute"
STORAGE = "storage"
EGRESS = "egress"

#: The PostgreSQL advisory lock that orders summary builds against the ledger's writes.
SUMMARY_LOCK_ID = 0x67707573
#: SpendDay's sums, in the order :func:`charge_sums` gives them.
SUMMARY_SUMS = ("compute_micros", "other_micros", "idle_micros", "compute_s", "unmeasured_micros")
_EPOCH = date(1970, 1, 1)
_DAY_S = 86_400

#: Cumulative (billed seconds, micros) owed after a number of session seconds.
_Totals = Callable[[int], tuple[int, int]]


@dataclass(frozen=True)
class KindState:
    """What the ledger holds for one instance and kind: where the last charge ended, and the
    totals charged so far (micros, billed seconds)."""

    last_end_at: datetime | None = None
    charged_micros: int = 0
    billed_s: int = 0


@dataclass(frozen=True)
class PlannedCharge:
    """A charge to write: ``[start_at, end_at)`` in naive UTC."""

    kind: str
    start_at: datetime
    end_at: datetime
    billed_s: int
    amount_micros: int


def accrue(db: Database, now: datetime, tz: ZoneInfo, *, box: Timebox | None = None) -> int:
    """Write the charges that are due up to ``now``; returns how many.

    One query finds the instances with something due (their ``ledger_due_at`` has come, or
    they were stopped or released since the ledger last looked), those looked at longest ago
    first; they are charged in batches of ``ACCRUE_BATCH`` per transaction (fewer when a batch
    reaches ``BATCH_CHARGES``), at most ``SLICE_BUCKETS`` buckets of a kind per instance and
    pass, passes repeated while an instance has buckets left. With ``box`` no batch is begun
    that would not fit in what is left of it (``BATCH_MARGIN`` times the longest so far, and
    ``BATCH_FLOOR`` of the box): the rest stays due, for the next call. A batch that clashes
    with another process writing the same buckets is redone one instance at a time, skipping
    what the other process wrote. Raises StoreError when the database fails.
    """
    written = 0
    longest_s = 0.0
    while True:
        due = _due_instances(db, now)
        unfinished = False
        for start in range(0, len(due), ACCRUE_BATCH):
            if box is not None and box.left_s() < max(
                BATCH_MARGIN * longest_s, BATCH_FLOOR * box.budget_s
            ):
                return written
            began = timebox.monotonic()
            batch = due[start : start + ACCRUE_BATCH]
            try:
                count, left = _accrue_batch(db, batch, now, tz, only_due=True)
            except sa_exc.IntegrityError:
                log.info("ledger: a batch was charged concurrently; charging it one by one")
                count, left = 0, False
                for instance_id in batch:
                    one, rest = _accrue_one(db, instance_id, now, tz, only_due=True)
                    count, left = count + one, left or rest
            written += count
            unfinished = unfinished or left
            longest_s = max(longest_s, timebox.monotonic() - began)
        if not unfinished:
            return written


def accrue_instance(db: Database, instance_id: int, now: datetime, tz: ZoneInfo) -> int:
    """Write every charge due up to ``now`` for one instance (call it after a stop or release
    to finalise at once), slice after slice; returns how many were written. Raises StoreError
    when the database fails.
    """
    written = 0
    while True:
        count, left = _accrue_one(db, instance_id, now, tz, only_due=False)
        written += count
        if not left:
            return written


def _accrue_one(
    db: Database, instance_id: int, now: datetime, tz: ZoneInfo, *, only_due: bool
) -> tuple[int, bool]:
    """One slice of one instance's charges: (how many written, whether buckets are left)."""
    try:
        return _accrue_batch(db, [instance_id], now, tz, only_due=only_due)
    except sa_exc.IntegrityError:
        # Another process wrote these buckets first; the next run continues from theirs.
        log.info("ledger: instance %s was charged concurrently; skipped", instance_id)
        return 0, False


def _due_instances(db: Database, now: datetime) -> list[int]:
    """The instances with something due at ``now``, those looked at longest ago (or never)
    first, then by id."""
    with db.session() as session:
        rows = session.exec(
            select(Instance.id, Instance.ledger_checked_at).where(due_clause(now))
        ).all()
    never = datetime.min
    ordered = sorted(
        (checked or never, int(instance_id)) for instance_id, checked in rows if instance_id
    )
    return [instance_id for _, instance_id in ordered]


def plan_charges(
    instance: Instance,
    states: dict[str, KindState],
    now: datetime,
    tz: ZoneInfo,
    *,
    close_at: datetime | None = None,
) -> list[PlannedCharge]:
    """The charges due for ``instance`` up to ``now`` given what is already charged. Pure.

    ``close_at`` (at most ``now``) charges running sessions up to that moment, not only to the
    last complete bucket: done before the billing rules change, so what was used is charged
    under the rules it was used under."""
    return plan_slice(instance, states, now, tz, close_at=close_at)[0]


def plan_slice(
    instance: Instance,
    states: dict[str, KindState],
    now: datetime,
    tz: ZoneInfo,
    *,
    close_at: datetime | None = None,
    max_buckets: int | None = None,
) -> tuple[list[PlannedCharge], bool]:
    """As :func:`plan_charges`, at most ``max_buckets`` buckets of each kind; also whether
    buckets are left for a later slice (the charges of the slices add up to those planned in
    one go). Pure."""
    platform = platform_billing(instance.provider)
    rules = billing.rules_for(instance, platform)
    planned: list[PlannedCharge] = []
    left = False
    start = billing.billing_start(instance, platform)
    if start is not None and (rules.hourly_micros > 0 or instance.compute_carried_micros > 0):
        charges, rest = _plan_kind(
            COMPUTE,
            start,
            billing.compute_end(instance),
            states.get(COMPUTE, KindState()),
            now,
            tz,
            running=lambda seconds: billing.compute_totals(
                instance, platform, seconds, final=False
            ),
            final=lambda seconds: billing.compute_totals(instance, platform, seconds, final=True),
            close_at=close_at,
            max_buckets=max_buckets,
        )
        planned, left = planned + charges, left or rest
    storage_priced = rules.disk_mb > 0 and rules.storage_micros_per_gb_month > 0
    if storage_priced or instance.storage_carried_micros > 0:
        charges, rest = _plan_kind(
            STORAGE,
            instance.created_at,
            billing.storage_end(instance),
            states.get(STORAGE, KindState()),
            now,
            tz,
            running=lambda seconds: billing.storage_totals(instance, seconds),
            final=lambda seconds: billing.storage_totals(instance, seconds),
            close_at=close_at,
            max_buckets=max_buckets,
        )
        planned, left = planned + charges, left or rest
    return planned, left


def close_charges(session: Session, instance: Instance, at: datetime, tz: ZoneInfo) -> int:
    """Write the instance's charges up to ``at`` in ``session`` (before its billing rules
    change there); returns how many. A bucket another process wrote first raises
    IntegrityError when the session flushes: the caller's change should then be tried again."""
    assert instance.id is not None
    states = _load_states(session, [instance.id]).get(instance.id, {})
    planned = plan_charges(instance, _kind_states(states), at, tz, close_at=at)
    polls = _bucket_polls(session, [(instance, planned)])
    _insert(session, _apply(session, instance, planned, states, polls, at, tz), tz)
    session.flush()
    return len(planned)


def next_boundary(at: datetime, tz: ZoneInfo) -> datetime:
    """The first bucket boundary after ``at`` (naive UTC): the next UTC hour, or the start of
    the next month in ``tz`` when that comes first."""
    next_hour = at.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    local = at.replace(tzinfo=UTC).astimezone(tz)
    year, month = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
    return min(next_hour, month_start_utc(year, month, tz))


def month_start_utc(year: int, month: int, tz: ZoneInfo) -> datetime:
    """Midnight on the 1st of ``year-month`` in ``tz``, as naive UTC."""
    local = datetime(year, month, 1, tzinfo=tz)
    return local.astimezone(UTC).replace(tzinfo=None)


def month_bounds(month: str, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """``YYYY-MM`` as ``[start, end)`` in naive UTC, the month taken in ``tz``.

    Raises ValueError for text that is not a month (callers turn it into a UsageError).
    """
    year, number = parse_month(month)
    following = (year + 1, 1) if number == 12 else (year, number + 1)
    return month_start_utc(year, number, tz), month_start_utc(*following, tz)


def parse_month(month: str) -> tuple[int, int]:
    """``YYYY-MM`` as (year, month). Raises ValueError for anything else."""
    parts = month.strip().split("-")
    if len(parts) != 2 or len(parts[0]) != 4 or len(parts[1]) != 2:
        raise ValueError(f"{month!r} is not YYYY-MM")
    year, number = int(parts[0]), int(parts[1])
    if not 1 <= number <= 12 or year < 2000:
        raise ValueError(f"{month!r} is not YYYY-MM")
    return year, number


def month_of(at: datetime, tz: ZoneInfo) -> str:
    """The ``YYYY-MM`` in ``tz`` of a naive UTC moment."""
    local = at.replace(tzinfo=UTC).astimezone(tz)
    return f"{local.year:04d}-{local.month:02d}"


def previous_month(month: str) -> str:
    """The month before ``YYYY-MM``."""
    year, number = parse_month(month)
    return f"{year - 1}-12" if number == 1 else f"{year:04d}-{number - 1:02d}"


def next_month(month: str) -> str:
    """The month after ``YYYY-MM``."""
    year, number = parse_month(month)
    return f"{year + 1}-01" if number == 12 else f"{year:04d}-{number + 1:02d}"


def charged_micros(session: Session, instance_ids: Iterable[int]) -> dict[int, int]:
    """Total charged so far per instance (all kinds, all months), from the ledger states."""
    ids = list(instance_ids)
    if not ids:
        return {}
    rows = session.exec(
        select(LedgerState.instance_id, func.sum(LedgerState.charged_micros))
        .where(col(LedgerState.instance_id).in_(ids))
        .group_by(col(LedgerState.instance_id))
    ).all()
    return {instance_id: int(total or 0) for instance_id, total in rows}


def month_charged_micros(session: Session, month: str, tz: ZoneInfo) -> dict[int, int]:
    """What the charges starting in ``month`` (``YYYY-MM`` in ``tz``) add up to per instance,
    for the instances whose latest charge is in that month (the current month, once the
    ledger has run): from the ledger states, in one indexed query. States written before the
    ledger kept months (``month`` empty) are added up from their charges."""
    rows = session.exec(
        select(LedgerState.instance_id, func.sum(LedgerState.month_micros))
        .where(LedgerState.month == month)
        .group_by(col(LedgerState.instance_id))
    ).all()
    totals = {instance_id: int(total or 0) for instance_id, total in rows}
    start, end = month_bounds(month, tz)
    unknown = select(LedgerState.instance_id).where(LedgerState.month == "")
    for instance_id, total in session.exec(
        select(Charge.instance_id, func.sum(Charge.amount_micros))
        .where(
            col(Charge.instance_id).in_(unknown), Charge.start_at >= start, Charge.start_at < end
        )
        .group_by(col(Charge.instance_id))
    ).all():
        totals[instance_id] = totals.get(instance_id, 0) + int(total or 0)
    return totals


def zone_name(tz: ZoneInfo) -> str:
    """The name the spend summaries of ``tz`` are kept under."""
    return str(tz.key)


def local_day(at: datetime, tz: ZoneInfo) -> int:
    """The day in ``tz`` of the naive UTC moment ``at``, as days since 1970-01-01."""
    return (at.replace(tzinfo=UTC).astimezone(tz).date() - _EPOCH).days


def day_date(day: int) -> date:
    """A :func:`local_day` number as a date."""
    return _EPOCH + timedelta(days=day)


def compute_weights(row: dict[str, Any], threshold_pct: float) -> tuple[int, int, int]:
    """The shares (idle, in use, not measured) a compute charge row is split in: its bucket's
    GPU-samples (bot.services.money.samples); for a charge written before they were counted, its
    polls (the failed ones not measured, the rest idle when the highest reading is under
    ``threshold_pct``, else in use); a bucket without a poll is wholly not measured."""
    idle, busy, unmeasured = (
        int(row.get(name) or 0)
        for name in ("idle_gpu_samples", "busy_gpu_samples", "unmeasured_gpu_samples")
    )
    if idle + busy + unmeasured > 0:
        return idle, busy, unmeasured
    polls, bad, peak = int(row["polls"] or 0), int(row["bad_polls"] or 0), row["max_util_pct"]
    if polls <= 0:
        return 0, 0, 1
    good = polls - bad
    quiet = good if good > 0 and peak is not None and peak < threshold_pct else 0
    return quiet, good - quiet, bad


def split_compute(amount_micros: int, weights: tuple[int, int, int]) -> tuple[int, int, int]:
    """``amount_micros`` shared out as (idle, in use, not measured) in proportion to
    ``weights``: idle and not measured rounded down to the micro-unit, in use the rest, so the
    three add up to the amount exactly."""
    idle_w, _, unmeasured_w = weights
    whole = sum(weights)
    idle = amount_micros * idle_w // whole
    unmeasured = amount_micros * unmeasured_w // whole
    return idle, amount_micros - idle - unmeasured, unmeasured


def charge_sums(row: dict[str, Any], threshold_pct: float) -> tuple[int, ...]:
    """What one charge row (as :func:`_charge_row` writes it) adds to :data:`SUMMARY_SUMS`:
    compute, other kinds' and idle micros, compute seconds, not measured micros (compute split
    by :func:`split_compute` in :func:`compute_weights`; in use is the rest of compute)."""
    amount = int(row["amount_micros"])
    if row["kind"] != COMPUTE:
        return (0, amount, 0, 0, 0)
    idle, _, unmeasured = split_compute(amount, compute_weights(row, threshold_pct))
    return (amount, 0, idle, int(row["billed_s"]), unmeasured)


def summary_clause(month: str, tz: ZoneInfo, threshold_pct: float) -> Any:
    """The SpendDay rows of ``month`` in ``tz`` under ``threshold_pct``."""
    return and_(
        col(SpendDay.zone) == zone_name(tz),
        col(SpendDay.threshold_pct) == threshold_pct,
        col(SpendDay.month) == month,
    )


def summary_ready(session: Session, month: str, tz: ZoneInfo, threshold_pct: float) -> bool:
    """Whether ``month`` (``YYYY-MM`` in ``tz``) is summed up whole under ``threshold_pct``."""
    key = (zone_name(tz), threshold_pct, month)
    marker = session.get(SpendMonth, key)
    return marker is not None and marker.summed_to_id is None


def ensure_summary(
    db: Database, month: str, tz: ZoneInfo, threshold_pct: float, *, box: Timebox | None = None
) -> bool:
    """Build ``month``'s summary (:func:`build_summary`) unless it is whole: one primary-key
    read when it is. Returns whether it is whole now (with ``box``, a build may stop before).
    Raises StoreError when the database fails."""
    with db.read_session() as session:
        ready = summary_ready(session, month, tz, threshold_pct)
    return ready or build_summary(db, month, tz, threshold_pct, box=box)


def build_summary(
    db: Database, month: str, tz: ZoneInfo, threshold_pct: float, *, box: Timebox | None = None
) -> bool:
    """Sum up ``month``'s charges per instance and local day in ``tz`` under ``threshold_pct``
    and mark the month summed up, unless it already is; the ledger keeps it up to date from
    then on. Works in committed transactions of one range of instance ids each (one INSERT ...
    SELECT ... GROUP BY over their charges in the month), about ``SUMMARY_CHUNK_S`` long, and
    goes on from where any earlier build stopped; with ``box`` it takes no new range once less
    than two ranges' time is left. Returns whether the summary is whole (False also when it
    was dropped under way: the zone changed). Raises StoreError when the database fails."""
    zone = zone_name(tz)
    start, end = month_bounds(month, tz)
    dialect = db.engine.dialect.name
    day = _local_day_sql(dialect, start, end, tz)
    sums = list(zip(SUMMARY_SUMS, _charge_sums_sql(threshold_pct), strict=True))
    key = (zone, threshold_pct, month)
    with db.session() as session:
        _lock_summaries(session, exclusive=True)
        marker = session.get(SpendMonth, key)
        if marker is None:
            session.execute(delete(SpendDay).where(summary_clause(month, tz, threshold_pct)))
            session.add(
                SpendMonth(zone=zone, threshold_pct=threshold_pct, month=month, summed_to_id=0)
            )
        elif marker.summed_to_id is None:
            return True
    with db.read_session() as session:
        last_id = session.exec(select(func.max(Instance.id))).one() or 0
    width = SUMMARY_CHUNK_IDS
    while box is None or box.left_s() > 2 * SUMMARY_CHUNK_S:
        began = timebox.monotonic()
        began_real = time.perf_counter()
        with db.session() as session:
            _lock_summaries(session, exclusive=True)
            marker = session.get(SpendMonth, key)
            if marker is None:
                return False
            after = marker.summed_to_id
            if after is None:
                return True
            upto = after + width
            ids = col(Charge.instance_id) > after
            whole = upto >= last_id  # the last range takes every id beyond, new ones too
            if not whole:
                ids = and_(ids, col(Charge.instance_id) <= upto)
            per_charge = sql_select(
                col(Charge.instance_id).label("instance_id"),
                day.label("day"),
                *(expr.label(name) for name, expr in sums),
            ).where(ids, col(Charge.start_at) >= start, col(Charge.start_at) < end)
            c = per_charge.subquery().c
            summed = sql_select(
                literal(zone, String),
                literal(threshold_pct, Float),
                literal(month, String),
                c.instance_id,
                c.day,
                *(func.sum(c[name]) for name, _ in sums),
            ).group_by(c.instance_id, c.day)
            names = ["zone", "threshold_pct", "month", "instance_id", "day", *SUMMARY_SUMS]
            session.execute(insert(SpendDay).from_select(names, summed))
            marker.summed_to_id = None if whole else upto
            session.add(marker)
        if whole:
            return True
        took_s = timebox.monotonic() - began
        scale = min(max(SUMMARY_CHUNK_S / max(took_s, 1e-6), 0.5), 2.0)
        width = min(max(int(width * scale), 1), SUMMARY_CHUNK_IDS_MAX)
        if dialect == "sqlite":
            # SQLite's waiting writers poll for the lock, backing off: leave it free a while,
            # or back-to-back ranges would keep them out until the build is done.
            time.sleep(min(time.perf_counter() - began_real, SUMMARY_CHUNK_S))
    return False


def unaccrued_micros(instance: Instance, charged: int, now: datetime) -> int:
    """What the instance owes at ``now`` beyond its charges (the open bucket, and the rounding
    a release now would add)."""
    return max(0, billing.cost_so_far(instance, platform_billing(instance.provider), now) - charged)


def bucket_start(instance: Instance, at: datetime, tz: ZoneInfo) -> datetime:
    """The start of the compute charge that holds ``at``: the last bucket boundary at or before
    it, not before billing starts (the hour when billing has not started by then)."""
    start = billing.billing_start(instance, platform_billing(instance.provider))
    if start is None or start > at:
        return at.replace(minute=0, second=0, microsecond=0)
    return _last_boundary(start, at, tz)


def ledger_tick(rt: Runtime, now: datetime, *, box: Timebox | None = None) -> None:
    """Tick hook: accrue the charges that are due, then keep this month summed up under the
    configured idle threshold (built when it is not, at the month's start while it is small: a
    report then never has to). With ``box`` both stop where it is spent and the next tick goes
    on from there."""
    tz = rt.settings.tz()
    accrue(rt.db, now, tz, box=box)
    ensure_summary(rt.db, month_of(now, tz), tz, rt.settings.idle_threshold_pct, box=box)


def due_clause(now: datetime) -> Any:
    """Instances the ledger must look at: not settled, and due by their schedule, never looked
    at, or released since (each an indexed range). A stop or a deleted disk is charged at the
    next bucket boundary, or at once by the caller (:func:`accrue_instance`)."""
    unsettled = col(Instance.ledger_settled).is_(False)
    return or_(
        and_(unsettled, col(Instance.ledger_due_at) <= now),
        and_(unsettled, col(Instance.ledger_due_at).is_(None)),
        and_(unsettled, col(Instance.released_at).is_not(None)),
    )


def _accrue_batch(
    db: Database, instance_ids: list[int], now: datetime, tz: ZoneInfo, *, only_due: bool
) -> tuple[int, bool]:
    """Charge ``instance_ids`` up to ``now`` in one transaction, at most ``SLICE_BUCKETS`` of a
    kind each and no further instance once ``BATCH_CHARGES`` are planned, with one query for
    their states, one for their buckets' polls and one INSERT for all their charges. With
    ``only_due`` an instance no longer due (another process charged it) is left out; on
    PostgreSQL so is one another process holds. Returns how many charges were written and
    whether work is left (buckets, or instances not taken). Raises IntegrityError when another
    process wrote a bucket first."""
    with db.session() as session:
        query = select(Instance).where(col(Instance.id).in_(instance_ids))
        if only_due:
            query = query.where(due_clause(now))
        if session.get_bind().dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True)
        instances = session.exec(query.order_by(col(Instance.id))).all()
        by_id = {instance.id: instance for instance in instances}
        states = _load_states(session, instance_ids)
        plans: list[tuple[Instance, list[PlannedCharge], bool]] = []
        planned_count = 0
        left = False
        for instance_id in instance_ids:
            instance = by_id.get(instance_id)
            if instance is None:
                continue
            if planned_count >= BATCH_CHARGES:
                left = True  # still due: the next batch or pass takes it
                continue
            known = _kind_states(states.get(instance_id, {}))
            planned, rest = plan_slice(instance, known, now, tz, max_buckets=SLICE_BUCKETS)
            plans.append((instance, planned, rest))
            planned_count += len(planned)
            left = left or rest
        polls = _bucket_polls(session, [(instance, planned) for instance, planned, _ in plans])
        rows: list[dict[str, Any]] = []
        for instance, planned, rest in plans:
            assert instance.id is not None
            mine = states.setdefault(instance.id, {})
            rows += _apply(session, instance, planned, mine, polls, now, tz)
            _schedule(instance, now, tz, unfinished=rest)
        _insert(session, rows, tz)
        session.flush()
    return len(rows), left


def _schedule(instance: Instance, now: datetime, tz: ZoneInfo, *, unfinished: bool) -> None:
    """After charging up to ``now`` (``unfinished``: a slice of it, buckets are left): an
    instance with buckets left stays due; a released instance is settled (every charge
    written); one whose billing has not started is looked at again on every run; any other is
    next due at the next bucket boundary."""
    instance.ledger_checked_at = now
    if unfinished:
        instance.ledger_due_at = now
        return
    if instance.released_at is not None and instance.released_at <= now:
        instance.ledger_settled = True
        instance.ledger_due_at = None
        return
    if billing.billing_start(instance, platform_billing(instance.provider)) is None:
        instance.ledger_due_at = None
        return
    instance.ledger_due_at = next_boundary(now, tz)


def _apply(
    session: Session,
    instance: Instance,
    planned: list[PlannedCharge],
    states: dict[str, LedgerState],
    polls: dict[tuple[int, datetime], UtilHour],
    now: datetime,
    tz: ZoneInfo,
) -> list[dict[str, Any]]:
    """Bring the instance's ledger states up to date with ``planned`` and return its charge
    rows, each compute charge with its bucket's polls, for :func:`_insert`."""
    assert instance.id is not None
    rows: list[dict[str, Any]] = []
    # Each state's figures are kept here and set once: a model's attributes are costly to set.
    totals: dict[str, list[Any]] = {}
    for charge in planned:
        month = month_of(charge.start_at, tz)
        state = states.get(charge.kind)
        if state is None:
            state = LedgerState(
                instance_id=instance.id, kind=charge.kind, last_end_at=charge.end_at, month=month
            )
            states[charge.kind] = state
        figures = totals.get(charge.kind)
        if figures is None:
            figures = totals[charge.kind] = [
                state.last_end_at,
                state.charged_micros,
                state.billed_s,
                state.month,
                state.month_micros,
            ]
        if figures[3] != month:
            known = bool(figures[3])  # empty: a state from before months were kept
            figures[4] = (
                0 if known else _charged_in_month(session, instance.id, charge.kind, month, tz)
            )
            figures[3] = month
        figures[0] = max(figures[0], charge.end_at)
        figures[1] += charge.amount_micros
        figures[2] += charge.billed_s
        figures[4] += charge.amount_micros
        bucket = polls.get((instance.id, charge.start_at))
        rows.append(_charge_row(instance, charge, now, bucket))
    for kind, (last_end_at, charged, billed, month, month_micros) in totals.items():
        state = states[kind]
        state.last_end_at = last_end_at
        state.charged_micros = charged
        state.billed_s = billed
        state.month = month
        state.month_micros = month_micros
        session.add(state)
    return rows


def _insert(session: Session, rows: list[dict[str, Any]], tz: ZoneInfo) -> None:
    """The charges, in one INSERT, and what they add to the spend summaries (months in ``tz``).
    The only place charges are written."""
    if rows:
        session.execute(insert(Charge), rows)
        _summarise(session, rows, tz)


def _summarise(session: Session, rows: list[dict[str, Any]], tz: ZoneInfo) -> None:
    """Add charge ``rows`` (just inserted in ``session``) to the summaries of their months in
    ``tz``, for every threshold summed up, and drop the summaries of other zones that hold one
    of them (they are built again when asked)."""
    _lock_summaries(session, exclusive=False)
    zone = zone_name(tz)
    months = {month_of(row["start_at"], tz) for row in rows}
    near = {near for month in months for near in (previous_month(month), month, next_month(month))}
    markers = session.exec(
        select(SpendMonth)
        .where(col(SpendMonth.month).in_(sorted(near)))
        .order_by(col(SpendMonth.zone), col(SpendMonth.threshold_pct), col(SpendMonth.month))
    ).all()
    # By month: each threshold summed up, and the last instance id summed (None: all).
    kept: dict[str, list[tuple[float, int | None]]] = {}
    for marker in markers:
        if marker.zone == zone:
            if marker.month in months:
                kept.setdefault(marker.month, []).append(
                    (marker.threshold_pct, marker.summed_to_id)
                )
        elif _holds_any(marker, rows):
            _drop_summary(session, marker)
    if not kept:
        return
    sums: dict[tuple[float, str, int, int], list[int]] = {}
    for row in rows:
        month = month_of(row["start_at"], tz)
        for threshold, summed_to_id in kept.get(month, ()):
            if summed_to_id is not None and int(row["instance_id"]) > summed_to_id:
                continue  # the build sums it up from the charges
            key = (threshold, month, int(row["instance_id"]), local_day(row["start_at"], tz))
            entry = sums.setdefault(key, [0] * len(SUMMARY_SUMS))
            for index, value in enumerate(charge_sums(row, threshold)):
                entry[index] += value
    values = [
        {
            "zone": zone,
            "threshold_pct": threshold,
            "month": month,
            "instance_id": instance_id,
            "day": day,
            **dict(zip(SUMMARY_SUMS, entry, strict=True)),
        }
        for (threshold, month, instance_id, day), entry in sorted(sums.items())
    ]
    if not values:
        return
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    upsert = dialect.insert(SpendDay)
    keys = ["zone", "threshold_pct", "month", "instance_id", "day"]
    upsert = upsert.on_conflict_do_update(
        index_elements=keys,
        set_={name: getattr(SpendDay, name) + upsert.excluded[name] for name in SUMMARY_SUMS},
    )
    session.execute(upsert, values)


def _holds_any(marker: SpendMonth, rows: list[dict[str, Any]]) -> bool:
    """Whether a charge of ``rows`` starts in the marker's month in its zone."""
    try:
        zone = ZoneInfo(marker.zone)
    except (ValueError, LookupError):  # not a zone (any more): drop it
        return True
    return any(month_of(row["start_at"], zone) == marker.month for row in rows)


def _drop_summary(session: Session, marker: SpendMonth) -> None:
    session.execute(
        delete(SpendDay).where(
            col(SpendDay.zone) == marker.zone,
            col(SpendDay.threshold_pct) == marker.threshold_pct,
            col(SpendDay.month) == marker.month,
        )
    )
    session.delete(marker)


def _lock_summaries(session: Session, *, exclusive: bool) -> None:
    """On PostgreSQL, the summary lock until the transaction ends (SQLite's writers already
    queue up, each transaction starting with the write lock)."""
    if session.get_bind().dialect.name != "postgresql":
        return
    lock = func.pg_advisory_xact_lock if exclusive else func.pg_advisory_xact_lock_shared
    session.execute(sql_select(lock(SUMMARY_LOCK_ID)))


def _charge_sums_sql(threshold_pct: float) -> list[Any]:
    """:func:`charge_sums` as SQL over a charge row, in integers (the same rounding)."""
    compute = col(Charge.kind) == COMPUTE
    amount = col(Charge.amount_micros)
    idle_n = func.coalesce(col(Charge.idle_gpu_samples), 0)
    busy_n = func.coalesce(col(Charge.busy_gpu_samples), 0)
    unmeasured_n = func.coalesce(col(Charge.unmeasured_gpu_samples), 0)
    counted = idle_n + busy_n + unmeasured_n > 0
    polls = func.coalesce(col(Charge.polls), 0)
    bad = func.coalesce(col(Charge.bad_polls), 0)
    good = polls - bad
    quiet = case((and_(good > 0, col(Charge.max_util_pct) < threshold_pct), good), else_=0)
    one = literal(1, Integer)
    idle_w = case((counted, idle_n), (polls > 0, quiet), else_=0)
    unmeasured_w = case((counted, unmeasured_n), (polls > 0, bad), else_=one)
    whole = case((counted, idle_n + busy_n + unmeasured_n), (polls > 0, polls), else_=one)
    return [
        case((compute, amount), else_=0),
        case((compute, 0), else_=amount),
        case((compute, amount * idle_w // whole), else_=0),
        case((compute, col(Charge.billed_s)), else_=0),
        case((compute, amount * unmeasured_w // whole), else_=0),
    ]


def _local_day_sql(dialect: str, start: datetime, end: datetime, tz: ZoneInfo) -> Any:
    """:func:`local_day` of a charge's start in SQL, for charges in ``[start, end)``: whole
    seconds since 1970 plus the zone's offset then (a CASE over the offset changes in the
    range), divided by a day."""
    changes = _offset_changes(start, end, tz)
    offset: Any = literal_column(str(changes[0][1]), Integer)
    if len(changes) > 1:
        whens = [
            (col(Charge.start_at) < until, literal_column(str(changes[index][1]), Integer))
            for index, (until, _) in enumerate(changes[1:])
        ]
        offset = case(*whens, else_=literal_column(str(changes[-1][1]), Integer))
    if dialect == "postgresql":
        # Date arithmetic: cheaper than numeric seconds.
        second: Any = literal_column("INTERVAL '1 second'")
        local = cast(col(Charge.start_at) + offset * second, Date)
        return local - literal_column("DATE '1970-01-01'", Date)
    epoch = cast(func.strftime("%s", col(Charge.start_at)), Integer)
    return (epoch + offset) // _DAY_S


def _offset_changes(start: datetime, end: datetime, tz: ZoneInfo) -> list[tuple[datetime, int]]:
    """``tz``'s UTC offset in seconds over ``[start, end)`` (naive UTC): (from, offset) pairs,
    the first from ``start``. Offsets are looked at hourly and each change found to the second
    (zones change at whole seconds, never twice in an hour)."""

    def offset(at: datetime) -> int:
        delta = at.replace(tzinfo=UTC).astimezone(tz).utcoffset()
        return int(delta.total_seconds()) if delta is not None else 0

    changes = [(start, offset(start))]
    at = start
    while at < end:
        step = min(at + timedelta(hours=1), end)
        if step < end and offset(step) != changes[-1][1]:
            low, high = at, step  # low has the old offset, high the new one
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) / 2
                if offset(middle) == changes[-1][1]:
                    low = middle
                else:
                    high = middle
            changes.append((high.replace(microsecond=0), offset(high)))
        at = step
    return changes


def _charge_row(
    instance: Instance, charge: PlannedCharge, now: datetime, bucket: UtilHour | None
) -> dict[str, Any]:
    compute = charge.kind == COMPUTE and charge.end_at > charge.start_at
    return {
        "instance_id": instance.id,
        "kind": charge.kind,
        "start_at": charge.start_at,
        "end_at": charge.end_at,
        "billed_s": charge.billed_s,
        "amount_micros": charge.amount_micros,
        "currency": instance.currency,
        "created_at": now,
        "polls": (bucket.polls if bucket else 0) if compute else None,
        "bad_polls": (bucket.bad_polls if bucket else 0) if compute else None,
        "max_util_pct": bucket.max_util_pct if compute and bucket else None,
        "idle_gpu_samples": (bucket.idle_gpu_samples if bucket else 0) if compute else None,
        "busy_gpu_samples": (bucket.busy_gpu_samples if bucket else 0) if compute else None,
        "unmeasured_gpu_samples": (
            (bucket.unmeasured_gpu_samples if bucket else 0) if compute else None
        ),
    }


def _bucket_polls(
    session: Session, plans: list[tuple[Instance, list[PlannedCharge]]]
) -> dict[tuple[int, datetime], UtilHour]:
    """The poll roll-ups of the planned compute buckets, by (instance, bucket start): one query
    per ``POLLS_CHUNK`` buckets."""
    keys = [
        (instance.id, charge.start_at)
        for instance, planned in plans
        for charge in planned
        if instance.id is not None and charge.kind == COMPUTE and charge.end_at > charge.start_at
    ]
    found: dict[tuple[int, datetime], UtilHour] = {}
    for start in range(0, len(keys), POLLS_CHUNK):
        chunk = keys[start : start + POLLS_CHUNK]
        rows = session.exec(
            select(UtilHour).where(
                tuple_(col(UtilHour.instance_id), col(UtilHour.bucket_start)).in_(chunk)
            )
        ).all()
        found.update({(row.instance_id, row.bucket_start): row for row in rows})
    return found


def _plan_kind(
    kind: str,
    start: datetime,
    end: datetime | None,
    state: KindState,
    now: datetime,
    tz: ZoneInfo,
    *,
    running: _Totals,
    final: _Totals,
    close_at: datetime | None = None,
    max_buckets: int | None = None,
) -> tuple[list[PlannedCharge], bool]:
    """Buckets from the last charge's end to the last complete boundary (or to ``end``, or to
    ``close_at`` when the session still runs then), at most ``max_buckets`` of them; and
    whether buckets are left."""
    ended = end is not None and end <= now
    if ended and end is not None:
        horizon = end
    elif close_at is not None:
        horizon = max(start, close_at)
    else:
        horizon = _last_boundary(start, now, tz)
    cursor = state.last_end_at or start
    charged, billed = state.charged_micros, state.billed_s
    planned: list[PlannedCharge] = []
    while cursor < horizon:
        if max_buckets is not None and len(planned) >= max_buckets:
            return planned, True
        bucket_end = min(next_boundary(cursor, tz), horizon)
        seconds = billing.elapsed_seconds(start, bucket_end)
        is_last = ended and bucket_end == end
        total_billed, total_micros = (final if is_last else running)(seconds)
        planned.append(
            PlannedCharge(
                kind=kind,
                start_at=cursor,
                end_at=bucket_end,
                billed_s=max(0, total_billed - billed),
                amount_micros=max(0, total_micros - charged),
            )
        )
        charged, billed = max(charged, total_micros), max(billed, total_billed)
        cursor = bucket_end
    if ended and end is not None:
        # The session ended where a bucket had already been charged as running: the rest of
        # the session's rounding goes into a zero-length adjustment at the ledger's end. When
        # the platform said only later that it ended earlier than what was charged (a machine
        # ended behind the bot's back, learned at the next reconcile), the adjustment is
        # negative: the ledger owes what the platform bills, never more.
        total_billed, total_micros = final(billing.elapsed_seconds(start, end))
        if (total_micros, total_billed) != (charged, billed):
            planned.append(
                PlannedCharge(
                    kind=kind,
                    start_at=cursor,
                    end_at=cursor,
                    billed_s=total_billed - billed,
                    amount_micros=total_micros - charged,
                )
            )
    return planned, False


def _last_boundary(start: datetime, now: datetime, tz: ZoneInfo) -> datetime:
    """The last bucket boundary at or before ``now`` (``start`` if none has passed)."""
    hour = now.replace(minute=0, second=0, microsecond=0)
    month = month_start_utc(*parse_month(month_of(now, tz)), tz)
    return max(start, hour, month)


def _charged_in_month(
    session: Session, instance_id: int, kind: str, month: str, tz: ZoneInfo
) -> int:
    start, end = month_bounds(month, tz)
    total = session.exec(
        select(func.sum(Charge.amount_micros)).where(
            Charge.instance_id == instance_id,
            Charge.kind == kind,
            Charge.start_at >= start,
            Charge.start_at < end,
        )
    ).one()
    return int(total or 0)


def _load_states(session: Session, instance_ids: list[int]) -> dict[int, dict[str, LedgerState]]:
    rows = session.exec(
        select(LedgerState).where(col(LedgerState.instance_id).in_(instance_ids))
    ).all()
    states: dict[int, dict[str, LedgerState]] = {}
    for row in rows:
        states.setdefault(row.instance_id, {})[row.kind] = row
    return states


def _kind_states(states: dict[str, LedgerState]) -> dict[str, KindState]:
    return {
        kind: KindState(
            last_end_at=row.last_end_at, charged_micros=row.charged_micros, billed_s=row.billed_s
        )
        for kind, row in states.items()
    }
