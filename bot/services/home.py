"""A person's Home tab in gpubot: their instances, their running jobs, their month's spend
against their budget, and the team's fleet, as plain values (no Slack).

The fleet is the stored one (the last poll's GPUs, as the poll stored what views read of them;
nobody is asked, nothing is parsed), and what a Home costs follows the person, not the team:
their own instances and running jobs (indexed by owner and requester), their month's spend (the
figure `/gpu spend` and budgets show, summed over their instances only), their budget, the first
``FLEET_SHOWN`` of the team's instances by name, and the team's figures from bounded aggregate
queries (bot.services.instances.fleet_views.fleet_summary).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from statistics import mean
from zoneinfo import ZoneInfo

from sqlalchemy import func
from sqlmodel import col, select

from bot.runtime import Runtime
from bot.services.instances import deadlines, fleet_views
from bot.services.instances.lookup import can_start
from bot.services.instances.views import FleetSummary, InstanceLine, InstanceRow, Mismatch
from bot.services.money import costs, ledger
from bot.store.models import Budget, Charge, Instance, LedgerState

#: What the Home tab's Extend button adds to a deadline, in seconds (one of the warnings' choices).
HOME_EXTEND_S = deadlines.EXTEND_CHOICES_S[0]
#: The team's instances a Home lists, one line each, by name; the rest are counted.
FLEET_SHOWN = 200


@dataclass(frozen=True)
class HomeInstance:
    """An instance on the Home: ``util_pct`` is its GPUs' mean utilisation at the last poll
    (None when unknown); ``cost_micros`` what it cost since it was registered; money in
    micro-units of ``currency``, times naive UTC."""

    id: int
    name: str
    owner_id: str
    state: str
    gpu_model: str | None
    gpu_count: int | None
    util_pct: int | None
    deadline_at: datetime | None
    cost_micros: int
    burn_micros_per_hour: int
    currency: str
    #: Whether the person whose Home it is may extend it by the Home's hour (not past an
    #: admin's lifetime cap unless they are an admin).
    can_extend: bool = True
    #: Stopped with no storage price recorded: what it costs per hour is not known.
    storage_unknown: bool = False
    #: Stopped, and the bot can start it on its platform (a Start button).
    can_start: bool = False
    #: Its compute price per hour (what it costs once started again), micro-units.
    price_micros_per_hour: int = 0
    #: The GPUs the agent found, where they are not what was rented (name, count).
    delivered_gpu_name: str | None = None
    delivered_gpu_count: int | None = None


@dataclass(frozen=True)
class HomeJob:
    """A running job of the person: the bot's job number, where it runs and what it runs."""

    id: int
    instance_name: str
    command: str
    started_at: datetime | None


@dataclass(frozen=True)
class HomeView:
    """One person's Home at ``now``: ``mine`` are the instances they own, ``jobs`` the running
    jobs they asked for, ``spent_micros`` their spend this ``month`` (``YYYY-MM`` in
    ``timezone``) against ``budget_micros`` (None: no budget), ``fleet`` the team's unreleased
    instances (theirs included) by name: every one, or with ``summary`` the first
    ``FLEET_SHOWN`` of them, ``summary`` then counting them all (someone else's there has no
    cost and no buttons: ``cost_micros`` 0, ``can_extend`` and ``can_start`` False). ``mine``
    comes nearest deadline first (see :func:`nearest_first`)."""

    user_id: str
    now: datetime
    timezone: str
    currency: str
    month: str
    mine: tuple[HomeInstance, ...]
    jobs: tuple[HomeJob, ...]
    spent_micros: int
    budget_micros: int | None
    fleet: tuple[HomeInstance, ...]
    #: The whole fleet in figures (count, cost per hour, deadlines); None: ``fleet`` is whole.
    summary: FleetSummary | None = None

    @property
    def fleet_count(self) -> int:
        """How many unreleased instances the team has."""
        return len(self.fleet) if self.summary is None else self.summary.count

    @property
    def fleet_burn_micros_per_hour(self) -> int:
        """What the team's unreleased instances cost per hour together (a stopped one its
        disk), micro-units."""
        if self.summary is None:
            return sum(item.burn_micros_per_hour for item in self.fleet)
        return self.summary.burn_micros_per_hour

    @property
    def fleet_storage_unknown(self) -> int:
        """How many of the team's stopped instances have no storage price (not counted)."""
        if self.summary is None:
            return sum(1 for item in self.fleet if item.storage_unknown)
        return self.summary.storage_unknown

    @property
    def budget_used_pct(self) -> int | None:
        """Whole percent of the budget spent (rounded down); None without a budget."""
        if self.budget_micros is None:
            return None
        if self.budget_micros <= 0:
            return 100
        return self.spent_micros * 100 // self.budget_micros


def home_view(rt: Runtime, user_id: str) -> HomeView:
    """The Home of ``user_id`` now: a bounded number of queries and rows whatever the size of
    the team (see the module docstring). Raises StoreError when the database fails."""
    now = rt.now()
    tz = rt.settings.tz()
    own = fleet_views.owner_rows(rt, user_id)
    listed = fleet_views.first_lines(rt, FLEET_SHOWN)
    summary = fleet_views.fleet_summary(rt)
    spent = month_spent_micros(rt, user_id, now, tz)
    with rt.db.session() as session:
        budget = session.exec(
            select(Budget).where(Budget.scope == "user", Budget.subject == user_id)
        ).first()
        limit = None if budget is None else budget.limit_micros
    mine = tuple(_instance(rt, row, user_id, now) for row in own)
    by_id = {item.id: item for item in mine}
    fleet = tuple(by_id.get(line.id) or _line(line) for line in listed)
    jobs = tuple(
        HomeJob(id=job.id, instance_name=name, command=job.command, started_at=job.started_at)
        for name, job in fleet_views.jobs_requested_by(rt, user_id)
    )
    return HomeView(
        user_id=user_id,
        now=now,
        timezone=rt.settings.timezone,
        currency=rt.settings.currency,
        month=ledger.month_of(now, tz),
        mine=nearest_first(mine),
        jobs=jobs,
        spent_micros=spent,
        budget_micros=limit,
        fleet=fleet,
        summary=summary,
    )


