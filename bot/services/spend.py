"""`/gpu spend`: what a month cost, from the ledger's charges, grouped and with idle waste.

A month is a calendar month in the configured time zone; it holds the charges that start in it
(the ledger splits its buckets at month starts). A compute bucket is **idle** when the instance
was polled during it and every poll succeeded with GPU utilisation under the idle threshold; a
failed poll counts as active. A bucket without polls is neither: its compute is reported as
**unmeasured**, so that a month nobody polled does not read as "idle cost $0".

The current month is **this month so far** (bot.services.costs): its charges, which reach the
last full hour, plus what each instance owes beyond them now (``pending``: the open hour and the
rounding a release now would add), the figure budgets and `/gpu status` show too.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import and_, case, func
from sqlalchemy import select as sql_select
from sqlmodel import Session, col, select

from bot import billing
from bot.errors import UsageError
from bot.i18n import t
from bot.services import costs, ledger
from bot.store.db import Database
from bot.store.models import Charge, Instance, Person
from bot.values import MICROS

GROUPS = ("user", "gpu", "instance", "project", "provider")
NO_PROJECT = "(no project)"
UNKNOWN_GPU = "(unknown GPU)"


@dataclass(frozen=True)
class InstanceSpend:
    """One instance's charges in the month, in micros."""

    instance_id: int
    name: str
    owner_id: str
    project: str | None
    provider: str
    gpu_model: str | None
    gpu_count: int
    compute_micros: int
    storage_micros: int
    idle_micros: int
    compute_s: int
    #: Compute charged for hours without a single poll: whether the GPUs were idle is unknown.
    unmeasured_micros: int = 0
    #: Owed now beyond the charges written (the current month only): not yet charged.
    pending_micros: int = 0

    @property
    def total_micros(self) -> int:
        """Compute, storage and what is not yet charged: this month so far."""
        return self.compute_micros + self.storage_micros + self.pending_micros

    @property
    def gpu_label(self) -> str:
        """``2x h100-sxm`` style, or a marker when the model is unknown."""
        model = self.gpu_model or UNKNOWN_GPU
        return f"{self.gpu_count}x {model}" if self.gpu_count > 1 else model


@dataclass(frozen=True)
class SpendLine:
    """One group (a user, GPU model, instance, project or provider) and its totals in micros."""

    key: str
    total_micros: int
    idle_micros: int
    instances: int


@dataclass(frozen=True)
class SpendReport:
    """A month's spend. ``complete`` is False while the month is still running: its charges
    then reach ``charged_until`` and what is owed since is each instance's ``pending_micros``,
    up to ``now``. ``names`` maps the owners' Slack IDs to their display names, where known."""

    month: str
    start_at: datetime
    end_at: datetime
    currency: str
    by: str
    complete: bool
    instances: tuple[InstanceSpend, ...]
    groups: tuple[SpendLine, ...]
    days: tuple[tuple[date, int, int], ...]
    now: datetime | None = None
    charged_until: datetime | None = None
    timezone: str = "UTC"
    names: dict[str, str] = field(default_factory=dict)

    @property
    def pending_micros(self) -> int:
        """Owed beyond the charges written, not yet charged (the current month only)."""
        return sum(item.pending_micros for item in self.instances)

    @property
    def total_micros(self) -> int:
        """Everything charged in the month."""
        return sum(item.total_micros for item in self.instances)

    @property
    def compute_micros(self) -> int:
        """Compute charges."""
        return sum(item.compute_micros for item in self.instances)

    @property
    def storage_micros(self) -> int:
        """Storage charges."""
        return sum(item.storage_micros for item in self.instances)

    @property
    def idle_micros(self) -> int:
        """Compute charged for idle hours."""
        return sum(item.idle_micros for item in self.instances)

    @property
    def unmeasured_micros(self) -> int:
        """Compute charged for hours no poll measured (neither idle nor known to be busy)."""
        return sum(item.unmeasured_micros for item in self.instances)

    def top(self, limit: int = 5) -> tuple[InstanceSpend, ...]:
        """The most expensive instances."""
        return self.instances[:limit]

    def group(self, by: str) -> tuple[SpendLine, ...]:
        """The totals grouped another way."""
        return group_lines(self.instances, by)


def parse_month_arg(text: str | None, now: datetime, tz: ZoneInfo) -> str:
    """``YYYY-MM`` (or None for this month) checked to be neither malformed nor in the future.

    Raises UsageError.
    """
    current = ledger.month_of(now, tz)
    if text is None:
        return current
    try:
        ledger.parse_month(text)
    except ValueError as exc:
        raise UsageError(
            t("{text!r} is not a month", text=text), hint=t("Write months as YYYY-MM.")
        ) from exc
    month = text.strip()
    if month > current:
        raise UsageError(
            t("{month} has not started yet", month=month),
            hint=t("This month is {current}.", current=current),
        )
    return month


