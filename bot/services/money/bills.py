"""The platforms' own bills beside gpubot's charges: `/gpu bills` and the flags to the ops channel.

gpubot's figures come from its model of each platform's billing (bot.billing, the ledger); this
compares that model with what the platforms say they billed, per instance and UTC calendar
month (the platforms bill in UTC), where a platform publishes a per-instance bill the bot reads
(``ProviderCapabilities.publishes_bills``, a :class:`bot.providers.base.BillSource`):

- AWS: Cost Explorer ``GetCostAndUsageWithResources``, daily per EC2 instance id, the last 14
  days, for accounts that opted in to resource-level data (bot.providers.aws).
- RunPod: ``GET /v2/billing/pods`` (runpod/docs ``api-reference-v2/billing/
  get-pod-billing-history.mdx``, ``api-reference-v2/openapi.json``): records per pod and bucket
  with ``gpuAmount``, ``diskAmount`` and ``totalAmount`` (bot.providers.runpod).
- Vast.ai: ``GET /api/v0/invoices``, the ``charge`` items per ``instance_id`` (the official
  ``vastai`` client's ``show invoices-v1 --charges``; bot.providers.vast).

Lambda Cloud, Compshare and manual instances publish no per-instance bill the bot can read.

Reading the bills is the clock's work, off the command path: :func:`bills_tick` (a tick step)
looks once every :data:`CHECK_EVERY_S` which platforms are due (two queries; each is read at
most every :data:`FETCH_EVERY_S`, again after :data:`RETRY_AFTER_S` when a read failed), claims
each by a conditional UPDATE and reads it on the platform's pool, a month per call. The platform
is asked outside any transaction; its charges are stored (:class:`bot.store.models.PlatformBill`)
with their fetch time, and in the same transaction each instance whose bill differs from
gpubot's by more than max(10,000 micro-units, 1 %) is queued once to the ops channel through the
outbox, keyed by platform, instance and month. A platform that fails keeps its last bills; the
report says how old they are and why the last read failed. :func:`bills_report` reads the store
only, in one query.

Only what both sides cover is compared: the days the platform's bill covers whole (up to the
start of the UTC day it was read on, from the start of its history: 14 days for AWS).

The monthly digest shows the closed month's report in totals per platform
(bot.services.money.digest.bills_digest): the same lines, from the store, with the bills' age.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import (
    BigInteger,
    DateTime,
    String,
    Text,
    case,
    cast,
    func,
    literal,
    null,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from bot.billing import INCREMENT_S, SECONDS_PER_HOUR
from bot.errors import ProviderError
from bot.i18n import speaking
from bot.notify import Notice
from bot.providers.base import BillSource, PlatformCharge, Provider
from bot.providers.registry import platform_billing
from bot.runtime import Runtime
from bot.services.money import ledger, spend
from bot.services.speaking import outbox
from bot.store.models import BillFetch, Charge, Instance, PlatformBill

log = logging.getLogger(__name__)

UTC_ZONE = ZoneInfo("UTC")
#: How often the tick looks whether a platform's bills are due (seconds; the first tick of each
#: slot of this length looks, the others cost nothing).
CHECK_EVERY_S = 300
#: A platform's bills are read at most this often (seconds), and again this soon after a failed
#: read.
FETCH_EVERY_S = 3600
RETRY_AFTER_S = 900
#: A difference is flagged past max(this many micro-units, ``TOLERANCE_PCT`` % of the larger
#: total): one cent of a dollar, 1 %.
TOLERANCE_MICROS = 10_000
TOLERANCE_PCT = 1
#: Minimum charges a platform may apply that gpubot did not (one minute, one hour), seconds.
_MINIMUMS_S = (60, 3600)
#: Increments a platform may round to that are coarser than gpubot's (a minute, an hour).
_INCREMENTS_S = (60, 3600)

#: The likely causes of a difference, decided from the figures (see :func:`likely_cause`).
INCREMENT = "increment"
MINIMUM = "minimum"
STORAGE = "storage"
START = "start"
DISCOUNT = "discount"
UNREGISTERED = "unregistered"
NOT_BILLED = "not_billed"
UNEXPLAINED = "unexplained"
CAUSES = (INCREMENT, MINIMUM, STORAGE, START, DISCOUNT, UNREGISTERED, NOT_BILLED, UNEXPLAINED)


@dataclass(frozen=True)
class BillLine:
    """One instance in one month: gpubot's charges and the platform's bill, in micro-units of
    ``currency``. gpubot's side is None for an instance it never saw; the platform's totals are
    None where it billed nothing, its storage None also where it does not split it out.
    ``difference_micros`` is the platform's total less gpubot's; ``cause`` is set only when the
    difference is past the tolerance."""

    provider: str
    provider_instance_id: str
    name: str | None
    currency: str
    bot_compute_micros: int | None
    bot_storage_micros: int | None
    bot_total_micros: int | None
    platform_compute_micros: int | None
    platform_storage_micros: int | None
    platform_total_micros: int | None
    difference_micros: int
    cause: str | None = None

    @property
    def flagged(self) -> bool:
        """True when the difference is past the tolerance."""
        return self.cause is not None


@dataclass(frozen=True)
class PlatformBills:
    """One platform's bills as stored: when they were last read whole (None: never), the last
    try and why it failed (None: it did not), the days they cover, and the lines."""

    provider: str
    fetched_at: datetime | None
    tried_at: datetime | None
    error: str | None
    covered_from: datetime | None
    covered_to: datetime | None
    lines: tuple[BillLine, ...] = ()


@dataclass(frozen=True)
class BillsReport:
    """`/gpu bills` for ``month`` (``YYYY-MM``, UTC) at ``now`` (naive UTC): the platforms that
    publish bills, and the names of those that publish none the bot can read."""

    month: str
    now: datetime
    platforms: tuple[PlatformBills, ...]
    unreadable: tuple[str, ...]


@dataclass(frozen=True)
class BillMismatch(Notice):
    """A platform billed an instance differently from gpubot in ``month`` (said once, to the
    ops channel)."""

    month: str
    line: BillLine


# --- the report -------------------------------------------------------------------------------


def parse_month(text: str | None, now: datetime) -> str:
    """The ``YYYY-MM`` asked for (None: this UTC month). Raises UsageError."""
    return spend.parse_month_arg(text, now, UTC_ZONE)


def bills_report(rt: Runtime, month: str, now: datetime | None = None) -> BillsReport:
    """Every bill-publishing platform's stored bills for ``month`` beside gpubot's charges, in
    one query over the store (no platform is asked). A platform the bot looks at only once the
    team uses it (AWS without an endpoint set) is shown once an instance of it is registered."""
    now = now or rt.now()
    candidates = [name for name, _ in _candidates(rt)]
    with rt.db.session() as session:
        found, in_use = _compare(session, month, candidates, with_use=True)
    shown = {p.name for p in rt.providers.accounts(in_use)}
    platforms = tuple(
        found.get(name) or PlatformBills(name, None, None, None, None, None)
        for name in candidates
        if name in shown
    )
    unreadable = tuple(sorted(p.name for p in rt.providers.all() if not _is_source(p)))
    return BillsReport(month=month, now=now, platforms=platforms, unreadable=unreadable)


def bill_sources(rt: Runtime, in_use: set[str]) -> list[tuple[str, BillSource]]:
    """The platforms whose per-instance bills the bot reads, by name: those configured on
    purpose, and those the bot looks at once used (AWS) when named in ``in_use``."""
    shown = {p.name for p in rt.providers.accounts(in_use)}
    return [(name, source) for name, source in _candidates(rt) if name in shown]


def tolerance_micros(*totals: int | None) -> int:
    """The difference tolerated between two totals: max(10,000 micros, 1 % of the larger)."""
    largest = max((abs(total) for total in totals if total is not None), default=0)
    return max(TOLERANCE_MICROS, largest * TOLERANCE_PCT // 100)


# --- the clock's work -------------------------------------------------------------------------


def bills_tick(rt: Runtime, now: datetime) -> int:
    """The tick step: on the first tick of each :data:`CHECK_EVERY_S` slot, read the bills of
    every platform that is due (see :func:`fetch_due`); otherwise nothing (no query)."""
    previous = now - timedelta(seconds=rt.settings.tick_interval_s)
    if _slot(now) == _slot(previous):
        return 0
    return fetch_due(rt, now)


def fetch_due(rt: Runtime, now: datetime) -> int:
    """Claim every bill-publishing platform whose read is due and read it (on its platform pool
    when the runtime has pools, else here). Two queries (the reads' schedule, the platforms in
    use), plus one claim per due platform. Returns how many were claimed."""
    if not _candidates(rt):
        return 0
    with rt.db.session() as session:
        rows = {row.provider: row.due_at for row in session.exec(select(BillFetch)).all()}
        in_use = set(session.exec(select(Instance.provider).distinct()).all())
    sources = bill_sources(rt, in_use)
    claimed = 0
    for name, source in sources:
        due_at = rows.get(name)
        if due_at is not None and due_at > now:
            continue
        if not _claim(rt, name, exists=due_at is not None, now=now):
            continue
        claimed += 1
        work = partial(fetch_bills, rt, name, source, now)
        if rt.platform_work is None:
            work()
        else:
            rt.platform_work.submit(name, f"bills:{name}", work)
    return claimed


def fetch_bills(rt: Runtime, name: str, source: BillSource, now: datetime) -> int:
    """Read ``name``'s bills for the previous UTC month and for this one up to the start of
    today (outside any transaction: one call per month, so that a platform that adds a pod's
    buckets up, as RunPod's adapter does, still gives one figure per month), store them, and
    queue a flag for each new difference. A platform that fails keeps its last bills and the
    failure is recorded. Returns how many flags were queued."""
    this_month = _month_start(now)
    previous = _month_start(this_month - timedelta(days=1))
    covered_to = _day_start(now)
    found: list[PlatformCharge] = []
    try:
        for start, end in ((previous, this_month), (this_month, covered_to)):
            if end > start:
                found.extend(source.charges(start, end))
    except ProviderError as exc:
        log.warning("bills: reading %s's bills failed: %s", name, exc.message)
        _record_failure(rt, name, exc, now)
        return 0
    covered_from = previous
    days = getattr(source, "bill_history_days", None)
    if isinstance(days, int):
        covered_from = max(previous, _day_start(now - timedelta(days=days)))
    fetched_at = rt.now()
    with rt.db.session() as session:
        _store(session, name, found, fetched_at)
        session.execute(
            update(BillFetch)
            .where(col(BillFetch.provider) == name)
            .values(
                fetched_at=fetched_at,
                covered_from=covered_from,
                covered_to=covered_to,
                error=None,
            )
        )
        session.flush()
        return _flag(rt, session, name, now)


# --- comparing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Side:
    """One side's figures for an instance (gpubot's or the platform's)."""

    currency: str
    compute: int = 0
    storage: int = 0
    total: int = 0
    split: bool = True
    billed_s: int = 0
    hourly: int = 0
    #: The registration's rules; None: not said, the platform's apply.
    increment: str | None = None
    min_charge_s: int | None = None
    billing_from: str | None = None
    first_start: datetime | None = None
    created_at: datetime | None = None
    ssh_ready_at: datetime | None = None
    name: str | None = None


def likely_cause(provider: str, bot: _Side | None, platform: _Side | None) -> str | None:
    """Why the platform's bill differs from gpubot's, decided from the figures; None when the
    difference is within :func:`tolerance_micros`. In order: never registered; not billed;
    storage (the compute agrees and the storage does not, or the difference is gpubot's storage
    that the platform bills elsewhere); a minimum charge (the difference is the price of the
    seconds up to a minute or an hour that gpubot did not bill); the start time (the price of
    the gap between two starts gpubot knows: creation and SSH-ready, or gpubot's first charge
    and the platform's exact start), checked before the increment since an hour's rounding can
    give the same figure; the billing increment (rounding gpubot's billed seconds up to a
    minute or an hour gives it, or the platform billed less than one of gpubot's increments); a
    discount (the platform billed less); else unexplained."""
    if bot is None:
        return UNREGISTERED if platform is not None and platform.total > 0 else None
    if platform is None:
        return NOT_BILLED if abs(bot.total) > TOLERANCE_MICROS else None
    tolerance = tolerance_micros(bot.total, platform.total)
    if abs(platform.total - bot.total) <= tolerance:
        return None

    def near(amount: int, figure: int) -> bool:
        return abs(amount - figure) <= tolerance

    if platform.split:
        if near(platform.compute, bot.compute) and not near(platform.storage, bot.storage):
            return STORAGE
        difference = platform.compute - bot.compute
    else:
        difference = platform.total - bot.total
        if bot.storage > 0 and near(difference, -bot.storage):
            return STORAGE
    return _compute_cause(provider, bot, platform, difference, near)


def _compute_cause(provider: str, bot: _Side, platform: _Side, difference: int, near: Any) -> str:
    hourly = bot.hourly

    def cost(seconds: int) -> int:
        sign = -1 if seconds < 0 else 1
        return sign * -(-abs(seconds) * hourly // SECONDS_PER_HOUR)

    platform_rules = platform_billing(provider)
    increment = bot.increment or platform_rules.increment
    min_charge_s = platform_rules.min_charge_s if bot.min_charge_s is None else bot.min_charge_s
    increment_s = INCREMENT_S.get(increment, 1)
    billed = bot.billed_s
    minimums = sorted({*_MINIMUMS_S, min_charge_s} - {0})
    if hourly > 0:
        if any(billed < m and near(difference, cost(m - billed)) for m in minimums):
            return MINIMUM
        for gap in _gaps(bot, platform):
            if near(difference, cost(gap)):
                return START
        for step in _INCREMENTS_S:
            extra = -(-billed // step) * step - billed
            if step > increment_s and extra > 0 and near(difference, cost(extra)):
                return INCREMENT
        if difference < 0 and increment_s > 1 and -difference <= cost(increment_s):
            return INCREMENT
    if difference < 0:
        return DISCOUNT
    return UNEXPLAINED


def _gaps(bot: _Side, platform: _Side) -> list[int]:
    """Seconds the platform's start may lie before gpubot's (positive: the platform began
    billing earlier): SSH-ready against creation, and gpubot's first charge against the
    platform's first where the platform's bill carries an exact start (not a bucket's)."""
    gaps: list[int] = []
    if bot.created_at is not None and bot.ssh_ready_at is not None:
        gaps.append(int((bot.ssh_ready_at - bot.created_at).total_seconds()))
    first = platform.first_start
    if bot.first_start is not None and first is not None and (first.minute or first.second):
        gaps.append(int((bot.first_start - first).total_seconds()))
    return [gap for gap in gaps if gap != 0]


def _compare(
    session: Session, month: str, providers: Sequence[str], *, with_use: bool = False
) -> tuple[dict[str, PlatformBills], set[str]]:
    """The stored bills of ``providers`` for ``month`` beside gpubot's charges, and (with
    ``with_use``) which of them have registered instances: one query."""
    if not providers:
        return {}, set()
    month_start, month_end = ledger.month_bounds(month, UTC_ZONE)
    statement = _statement(month_start, month_end, providers, with_use=with_use)
    rows = session.execute(statement).all()
    in_use = {row.provider for row in rows if row.source == "use"}
    fetches: dict[str, Any] = {}
    bots: dict[tuple[str, str], _Side] = {}
    platforms: dict[tuple[str, str], _Side] = {}
    for row in rows:
        if row.source == "use":
            continue
        if row.source == "fetch":
            fetches[row.provider] = row
        elif row.source == "bot":
            bots[(row.provider, row.pid)] = _side(row)
        else:
            platforms[(row.provider, row.pid)] = _side(row)
    result: dict[str, PlatformBills] = {}
    for provider in providers:
        fetch = fetches.get(provider)
        keys = sorted(
            {k for k in (*bots, *platforms) if k[0] == provider},
            key=lambda k: ((bots.get(k) or _Side("")).name or "~", k[1]),
        )
        lines = tuple(_line(provider, key[1], bots.get(key), platforms.get(key)) for key in keys)
        result[provider] = PlatformBills(
            provider=provider,
            fetched_at=_dt(fetch, "fetched_at"),
            tried_at=_dt(fetch, "tried_at"),
            error=fetch.error if fetch is not None else None,
            covered_from=_dt(fetch, "covered_from"),
            covered_to=_dt(fetch, "covered_to"),
            lines=lines if fetch is not None and fetch.fetched_at is not None else (),
        )
    return result, in_use


def _line(provider: str, pid: str, bot: _Side | None, platform: _Side | None) -> BillLine:
    bot_total = bot.total if bot else None
    platform_total = platform.total if platform else None
    return BillLine(
        provider=provider,
        provider_instance_id=pid,
        name=bot.name if bot else None,
        currency=(bot or platform or _Side("USD")).currency,
        bot_compute_micros=bot.compute if bot else None,
        bot_storage_micros=bot.storage if bot else None,
        bot_total_micros=bot_total,
        platform_compute_micros=platform.compute if platform else None,
        platform_storage_micros=platform.storage if platform and platform.split else None,
        platform_total_micros=platform_total,
        difference_micros=(platform_total or 0) - (bot_total or 0),
        cause=likely_cause(provider, bot, platform),
    )


_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("source", String(8)),
    ("provider", String(32)),
    ("pid", String(200)),
    ("name", String(64)),
    ("currency", String(8)),
    ("error", Text()),
    ("increment", String(8)),
    ("billing_from", String(16)),
    ("compute", BigInteger()),
    ("storage", BigInteger()),
    ("total", BigInteger()),
    ("split", BigInteger()),
    ("billed_s", BigInteger()),
    ("hourly", BigInteger()),
    ("min_charge_s", BigInteger()),
    ("first_start", DateTime()),
    ("created_at", DateTime()),
    ("ssh_ready_at", DateTime()),
    ("fetched_at", DateTime()),
    ("tried_at", DateTime()),
    ("covered_from", DateTime()),
    ("covered_to", DateTime()),
)


def _row(source: str, **values: Any) -> Any:
    """One branch of the union: every column in order, typed NULL where not given."""
    columns = [cast(literal(source), String(8)).label("source")]
    for name, type_ in _COLUMNS[1:]:
        value = values.get(name)
        columns.append(
            cast(null(), type_).label(name)
            if value is None
            else type_coerce(value, type_).label(name)
        )
    return sa_select(*columns)


def _statement(
    month_start: datetime, month_end: datetime, providers: Sequence[str], *, with_use: bool
) -> Any:
    """gpubot's charges and the platforms' bills per instance, each platform's read and (with
    ``with_use``) the platforms with registrations, as one UNION ALL of grouped SELECTs (charges
    by start, bills by platform and start)."""
    fetch_join = col(BillFetch.provider) == col(Instance.provider)
    is_compute = col(Charge.kind) == "compute"
    gpus = func.coalesce(col(Instance.gpu_count), col(Instance.delivered_gpu_count), 1)
    hourly = case(
        (col(Instance.price_per) == "gpu_hour", col(Instance.price_micros) * gpus),
        else_=col(Instance.price_micros),
    )
    bot = (
        _row(
            "bot",
            provider=col(Instance.provider),
            pid=col(Instance.provider_instance_id),
            name=func.max(col(Instance.name)),
            currency=col(Charge.currency),
            increment=func.max(col(Instance.billing_increment)),
            billing_from=func.max(col(Instance.billing_from)),
            compute=func.sum(case((is_compute, col(Charge.amount_micros)), else_=0)),
            storage=func.sum(
                case((col(Charge.kind) == "storage", col(Charge.amount_micros)), else_=0)
            ),
            total=func.sum(col(Charge.amount_micros)),
            billed_s=func.sum(case((is_compute, col(Charge.billed_s)), else_=0)),
            hourly=func.max(hourly),
            min_charge_s=func.max(col(Instance.min_charge_s)),
            first_start=func.min(case((is_compute, col(Charge.start_at)), else_=None)),
            created_at=func.min(col(Instance.created_at)),
            ssh_ready_at=func.min(col(Instance.ssh_ready_at)),
        )
        .select_from(Charge)
        .join(Instance, col(Instance.id) == col(Charge.instance_id))
        .join(BillFetch, fetch_join)
        .where(
            col(Instance.provider).in_(providers),
            col(Instance.provider_instance_id).is_not(None),
            col(Charge.start_at) >= month_start,
            col(Charge.start_at) < month_end,
            col(Charge.start_at) >= col(BillFetch.covered_from),
            col(Charge.start_at) < col(BillFetch.covered_to),
        )
        .group_by(col(Instance.provider), col(Instance.provider_instance_id), col(Charge.currency))
    )
    platform = (
        _row(
            "platform",
            provider=col(PlatformBill.provider),
            pid=col(PlatformBill.provider_instance_id),
            currency=col(PlatformBill.currency),
            compute=func.sum(col(PlatformBill.compute_micros)),
            storage=func.sum(func.coalesce(col(PlatformBill.storage_micros), 0)),
            total=func.sum(col(PlatformBill.total_micros)),
            split=func.count(col(PlatformBill.storage_micros)),
            first_start=func.min(col(PlatformBill.start_at)),
        )
        .select_from(PlatformBill)
        .join(BillFetch, col(BillFetch.provider) == col(PlatformBill.provider))
        .where(
            col(PlatformBill.provider).in_(providers),
            col(PlatformBill.start_at) >= month_start,
            col(PlatformBill.start_at) < month_end,
            col(PlatformBill.start_at) >= col(BillFetch.covered_from),
            col(PlatformBill.end_at) <= col(BillFetch.covered_to),
        )
        .group_by(
            col(PlatformBill.provider),
            col(PlatformBill.provider_instance_id),
            col(PlatformBill.currency),
        )
    )
    fetches = _row(
        "fetch",
        provider=col(BillFetch.provider),
        error=col(BillFetch.error),
        fetched_at=col(BillFetch.fetched_at),
        tried_at=col(BillFetch.tried_at),
        covered_from=col(BillFetch.covered_from),
        covered_to=col(BillFetch.covered_to),
    ).where(col(BillFetch.provider).in_(providers))
    if not with_use:
        return union_all(bot, platform, fetches)
    use = (
        _row("use", provider=col(Instance.provider))
        .where(col(Instance.provider).in_(providers))
        .group_by(col(Instance.provider))
    )
    return union_all(bot, platform, fetches, use)


def _side(row: Any) -> _Side:
    return _Side(
        currency=row.currency or "USD",
        compute=int(row.compute or 0),
        storage=int(row.storage or 0),
        total=int(row.total or 0),
        split=row.split is None or int(row.split) > 0,
        billed_s=int(row.billed_s or 0),
        hourly=int(row.hourly or 0),
        increment=row.increment,
        min_charge_s=None if row.min_charge_s is None else int(row.min_charge_s),
        billing_from=row.billing_from,
        first_start=row.first_start,
        created_at=row.created_at,
        ssh_ready_at=row.ssh_ready_at,
        name=row.name,
    )


def _dt(row: Any, name: str) -> datetime | None:
    if row is None:
        return None
    value = getattr(row, name)
    return value if isinstance(value, datetime) else None


# --- storing and flagging ---------------------------------------------------------------------


def _claim(rt: Runtime, name: str, *, exists: bool, now: datetime) -> bool:
    """Take ``name``'s read for this process: move its ``due_at`` on by
    :data:`FETCH_EVERY_S` where it is due (a conditional UPDATE), or store its first row."""
    due_at = now + timedelta(seconds=FETCH_EVERY_S)
    try:
        with rt.db.session() as session:
            if not exists:
                session.add(BillFetch(provider=name, due_at=due_at, tried_at=now))
                return True
            moved = session.execute(
                update(BillFetch)
                .where(col(BillFetch.provider) == name, col(BillFetch.due_at) <= now)
                .values(due_at=due_at, tried_at=now)
            )
            return bool(getattr(moved, "rowcount", 0) == 1)
    except sa_exc.IntegrityError:
        return False


def _record_failure(rt: Runtime, name: str, exc: ProviderError, now: datetime) -> None:
    """Keep the last bills; say why this read failed and try again after
    :data:`RETRY_AFTER_S` (or the platform's Retry-After, when later)."""
    text = exc.message if not exc.hint else f"{exc.message} ({exc.hint})"
    wait_s = max(RETRY_AFTER_S, int(getattr(exc, "retry_after_s", None) or 0))
    with rt.db.session() as session:
        session.execute(
            update(BillFetch)
            .where(col(BillFetch.provider) == name)
            .values(error=text[:2000], due_at=now + timedelta(seconds=wait_s))
        )


def _store(session: Session, name: str, found: Sequence[PlatformCharge], at: datetime) -> None:
    """Write the charges read (summed per instance and start), over the rows read before."""
    merged: dict[tuple[str, datetime], PlatformCharge] = {}
    for charge in found:
        key = (charge.provider_id[:200], charge.start)
        before = merged.get(key)
        if before is not None:
            storage = (
                None
                if before.storage_micros is None and charge.storage_micros is None
                else (before.storage_micros or 0) + (charge.storage_micros or 0)
            )
            charge = PlatformCharge(
                provider_id=key[0],
                start=charge.start,
                end=max(before.end, charge.end),
                compute_micros=before.compute_micros + charge.compute_micros,
                storage_micros=storage,
                total_micros=before.total_micros + charge.total_micros,
                currency=charge.currency,
            )
        merged[key] = charge
    if not merged:
        return
    earliest = min(start for _, start in merged)
    stored = {
        (row.provider_instance_id, row.start_at): row
        for row in session.exec(
            select(PlatformBill).where(
                col(PlatformBill.provider) == name, col(PlatformBill.start_at) >= earliest
            )
        ).all()
    }
    for (pid, start), charge in merged.items():
        row = stored.get((pid, start)) or PlatformBill(
            provider=name,
            provider_instance_id=pid,
            start_at=start,
            end_at=charge.end,
            fetched_at=at,
        )
        row.end_at = charge.end
        row.compute_micros = charge.compute_micros
        row.storage_micros = charge.storage_micros
        row.total_micros = charge.total_micros
        row.currency = charge.currency[:8]
        row.fetched_at = at
        session.add(row)


def _flag(rt: Runtime, session: Session, name: str, now: datetime) -> int:
    """Queue each flagged line of ``name`` in this month and the last to the ops channel once
    (outbox key ``bills:PROVIDER:ID:MONTH``). Returns how many were queued now."""
    recipient = outbox.ops_recipient(rt)
    if recipient is None:
        return 0
    this_month = ledger.month_of(now, UTC_ZONE)
    queued = 0
    for month in (ledger.previous_month(this_month), this_month):
        found = _compare(session, month, [name])[0].get(name)
        for line in found.lines if found else ():
            if not line.flagged:
                continue
            key = f"bills:{name}:{line.provider_instance_id}:{month}"[:160]
            if outbox.find(session, key) is not None:
                continue
            with speaking(None):  # the ops channel's language
                outbox.enqueue_notice(
                    rt,
                    session,
                    BillMismatch(month=month, line=line),
                    key=key,
                    recipient=recipient,
                    now=now,
                )
            queued += 1
    return queued


def _candidates(rt: Runtime) -> list[tuple[str, BillSource]]:
    """Every configured provider that publishes bills the bot reads, by name."""
    found: list[tuple[str, BillSource]] = [
        (p.name, cast_source(p)) for p in rt.providers.all() if _is_source(p)
    ]
    return sorted(found, key=lambda pair: pair[0])


def cast_source(provider: Provider) -> BillSource:
    """``provider`` as the bill source :func:`_is_source` found it to be."""
    return typing.cast(BillSource, provider)


def _is_source(provider: Provider) -> bool:
    return bool(provider.capabilities.publishes_bills) and callable(
        getattr(provider, "charges", None)
    )


def _slot(at: datetime) -> int:
    return int((at - datetime(1970, 1, 1)).total_seconds() // CHECK_EVERY_S)


def _month_start(at: datetime) -> datetime:
    return datetime(at.year, at.month, 1)


def _day_start(at: datetime) -> datetime:
    return datetime(at.year, at.month, at.day)
