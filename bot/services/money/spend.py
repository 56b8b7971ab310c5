"""`/gpu spend`: what a month cost, from the ledger's charges, grouped and with idle waste.

A month is a calendar month in the configured time zone; it holds the charges that start in it
(the ledger splits its buckets at month starts). Each compute charge is split three ways by its
bucket's GPU-samples, one GPU in one poll (bot.services.money.samples, bot.services.money.ledger):
**idle** (under the idle threshold, no process on it), **in use**, and **not measured** (a failed
poll, a GPU that read nothing, a bucket without a poll), which is neither idle nor use, so that a
month nobody polled does not read as "idle cost $0" nor as use. The three add up to compute
to the micro-unit. GPU-samples are judged when polled, under the threshold configured then
(the one the idle prompts used); charges written before they were counted are judged by their
polls under the report's threshold.

The current month is **this month so far** (bot.services.money.costs): its charges, which reach the
last full hour, plus what each instance owes beyond them now (``pending``: the open hour and the
rounding a release now would add), the figure budgets and `/gpu status` show too.

Reports read the month's spend summary, the charges summed per instance and local day, kept
by the ledger (bot.services.money.ledger): two GROUP BYs over instances x days rows, whatever the
number of charges. A month not summed up yet is built first, in short committed transactions
(a range of instances each), so that the ledger and other writers never wait long for it.
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

from sqlalchemy import func
from sqlalchemy import select as sql_select
from sqlmodel import Session, col, select

from agents import specs
from bot import billing
from bot.errors import StoreError, UsageError
from bot.i18n import N_, t
from bot.services.money import costs, ledger
from bot.store.db import Database
from bot.store.models import Charge, Instance, Person, SpendDay, SpendMonth
from bot.text import csv_cell
from bot.values import MICROS

GROUPS = ("user", "gpu", "instance", "project", "provider")
#: The group of instances without a project (translated where it is shown).
NO_PROJECT = N_("(no project)")
#: A GPU model nobody recorded.
UNKNOWN_GPU = N_("(unknown GPU)")


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
    #: Compute whose GPU-samples were not measured: neither idle nor in use.
    unmeasured_micros: int = 0
    #: Owed now beyond the charges written (the current month only): not yet charged.
    pending_micros: int = 0
    #: The GPU model the agent found, where it is not the one rented (None when they agree).
    delivered_gpu_model: str | None = None

    @property
    def total_micros(self) -> int:
        """Compute, storage and what is not yet charged: this month so far."""
        return self.compute_micros + self.storage_micros + self.pending_micros

    @property
    def in_use_micros(self) -> int:
        """Compute whose GPUs were measured in use: neither idle nor not measured."""
        return self.compute_micros - self.idle_micros - self.unmeasured_micros

    @property
    def gpu_label(self) -> str:
        """``2x h100-sxm`` style, the model delivered (the one rented beside it) where they
        differ, or a marker when the model is unknown."""
        model = self.gpu_model or t(UNKNOWN_GPU)
        if self.delivered_gpu_model:
            model = t(
                "{delivered} (rented {rented})", delivered=self.delivered_gpu_model, rented=model
            )
        return f"{self.gpu_count}x {model}" if self.gpu_count > 1 else model


@dataclass(frozen=True)
class SpendLine:
    """One group (a user, GPU model, instance, project or provider) and its totals in micros."""

    key: str
    total_micros: int
    idle_micros: int
    instances: int
    unmeasured_micros: int = 0


@dataclass(frozen=True)
class DaySpend:
    """One local day's charges in micros: compute in use, idle and not measured, and storage
    (with any other kind); they add up to the day's charges."""

    day: date
    in_use_micros: int = 0
    idle_micros: int = 0
    unmeasured_micros: int = 0
    other_micros: int = 0

    @property
    def total_micros(self) -> int:
        """Everything charged on the day."""
        return self.in_use_micros + self.idle_micros + self.unmeasured_micros + self.other_micros


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
    days: tuple[DaySpend, ...]
    now: datetime | None = None
    charged_until: datetime | None = None
    timezone: str = "UTC"
    names: dict[str, str] = field(default_factory=dict)
    #: The instances stopped now whose storage price is not recorded (the current month
    #: only): their disks bill on the platform, and nothing here counts them.
    unpriced_disks: tuple[str, ...] = ()

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
        """Compute of idle GPU-samples."""
        return sum(item.idle_micros for item in self.instances)

    @property
    def unmeasured_micros(self) -> int:
        """Compute of GPU-samples not measured (neither idle nor in use)."""
        return sum(item.unmeasured_micros for item in self.instances)

    @property
    def in_use_micros(self) -> int:
        """Compute of GPU-samples measured in use."""
        return sum(item.in_use_micros for item in self.instances)

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

    Reads the month's spend summary (bot.services.money.ledger), built first from the charges when
    the month was not summed up in ``tz`` under ``idle_threshold_pct`` yet. Raises StoreError
    when the database fails.
    """
    ledger.accrue(db, now, tz)
    start, end = ledger.month_bounds(month, tz)
    current = month == ledger.month_of(now, tz)
    read = _read_summary(db, month, tz, idle_threshold_pct, now if current else None)
    spends = _per_instance(read.sums, read.pending, read.instances)
    return SpendReport(
        month=month,
        start_at=start,
        end_at=end,
        currency=currency,
        by=by,
        complete=now >= end,
        instances=spends,
        groups=group_lines(spends, by),
        days=_per_day(read.days, start, end, tz),
        now=now,
        charged_until=costs.charged_until(now, tz) if current else None,
        timezone=str(tz.key),
        names=read.names,
        unpriced_disks=_unpriced_disks(db) if current else (),
    )


def _unpriced_disks(db: Database) -> tuple[str, ...]:
    """The names of the instances stopped now with no storage price recorded, by name."""
    with db.read_session() as session:
        rows = session.exec(
            select(Instance.name)
            .where(
                Instance.state == "stopped",
                col(Instance.released_at).is_(None),
                (col(Instance.storage_micros_per_gb_month) == 0) | col(Instance.disk_gb).is_(None),
            )
            .order_by(col(Instance.name))
        ).all()
    return tuple(rows)


def month_total_micros(
    db: Database,
    month: str,
    *,
    tz: ZoneInfo,
    now: datetime,
    idle_threshold_pct: float | None = None,
) -> int:
    """What ``month`` (``YYYY-MM`` in ``tz``, complete by ``now``) cost in all, the same total
    :func:`spend_report` gives for a past month, without its groups: one SUM over the month's
    spend summary under any threshold, built under ``idle_threshold_pct`` when there is none
    (without a threshold, one SUM over the month's charges). Raises StoreError when the
    database fails."""
    ledger.accrue(db, now, tz)
    for _ in range(2):
        with db.read_session() as session:
            marker = session.exec(
                select(SpendMonth.threshold_pct).where(
                    SpendMonth.zone == ledger.zone_name(tz),
                    SpendMonth.month == month,
                    col(SpendMonth.summed_to_id).is_(None),  # whole, not being built
                )
            ).first()
            if marker is not None:
                total = session.exec(
                    select(
                        func.coalesce(
                            func.sum(col(SpendDay.compute_micros) + col(SpendDay.other_micros)), 0
                        )
                    ).where(ledger.summary_clause(month, tz, marker))
                ).one()
                return int(total)
            if idle_threshold_pct is None:
                start, end = ledger.month_bounds(month, tz)
                total = session.exec(
                    select(func.coalesce(func.sum(Charge.amount_micros), 0)).where(
                        col(Charge.start_at) >= start, col(Charge.start_at) < end
                    )
                ).one()
                return int(total)
        ledger.build_summary(db, month, tz, idle_threshold_pct)
    raise StoreError(t("The spend summary of {month} was dropped while it was read.", month=month))


def group_lines(instances: Iterable[InstanceSpend], by: str) -> tuple[SpendLine, ...]:
    """Totals per group, most expensive first."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for item in instances:
        entry = totals[group_key(item, by)]
        entry[0] += item.total_micros
        entry[1] += item.idle_micros
        entry[2] += 1
        entry[3] += item.unmeasured_micros
    lines = [
        SpendLine(key, total, idle, count, unmeasured)
        for key, (total, idle, count, unmeasured) in totals.items()
    ]
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


#: The spend CSV's columns as English heads them (snake_case, ``{currency}`` the report's ISO
#: code), each in the catalogue for the reader's language (``月份``, ``项目``).
CSV_COLUMNS = (
    N_("month"),
    N_("instance"),
    N_("owner"),
    N_("owner_name"),
    N_("project"),
    N_("provider"),
    N_("gpu_model"),
    N_("delivered_gpu_model"),
    N_("gpu_count"),
    N_("compute_hours"),
    N_("compute_{currency}"),
    N_("storage_{currency}"),
    N_("in_use_{currency}"),
    N_("idle_{currency}"),
    N_("unmeasured_{currency}"),
    N_("not_yet_charged_{currency}"),
    N_("total_{currency}"),
)


def spend_csv(report: SpendReport) -> bytes:
    """One row per instance with amounts in currency units (6 decimals, exact); the owner by
    Slack ID and by display name. The header is in the active language (:data:`CSV_COLUMNS`:
    English snake_case, Chinese words for a Chinese reader); the cells are the same in both.
    UTF-8 with a byte order mark, so that Excel (Chinese Windows included) reads it as UTF-8.
    Text cells that a spreadsheet would read as a formula start with ``'`` (bot.text.csv_cell);
    the amounts are written as they are."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([t(column, currency=report.currency) for column in CSV_COLUMNS])
    for item in report.instances:
        writer.writerow(
            [
                report.month,
                csv_cell(item.name),
                csv_cell(item.owner_id),
                csv_cell(report.names.get(item.owner_id, "")),
                csv_cell(item.project or ""),
                csv_cell(item.provider),
                csv_cell(item.gpu_model or ""),
                csv_cell(item.delivered_gpu_model or ""),
                item.gpu_count,
                f"{Decimal(item.compute_s) / 3600:.2f}",
                _units(item.compute_micros),
                _units(item.storage_micros),
                _units(item.in_use_micros),
                _units(item.idle_micros),
                _units(item.unmeasured_micros),
                _units(item.pending_micros),
                _units(item.total_micros),
            ]
        )
    return buffer.getvalue().encode("utf-8-sig")


@dataclass(frozen=True)
class _Summary:
    """What a report reads: per instance (compute, other, idle, compute seconds, unmeasured)
    micros and seconds; per local day (days since 1970) the same sums but seconds; pending
    micros per instance; the instances and their owners' names."""

    sums: dict[int, tuple[int, ...]]
    days: list[tuple[int, ...]]
    pending: dict[int, int]
    instances: dict[int | None, Instance]
    names: dict[str, str]


def _read_summary(
    db: Database, month: str, tz: ZoneInfo, threshold_pct: float, now: datetime | None
) -> _Summary:
    """The month's summary under ``threshold_pct``, built first when it is missing; with
    ``now`` (the current month) what each instance owes beyond its charges then. Raises
    StoreError when the database fails, or when the summary is dropped (the zone changed)
    each time it was built."""
    for _ in range(3):
        with db.read_session() as session:
            if not ledger.summary_ready(session, month, tz, threshold_pct):
                found = None
            else:
                found = _read(session, month, tz, threshold_pct, now)
        if found is not None:
            return found
        ledger.build_summary(db, month, tz, threshold_pct)
    raise StoreError(t("The spend summary of {month} was dropped while it was read.", month=month))


def _read(
    session: Session, month: str, tz: ZoneInfo, threshold_pct: float, now: datetime | None
) -> _Summary:
    rows = ledger.summary_clause(month, tz, threshold_pct)

    def total(column: Any) -> Any:
        return func.coalesce(func.sum(column), 0)

    per_instance = session.execute(
        sql_select(
            col(SpendDay.instance_id),
            *(total(getattr(SpendDay, name)) for name in ledger.SUMMARY_SUMS),
        )
        .where(rows)
        .group_by(col(SpendDay.instance_id))
    ).all()
    sums = {int(row[0]): tuple(int(value) for value in row[1:]) for row in per_instance}
    per_day = session.execute(
        sql_select(
            col(SpendDay.day),
            total(col(SpendDay.compute_micros)),
            total(col(SpendDay.other_micros)),
            total(col(SpendDay.idle_micros)),
            total(col(SpendDay.unmeasured_micros)),
        )
        .where(rows)
        .group_by(col(SpendDay.day))
    ).all()
    pending = costs.pending_now(session, now) if now is not None else {}
    ids = set(sums) | set(pending)
    instances = {
        item.id: item
        for item in session.exec(select(Instance).where(col(Instance.id).in_(list(ids))))
    }
    owners = {item.owner_id for item in instances.values()}
    names = {
        person.slack_id: person.display_name
        for person in session.exec(select(Person).where(col(Person.slack_id).in_(owners)))
        if person.display_name
    }
    return _Summary(
        sums=sums,
        days=[tuple(int(value) for value in row) for row in per_day],
        pending=pending,
        instances=instances,
        names=names,
    )


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
                delivered_gpu_model=delivered_model(instance),
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
    days_found: list[tuple[int, ...]], start: datetime, end: datetime, tz: ZoneInfo
) -> tuple[DaySpend, ...]:
    """Every local day of ``[start, end)`` from the summary's (day, compute, other, idle, not
    measured) rows, days without charges at zero."""
    first = start.replace(tzinfo=UTC).astimezone(tz).date()
    last = end.replace(tzinfo=UTC).astimezone(tz).date()
    days: dict[date, list[int]] = {}
    day = first
    while day < last:
        days[day] = [0, 0, 0, 0]
        day = date.fromordinal(day.toordinal() + 1)
    for number, compute, other, idle, unmeasured in days_found:
        entry = days.setdefault(ledger.day_date(number), [0, 0, 0, 0])
        entry[0] += compute - idle - unmeasured
        entry[1] += idle
        entry[2] += unmeasured
        entry[3] += other
    return tuple(
        DaySpend(day, in_use, idle, unmeasured, other)
        for day, (in_use, idle, unmeasured, other) in sorted(days.items())
    )


def _units(micros: int) -> str:
    return f"{Decimal(micros) / MICROS:.6f}"


def delivered_model(instance: Instance) -> str | None:
    """The GPU model the agent found on the instance, where it is not the model rented (as
    the GPU catalogue reads both names); None when they agree or either is unknown."""
    rented, found = instance.gpu_model, instance.delivered_gpu_name
    if not rented or not found:
        return None
    first = found.split(",")[0].strip()
    rented_spec, found_spec = specs.lookup(rented), specs.lookup(first)
    if rented_spec is None or found_spec is None or rented_spec.key == found_spec.key:
        return None
    return first