def month_spent_micros(rt: Runtime, user_id: str, now: datetime, tz: ZoneInfo) -> int:
    """What ``user_id``'s instances cost this month so far (the month of ``now`` in ``tz``):
    the figure of :func:`bot.services.money.budgets.month_to_date` for them, read from their own
    instances only (their ledger accrued up to ``now`` first, as there everyone's is).
    Micro-units. Raises StoreError when the database fails."""
    with rt.db.session() as session:
        due = session.exec(
            select(Instance.id)
            .where(Instance.owner_id == user_id, ledger.due_clause(now))
            .order_by(col(Instance.id))
        ).all()
    for instance_id in due:  # the clock charges everyone's; only theirs are waited for here
        if instance_id is not None:
            ledger.accrue_instance(rt.db, instance_id, now, tz)
    month = ledger.month_of(now, tz)
    start, end = ledger.month_bounds(month, tz)
    with rt.db.session() as session:
        # Theirs, by the owner index; then each by its key (never a scan of the team's).
        ids = [
            int(instance_id)
            for instance_id in session.exec(
                select(Instance.id).where(Instance.owner_id == user_id)
            ).all()
            if instance_id is not None
        ]
        if not ids:
            return 0
        owned = col(LedgerState.instance_id).in_(ids)
        charged = session.exec(
            select(func.coalesce(func.sum(LedgerState.month_micros), 0)).where(
                owned, LedgerState.month == month
            )
        ).one()
        # States written before the ledger kept months: their charges of the month.
        earlier = session.exec(
            select(func.coalesce(func.sum(Charge.amount_micros), 0))
            .join(LedgerState, col(LedgerState.instance_id) == col(Charge.instance_id))
            .where(owned, LedgerState.month == "", Charge.start_at >= start, Charge.start_at < end)
        ).one()
        unsettled = session.exec(
            select(Instance).where(
                Instance.owner_id == user_id, col(Instance.ledger_settled).is_(False)
            )
        ).all()
        pending = costs.pending_micros(session, unsettled, now)
    return int(charged or 0) + int(earlier or 0) + sum(pending.values())


def nearest_first(items: Iterable[HomeInstance]) -> tuple[HomeInstance, ...]:
    """``items`` by deadline, the nearest first (a stopped instance's is when its disk is
    released); those without a deadline last, by name, then id."""
    return tuple(sorted(items, key=_deadline_key))


def _deadline_key(item: HomeInstance) -> tuple[bool, datetime, str, int]:
    at = item.deadline_at
    return (at is None, at or datetime.min, item.name, item.id)


def _instance(rt: Runtime, row: InstanceRow, user_id: str, now: datetime) -> HomeInstance:
    inst = row.instance
    may_extend = deadlines.extend_choices(rt, inst, user_id, now)
    utils = [gpu.util_pct for gpu in row.gpus if gpu.util_pct is not None]
    return HomeInstance(
        id=inst.id,
        name=inst.name,
        owner_id=inst.owner_id,
        state=inst.state,
        gpu_model=inst.gpu_model,
        gpu_count=inst.gpu_count,
        util_pct=round(mean(utils)) if utils else None,
        deadline_at=inst.deadline_at,
        cost_micros=row.cost_micros,
        burn_micros_per_hour=inst.burn_micros_per_hour,
        currency=inst.currency,
        can_extend=HOME_EXTEND_S in may_extend and inst.state != "stopped",
        storage_unknown=inst.storage_unknown,
        can_start=inst.state == "stopped" and can_start(rt, inst),
        price_micros_per_hour=inst.price_micros_per_hour,
        delivered_gpu_name=_delivered_name(row.mismatch),
        delivered_gpu_count=len(row.mismatch.delivered_names) if row.mismatch else None,
    )


def _line(line: InstanceLine) -> HomeInstance:
    """Someone else's instance on a line of the team's fleet: what the line shows (no cost,
    no buttons)."""
    return HomeInstance(
        id=line.id,
        name=line.name,
        owner_id=line.owner_id,
        state=line.state,
        gpu_model=line.gpu_model,
        gpu_count=line.gpu_count,
        util_pct=line.util_pct,
        deadline_at=line.deadline_at,
        cost_micros=0,
        burn_micros_per_hour=line.burn_micros_per_hour,
        currency=line.currency,
        can_extend=False,
        storage_unknown=line.storage_unknown,
        can_start=False,
        price_micros_per_hour=line.price_micros_per_hour,
        delivered_gpu_name=_delivered_name(line.mismatch),
        delivered_gpu_count=len(line.mismatch.delivered_names) if line.mismatch else None,
    )


def _delivered_name(mismatch: Mismatch | None) -> str | None:
    """The model the agent found, where the GPUs are not what was rented (several models
    joined); None when they are."""
    if mismatch is None:
        return None
    names = sorted(set(mismatch.delivered_names))
    return ", ".join(names) if names else None