def parse_group(text: str | None) -> str:
    """The ``--by`` value (default ``user``). Raises UsageError for others."""
    if text is None:
        return "user"
    value = text.strip().lower()
    if value not in GROUPS:
        raise UsageError(
            t("--by {text!r} is not known", text=text),
            hint=t("Use one of: {choices}.", choices=", ".join(GROUPS)),
        )
    return value


def spend_report(
    db: Database,
    month: str,
    *,
    by: str = "user",
    tz: ZoneInfo,
    now: datetime,
    idle_threshold_pct: float,
    currency: str,
) -> SpendReport:
    """The spend of ``month`` grouped ``by``, after accruing every charge due up to ``now``;
    the current month is this month so far (its charges plus what is owed beyond them now).

    Raises StoreError when the database fails.
    """
    ledger.accrue(db, now, tz)
    start, end = ledger.month_bounds(month, tz)
    current = month == ledger.month_of(now, tz)
    with db.read_session() as session:
        classified = _classified(start, end, idle_threshold_pct)
        sums = _instance_sums(session, classified)
        pending = costs.pending_now(session, now) if current else {}
        ids = set(sums) | set(pending)
        instances = {
            item.id: item
            for item in session.exec(select(Instance).where(col(Instance.id).in_(list(ids))))
        }
        hours = _hour_sums(session, classified)
        owners = {item.owner_id for item in instances.values()}
        names = {
            person.slack_id: person.display_name
            for person in session.exec(select(Person).where(col(Person.slack_id).in_(owners)))
            if person.display_name
        }
    spends = _per_instance(sums, pending, instances)
    return SpendReport(
        month=month,
        start_at=start,
        end_at=end,
        currency=currency,
        by=by,
        complete=now >= end,
        instances=spends,
        groups=group_lines(spends, by),
        days=_per_day(hours, start, end, tz),
        now=now,
        charged_until=costs.charged_until(now, tz) if current else None,
        timezone=str(tz.key),
        names=names,
    )


def month_total_micros(db: Database, month: str, *, tz: ZoneInfo, now: datetime) -> int:
    """What ``month`` (``YYYY-MM`` in ``tz``, complete by ``now``) cost in all: one SUM over its
    charges, the same total :func:`spend_report` gives for a past month, without its groups.
    Raises StoreError when the database fails."""
    ledger.accrue(db, now, tz)
    start, end = ledger.month_bounds(month, tz)
    with db.read_session() as session:
        total = session.exec(
            select(func.coalesce(func.sum(Charge.amount_micros), 0)).where(
                col(Charge.start_at) >= start, col(Charge.start_at) < end
            )
        ).one()
    return int(total)


def group_lines(instances: Iterable[InstanceSpend], by: str) -> tuple[SpendLine, ...]:
    """Totals per group, most expensive first."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for item in instances:
        entry = totals[group_key(item, by)]
        entry[0] += item.total_micros
        entry[1] += item.idle_micros
        entry[2] += 1
    lines = [SpendLine(key, total, idle, count) for key, (total, idle, count) in totals.items()]
    return tuple(sorted(lines, key=lambda line: (-line.total_micros, line.key)))


def group_key(item: InstanceSpend, by: str) -> str:
    """The group an instance falls in: a Slack user ID, GPU label, instance name, project or
    provider."""
    if by == "user":
        return item.owner_id
    if by == "gpu":
        return item.gpu_label
    if by == "instance":
        return item.name
    if by == "project":
        return item.project or NO_PROJECT
    return item.provider


def spend_csv(report: SpendReport) -> bytes:
    """One row per instance with amounts in currency units (6 decimals, exact); the owner by
    Slack ID and by display name. UTF-8 with a byte order mark, so that Excel (Chinese
    Windows included) reads it as UTF-8."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        [
            "month",
            "instance",
            "owner",
            "owner_name",
            "project",
            "provider",
            "gpu_model",
            "gpu_count",
            "compute_hours",
            f"compute_{report.currency}",
            f"storage_{report.currency}",
            f"idle_{report.currency}",
            f"unmeasured_{report.currency}",
            f"not_yet_charged_{report.currency}",
            f"total_{report.currency}",
        ]
    )
    for item in report.instances:
        writer.writerow(
            [
                report.month,
                item.name,
                item.owner_id,
                report.names.get(item.owner_id, ""),
                item.project or "",
                item.provider,
                item.gpu_model or "",
                item.gpu_count,
                f"{Decimal(item.compute_s) / 3600:.2f}",
                _units(item.compute_micros),
                _units(item.storage_micros),
                _units(item.idle_micros),
                _units(item.unmeasured_micros),
                _units(item.pending_micros),
                _units(item.total_micros),
            ]
        )
    return buffer.getvalue().encode("utf-8-sig")


