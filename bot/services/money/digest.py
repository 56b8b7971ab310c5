"""The monthly digest: posted on the 1st at 00:15 (configured zone) to the ops channel, soon
after the month closed (the quarter hour lets the ledger write the month's last hour).

Exactly once per month, whatever restarts happen: a digest row for the month is claimed with a
conditional insert before anything is posted, and ``posted_at`` is set right after the message
went out. A claim left without ``posted_at`` for longer than :data:`STALE_CLAIM` (the process
died between claiming and posting) is taken over with a conditional update, so the month is
retried once; only a crash in the instant between Slack accepting the message and the row being
marked could then repeat it. Months missed while the bot was down are posted by the first tick
after it starts, oldest first (at most :data:`MAX_CATCH_UP_MONTHS`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import exc as sa_exc
from sqlalchemy import func, update
from sqlmodel import col, select

from agents import specs
from bot import billing
from bot.notify import Notice
from bot.providers.registry import platform_billing
from bot.runtime import Runtime
from bot.services.money import advice, bills, ledger, spend
from bot.services.speaking import outbox
from bot.store import models
from bot.store.db import Database
from bot.store.models import Instance, Job

log = logging.getLogger(__name__)

DIGEST_HOUR = 0
DIGEST_MINUTE = 15
STALE_CLAIM = timedelta(minutes=15)
MAX_CATCH_UP_MONTHS = 12
TOP_JOBS = 5


@dataclass(frozen=True)
class PlanSaving:
    """An instance whose compute this month cost more than a monthly plan for its GPUs."""

    instance_name: str
    owner_id: str
    gpu_label: str
    compute_micros: int
    plan_micros: int
    plan_source: str

    @property
    def saving_micros(self) -> int:
        """What the plan would have saved."""
        return self.compute_micros - self.plan_micros


@dataclass(frozen=True)
class JobSpend:
    """A finished job and its share of its instance's cost; ``command`` is its argv joined by
    spaces (or the stored text when that is not a JSON list)."""

    job_id: str
    instance_name: str
    requested_by: str
    command: str
    duration_s: int
    cost_micros: int


@dataclass(frozen=True)
class PlatformBillTotals:
    """One platform's month (UTC) against its own bill, in micro-units of ``currency``: the
    totals of every line of `/gpu bills` for that month (gpubot's, the platform's, and the
    platform's less gpubot's), how many instances either side billed, how many are flagged
    and the flagged one with the largest difference; when the bill was read (None: never), the
    days it covers (``covered_to`` excluded) and why the last read failed (None: it did not)."""

    provider: str
    currency: str
    bot_micros: int
    platform_micros: int
    difference_micros: int
    instances: int
    flagged: int
    largest: bills.BillLine | None
    fetched_at: datetime | None
    covered_from: datetime | None
    covered_to: datetime | None
    error: str | None


@dataclass(frozen=True)
class BillsDigest:
    """The digest's section against the platforms' bills: ``/gpu bills MONTH`` in totals, at
    ``now`` (naive UTC, for the bills' age); ``unreadable`` the platforms that publish no
    per-instance bill the bot can read."""

    month: str
    now: datetime
    platforms: tuple[PlatformBillTotals, ...]
    unreadable: tuple[str, ...]


@dataclass(frozen=True)
class DigestData:
    """Everything the digest message shows; ``bills`` None when no configured platform
    publishes a per-instance bill."""

    month: str
    report: spend.SpendReport
    previous_total_micros: int
    savings: tuple[PlanSaving, ...]
    jobs: tuple[JobSpend, ...]
    bills: BillsDigest | None = None


@dataclass(frozen=True)
class Digest(Notice):
    """A month's digest for the ops channel; it comes with the month's spend per day as a
    chart, shared in its thread."""

    data: DigestData


def digest_due_at(month: str, tz: ZoneInfo) -> datetime:
    """When ``month``'s digest is due: 00:15 on the 1st of the next month in ``tz`` (naive UTC)."""
    year, number = ledger.parse_month(ledger.next_month(month))
    local = datetime(year, number, 1, DIGEST_HOUR, DIGEST_MINUTE, tzinfo=tz)
    return local.astimezone(UTC).replace(tzinfo=None)


def due_months(db: Database, now: datetime, tz: ZoneInfo) -> list[str]:
    """Months whose digest is due by ``now`` and not posted yet, oldest first: from the first
    month an instance existed, at most the last :data:`MAX_CATCH_UP_MONTHS`."""
    with db.session() as session:
        first = session.exec(select(func.min(Instance.created_at))).one()
        posted = set(
            session.exec(
                select(models.Digest.month).where(col(models.Digest.posted_at).is_not(None))
            ).all()
        )
    if first is None:
        return []
    month = ledger.previous_month(ledger.month_of(now, tz))
    if digest_due_at(month, tz) > now:
        month = ledger.previous_month(month)
    oldest = ledger.month_of(first, tz)
    months: list[str] = []
    while month >= oldest and len(months) < MAX_CATCH_UP_MONTHS:
        if month not in posted:
            months.append(month)
        month = ledger.previous_month(month)
    return sorted(months)


def claim(db: Database, month: str, now: datetime) -> bool:
    """Claim ``month``'s digest for this process: True when it is ours to post.

    A new claim is a conditional insert (the month is the primary key); a stale one (no
    ``posted_at`` after :data:`STALE_CLAIM`) is taken over by a conditional update.
    """
    try:
        with db.session() as session:
            session.add(models.Digest(month=month, claimed_at=now))
            session.flush()
        return True
    except sa_exc.IntegrityError:
        pass
    with db.session() as session:
        result = session.exec(
            update(models.Digest)
            .where(
                col(models.Digest.month) == month,
                col(models.Digest.posted_at).is_(None),
                col(models.Digest.claimed_at) < now - STALE_CLAIM,
            )
            .values(claimed_at=now)
        )
        return bool(result.rowcount == 1)


def build_digest(
    db: Database,
    month: str,
    *,
    tz: ZoneInfo,
    now: datetime,
    idle_threshold_pct: float,
    currency: str,
    table: advice.PriceTable | None = None,
    bills_section: BillsDigest | None = None,
) -> DigestData:
    """The digest of ``month``: spend by user (GPU and project via ``report.group``), the month
    before, monthly-plan savings, the most expensive jobs and ``bills_section`` (see
    :func:`bills_digest`)."""
    table = table or advice.load_price_table()
    report = spend.spend_report(
        db,
        month,
        by="user",
        tz=tz,
        now=now,
        idle_threshold_pct=idle_threshold_pct,
        currency=currency,
    )
    previous_total = spend.month_total_micros(
        db, ledger.previous_month(month), tz=tz, now=now, idle_threshold_pct=idle_threshold_pct
    )
    return DigestData(
        month=month,
        report=report,
        previous_total_micros=previous_total,
        savings=plan_savings(report, table),
        jobs=top_jobs(db, report.start_at, report.end_at),
        bills=bills_section,
    )


def bills_digest(report: bills.BillsReport) -> BillsDigest | None:
    """``report`` (`/gpu bills` for the digest's month, read from the store) in totals per
    platform and currency: the same lines the command shows, added up. None when no configured
    platform publishes a per-instance bill."""
    if not report.platforms:
        return None
    totals: list[PlatformBillTotals] = []
    for platform in report.platforms:
        currencies = list(dict.fromkeys(line.currency for line in platform.lines)) or ["USD"]
        for currency in currencies:
            lines = [line for line in platform.lines if line.currency == currency]
            flagged = [line for line in lines if line.flagged]
            largest = max(flagged, key=lambda line: abs(line.difference_micros), default=None)
            totals.append(
                PlatformBillTotals(
                    provider=platform.provider,
                    currency=currency,
                    bot_micros=sum(line.bot_total_micros or 0 for line in lines),
                    platform_micros=sum(line.platform_total_micros or 0 for line in lines),
                    difference_micros=sum(line.difference_micros for line in lines),
                    instances=len(lines),
                    flagged=len(flagged),
                    largest=largest,
                    fetched_at=platform.fetched_at,
                    covered_from=platform.covered_from,
                    covered_to=platform.covered_to,
                    error=platform.error,
                )
            )
    return BillsDigest(
        month=report.month,
        now=report.now,
        platforms=tuple(totals),
        unreadable=report.unreadable,
    )


def plan_savings(report: spend.SpendReport, table: advice.PriceTable) -> tuple[PlanSaving, ...]:
    """Instances whose month of compute cost more than the cheapest monthly plan for the same
    GPUs in the price table, biggest saving first; none when the report's currency is not the
    table's."""
    found: list[PlanSaving] = []
    if report.currency != table.currency:
        return ()
    plans: dict[str, advice.PriceRow | None] = {}  # per GPU model: instances share a few
    for item in report.instances:
        model = item.gpu_model
        if model and model not in plans:
            spec = specs.lookup(model)
            plans[model] = table.cheapest_monthly(spec.key) if spec else None
        row = plans.get(model) if model else None
        if row is None:
            continue
        plan = row.per_gpu_micros * item.gpu_count
        if item.compute_micros > plan:
            found.append(
                PlanSaving(
                    instance_name=item.name,
                    owner_id=item.owner_id,
                    gpu_label=item.gpu_label,
                    compute_micros=item.compute_micros,
                    plan_micros=plan,
                    plan_source=row.label,
                )
            )
    return tuple(sorted(found, key=lambda saving: -saving.saving_micros))


def top_jobs(
    db: Database, start: datetime, end: datetime, limit: int = TOP_JOBS
) -> tuple[JobSpend, ...]:
    """The most expensive jobs that finished in ``[start, end)``: their recorded cost, or their
    share of the instance's price while they ran."""
    with db.read_session() as session:
        rows = session.exec(
            select(Job, Instance)
            .join(Instance, col(Instance.id) == col(Job.instance_id))
            .where(
                col(Job.finished_at) >= start,
                col(Job.finished_at) < end,
                col(Job.started_at).is_not(None),
            )
            .order_by(col(Job.id))
        ).all()
    jobs: list[JobSpend] = []
    for job, instance in rows:
        started, finished = job.started_at, job.finished_at
        if started is None or finished is None:
            continue
        cost = job.cost_micros
        if cost is None:
            cost = billing.job_cost(
                instance, platform_billing(instance.provider), started, finished, job.gpu_count
            )
        jobs.append(
            JobSpend(
                job_id=job.agent_job_id,
                instance_name=instance.name,
                requested_by=job.requested_by,
                command=_command_text(job.command_json),
                duration_s=billing.elapsed_seconds(started, finished),
                cost_micros=cost,
            )
        )
    jobs.sort(key=lambda item: (-item.cost_micros, item.job_id))
    return tuple(jobs[:limit])


def post_due_digests(rt: Runtime, now: datetime) -> list[str]:
    """Queue (and try to post at once) every digest that is due and unclaimed; returns the
    months queued."""
    channel = rt.settings.channel
    if not channel:
        return []
    tz = rt.settings.tz()
    posted: list[str] = []
    for month in due_months(rt.db, now, tz):
        if not claim(rt.db, month, now):
            continue
        post_digest(rt, month, channel, now)
        posted.append(month)
    return posted


def post_digest(rt: Runtime, month: str, channel: str, now: datetime) -> None:
    """Build ``month``'s digest (claimed by the caller), queue it in the outbox with its chart
    (shared in its thread) and mark the month done in the same transaction, then try to post
    it; the outbox retries a post that fails. Raises StoreError when the database fails (the
    claim then goes stale and the month is built again)."""
    settings = rt.settings
    data = build_digest(
        rt.db,
        month,
        tz=settings.tz(),
        now=now,
        idle_threshold_pct=settings.idle_threshold_pct,
        currency=settings.currency,
        bills_section=bills_digest(bills.bills_report(rt, month, now)),
    )
    notice = Digest(data)
    text, message_blocks = rt.message(notice)
    files = rt.files(notice)
    with rt.db.session() as session:
        message_id = outbox.enqueue(
            session,
            key=f"digest:{month}:{channel}",
            kind="digest",
            recipient=channel,
            text=text,
            blocks=message_blocks,
            files=files,
            now=now,
        )
        row = session.get(models.Digest, month) or models.Digest(month=month, claimed_at=now)
        row.posted_at = now
        row.channel_id = channel
        session.add(row)
    ref = outbox.deliver(rt, message_id, now=now)
    if ref is not None:
        with rt.db.session() as session:
            session.exec(
                update(models.Digest)
                .where(col(models.Digest.month) == month)
                .values(message_ts=ref.ts)
            )


def digest_tick(rt: Runtime, now: datetime) -> None:
    """Tick hook: post the digests that are due."""
    post_due_digests(rt, now)


def _command_text(command_json: str) -> str:
    try:
        argv = json.loads(command_json)
    except ValueError:
        return command_json
    return " ".join(str(part) for part in argv) if isinstance(argv, list) else str(argv)
