"""A person's Home tab in gpubot: their instances, their running jobs, their month's spend
against their budget, and the team's fleet, as plain values (no Slack).

The fleet is the stored one (the last poll's GPUs; nobody is asked), so the Home is quick to
build and costs a constant number of queries however large the fleet: the unreleased instances
and their running jobs (bot.services.fleet_views), the month's spend (bot.services.budgets, the
figure `/gpu spend` and budgets show) and the person's own budget.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from statistics import mean

from sqlmodel import select

from bot.runtime import Runtime
from bot.services import budgets, deadlines, fleet_views, ledger
from bot.services.lookup import can_start
from bot.services.views import InstanceRow
from bot.store.models import Budget

#: What the Home tab's Extend button adds to a deadline, in seconds (one of the warnings' choices).
HOME_EXTEND_S = deadlines.EXTEND_CHOICES_S[0]


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
    ``timezone``) against ``budget_micros`` (None: no budget), ``fleet`` every unreleased
    instance of the team (theirs included), by name. ``mine`` comes nearest deadline first
    (see :func:`nearest_first`)."""

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

    @property
    def budget_used_pct(self) -> int | None:
        """Whole percent of the budget spent (rounded down); None without a budget."""
        if self.budget_micros is None:
            return None
        if self.budget_micros <= 0:
            return 100
        return self.spent_micros * 100 // self.budget_micros


def home_view(rt: Runtime, user_id: str) -> HomeView:
    """The Home of ``user_id`` now. Raises StoreError when the database fails."""
    now = rt.now()
    tz = rt.settings.tz()
    overview = fleet_views.list_instances(rt)
    spent = budgets.month_to_date(rt.db, now, tz)
    with rt.db.session() as session:
        budget = session.exec(
            select(Budget).where(Budget.scope == "user", Budget.subject == user_id)
        ).first()
        limit = None if budget is None else budget.limit_micros
    fleet = tuple(_instance(rt, row, user_id, now) for row in overview.rows)
    jobs = tuple(
        HomeJob(
            id=job.id,
            instance_name=row.instance.name,
            command=job.command,
            started_at=job.started_at,
        )
        for row in overview.rows
        for job in row.running_jobs
        if job.requested_by == user_id
    )
    return HomeView(
        user_id=user_id,
        now=now,
        timezone=rt.settings.timezone,
        currency=rt.settings.currency,
        month=ledger.month_of(now, tz),
        mine=nearest_first(item for item in fleet if item.owner_id == user_id),
        jobs=jobs,
        spent_micros=spent.by_user.get(user_id, 0),
        budget_micros=limit,
        fleet=fleet,
    )


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
        delivered_gpu_name=_delivered_name(row),
        delivered_gpu_count=len(row.mismatch.delivered_names) if row.mismatch else None,
    )


def _delivered_name(row: InstanceRow) -> str | None:
    """The model the agent found, where the GPUs are not what was rented (several models
    joined); None when they are."""
    if row.mismatch is None:
        return None
    names = sorted(set(row.mismatch.delivered_names))
    return ", ".join(names) if names else None