def _classified(start: datetime, end: datetime, threshold_pct: float) -> Any:
    """The month's charges, each with 1/0 flags: ``idle`` (compute whose bucket was polled, no
    poll bad, every reading under ``threshold_pct``) and ``unmeasured`` (compute without a
    single poll), from the polls each compute charge carries: no join."""
    compute = col(Charge.kind) == ledger.COMPUTE
    polls = func.coalesce(col(Charge.polls), 0)
    idle = case(
        (
            and_(
                compute,
                polls > 0,
                func.coalesce(col(Charge.bad_polls), 0) == 0,
                col(Charge.max_util_pct) < threshold_pct,
            ),
            1,
        ),
        else_=0,
    )
    unmeasured = case((and_(compute, polls == 0), 1), else_=0)
    return (
        sql_select(
            col(Charge.instance_id).label("instance_id"),
            col(Charge.kind).label("kind"),
            col(Charge.start_at).label("start_at"),
            col(Charge.billed_s).label("billed_s"),
            col(Charge.amount_micros).label("amount"),
            idle.label("idle"),
            unmeasured.label("unmeasured"),
        )
        .where(col(Charge.start_at) >= start, col(Charge.start_at) < end)
        .subquery()
    )


def _instance_sums(session: Session, classified: Any) -> dict[int, tuple[int, ...]]:
    """Per instance: (compute, storage and other, idle, compute seconds, unmeasured), one
    GROUP BY in the database."""
    c = classified.c
    compute = c.kind == ledger.COMPUTE

    def total(expr: Any) -> Any:
        return func.coalesce(func.sum(expr), 0)

    rows = session.execute(
        sql_select(
            c.instance_id,
            total(case((compute, c.amount), else_=0)),
            total(case((compute, 0), else_=c.amount)),
            total(c.amount * c.idle),
            total(case((compute, c.billed_s), else_=0)),
            total(c.amount * c.unmeasured),
        ).group_by(c.instance_id)
    ).all()
    return {int(row[0]): tuple(int(value) for value in row[1:]) for row in rows}


def _hour_sums(session: Session, classified: Any) -> list[tuple[datetime, int, int]]:
    """Per charge start (at most a month of hours): (start, active, idle) micros."""
    c = classified.c
    rows = session.execute(
        sql_select(
            c.start_at,
            func.coalesce(func.sum(c.amount * (1 - c.idle)), 0),
            func.coalesce(func.sum(c.amount * c.idle), 0),
        ).group_by(c.start_at)
    ).all()
    return [(row[0], int(row[1]), int(row[2])) for row in rows]


def _per_instance(
    sums: dict[int, tuple[int, ...]],
    pending: dict[int, int],
    instances: dict[int | None, Instance],
) -> tuple[InstanceSpend, ...]:
    spends = []
    for instance_id in set(sums) | set(pending):
        compute, other, idle, seconds, unmeasured = sums.get(instance_id, (0, 0, 0, 0, 0))
        instance = instances.get(instance_id)
        if instance is None:
            continue
        spends.append(
            InstanceSpend(
                instance_id=instance_id,
                name=instance.name,
                owner_id=instance.owner_id,
                project=instance.project,
                provider=instance.provider,
                gpu_model=instance.gpu_model,
                gpu_count=billing.billed_gpu_count(instance),
                compute_micros=compute,
                storage_micros=other,
                idle_micros=idle,
                compute_s=seconds,
                unmeasured_micros=unmeasured,
                pending_micros=pending.get(instance_id, 0),
            )
        )
    spends.sort(key=lambda item: (-item.total_micros, item.name, item.instance_id))
    return tuple(spends)


def _per_day(
    hours: list[tuple[datetime, int, int]], start: datetime, end: datetime, tz: ZoneInfo
) -> tuple[tuple[date, int, int], ...]:
    first = start.replace(tzinfo=UTC).astimezone(tz).date()
    last = end.replace(tzinfo=UTC).astimezone(tz).date()
    days: dict[date, list[int]] = {}
    day = first
    while day < last:
        days[day] = [0, 0]
        day = date.fromordinal(day.toordinal() + 1)
    for at, active, idle in hours:
        local = at.replace(tzinfo=UTC).astimezone(tz).date()
        entry = days.setdefault(local, [0, 0])
        entry[0] += active
        entry[1] += idle
    return tuple((day, active, idle) for day, (active, idle) in sorted(days.items()))


def _units(micros: int) -> str:
    return f"{Decimal(micros) / MICROS:.6f}"
