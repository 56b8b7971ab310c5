"""What instances, people and projects have cost: the one place each figure of money spent is
computed, so that status, `/gpu spend`, budgets and the release messages agree at the same clock
time. Amounts are micro-units of the configured currency; times naive UTC.

Two quantities, each labelled where it is shown:

- **since registered** (:func:`since_registered`; `/gpu status`, the release question): what
  releasing the instance now would cost, by the billing rules (bot.billing.cost_breakdown).
- **this month so far** (:func:`month_to_date`; `/gpu spend` of the current month, budgets):
  the charges the ledger wrote for the month (whole buckets up to the last full hour, and
  storage) plus :func:`pending_micros`, what the instance owes now beyond every charge written
  (the open hour, and the rounding a release now would add).

An instance registered this month shows the same figure for both. :func:`final_cost` is what a
released (or stopped) instance's session cost, with the figures that explain it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from sqlmodel import Session, col, select

from bot import billing
from bot.providers.registry import platform_billing
from bot.services.money import ledger
from bot.store.db import Database
from bot.store.models import Instance


@dataclass(frozen=True)
class InstanceMonth:
    """One instance's cost this month so far: ``charged_micros`` written as charges of the
    month, ``pending_micros`` owed now beyond every charge (not yet charged)."""

    instance_id: int
    owner_id: str
    project: str | None
    charged_micros: int
    pending_micros: int

    @property
    def total_micros(self) -> int:
        """This month so far."""
        return self.charged_micros + self.pending_micros


@dataclass(frozen=True)
class FinalCost:
    """What an instance's session cost once compute stopped (a release, or a stop): the total
    (compute and storage up to then), the session's length ``used_s`` and the seconds it is
    billed for ``billed_s`` (rounded up to the increment, at least the minimum charge), at
    ``hourly_micros`` an hour of the whole instance. ``carried`` when part of it was billed
    under earlier rules (another price); ``started`` is False when billing never started.
    ``unverified_increment`` is the increment when a setting, not a platform document, decides
    it (Compshare)."""

    total_micros: int
    compute_micros: int
    storage_micros: int
    used_s: int
    billed_s: int
    hourly_micros: int
    currency: str
    carried: bool = False
    started: bool = True
    unverified_increment: str | None = None


def since_registered(instance: Instance, now: datetime) -> billing.CostBreakdown:
    """Compute and storage since the instance was registered, up to ``now``: what releasing it
    now would cost (the increment and minimum applied to the running session)."""
    return billing.cost_breakdown(instance, platform_billing(instance.provider), now)


def since_registered_micros(instance: Instance, now: datetime) -> int:
    """:func:`since_registered`, compute and storage together."""
    return since_registered(instance, now).total_micros


def charged_until(now: datetime, tz: ZoneInfo) -> datetime:
    """Where the ledger's charges of running instances end at ``now``: the last full UTC hour,
    or the start of the month in ``tz`` when that is later (naive UTC)."""
    hour = now.replace(minute=0, second=0, microsecond=0)
    local = now.replace(tzinfo=UTC).astimezone(tz)
    return max(hour, ledger.month_start_utc(local.year, local.month, tz))


def pending_micros(
    session: Session, instances: Iterable[Instance], now: datetime
) -> dict[int, int]:
    """Per instance: what it owes at ``now`` beyond every charge written (all months), for the
    instances whose ledger is not settled; call it after the ledger accrued up to ``now``."""
    open_ones = [i for i in instances if i.id is not None and not i.ledger_settled]
    charged = ledger.charged_micros(session, [i.id for i in open_ones if i.id is not None])
    pending: dict[int, int] = {}
    for item in open_ones:
        assert item.id is not None
        owed = ledger.unaccrued_micros(item, charged.get(item.id, 0), now)
        if owed:
            pending[item.id] = owed
    return pending


def pending_now(session: Session, now: datetime) -> dict[int, int]:
    """:func:`pending_micros` of every instance whose ledger is not settled (none released
    before the ledger's last run)."""
    unsettled = session.exec(select(Instance).where(col(Instance.ledger_settled).is_(False)))
    return pending_micros(session, unsettled.all(), now)


def month_to_date(db: Database, now: datetime, tz: ZoneInfo) -> dict[int, InstanceMonth]:
    """Every instance's cost this month so far (the month of ``now`` in ``tz``), after accruing
    the ledger up to ``now``; instances that cost nothing this month are left out. Raises
    StoreError when the database fails."""
    ledger.accrue(db, now, tz)
    month = ledger.month_of(now, tz)
    with db.session() as session:
        charged = ledger.month_charged_micros(session, month, tz)
        pending = pending_now(session, now)
        ids = set(charged) | set(pending)
        # Only the columns the sums need: a month's instances, not their status snapshots.
        owners = session.exec(
            select(Instance.id, Instance.owner_id, Instance.project).where(
                col(Instance.id).in_(ids)
            )
        ).all()
    return {
        instance_id: InstanceMonth(
            instance_id=instance_id,
            owner_id=owner_id,
            project=project,
            charged_micros=charged.get(instance_id, 0),
            pending_micros=pending.get(instance_id, 0),
        )
        for instance_id, owner_id, project in owners
        if instance_id is not None
    }


def final_cost(instance: Instance) -> FinalCost | None:
    """What the instance's session cost once its compute stopped (released or stopped): None
    while it still runs. Storage is counted up to the same moment."""
    end = billing.compute_end(instance)
    if end is None:
        return None
    at = instance.released_at or end
    platform = platform_billing(instance.provider)
    cost = billing.cost_breakdown(instance, platform, at)
    start = billing.billing_start(instance, platform)
    seconds = 0 if start is None else billing.elapsed_seconds(start, end)
    used_s = billing.used_seconds(instance, platform, seconds) if seconds else 0
    billed_s = billing.compute_totals(instance, platform, seconds, final=True)[0] if seconds else 0
    return FinalCost(
        total_micros=cost.total_micros,
        compute_micros=cost.compute_micros,
        storage_micros=cost.storage_micros,
        used_s=used_s,
        billed_s=billed_s,
        hourly_micros=billing.hourly_cost_micros(instance),
        currency=instance.currency,
        carried=not billing.at_one_price(instance, platform),
        started=start is not None and used_s > 0,
        unverified_increment=billing.unverified_increment(instance, platform),
    )
