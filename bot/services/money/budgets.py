"""Monthly budgets per user or project: admins set them; alerts at 50, 80 and 100%; past the
cap, new rentals and extensions need an admin (:func:`check_budget`).

A month's spend against a budget is this month so far (bot.services.money.costs.month_to_date, the
figure `/gpu spend` shows): every charge of the month (the month in the configured zone) on the
user's instances (``owner_id``) or the project's (``project``), plus what running instances owe
beyond their charges (the open hour, and the rounding a release now would add).

Alerts are decided once per budget, month and threshold: the alert rows (unique) and the
alert's messages in the outbox are written in one transaction, so a crash either leaves both
or neither; the outbox posts each message once and retries or escalates one that fails.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from sqlalchemy import exc as sa_exc
from sqlmodel import col, delete, select

from bot.errors import BudgetExceeded, NotAuthorized, NotFound, UsageError
from bot.i18n import t
from bot.notify import Notice
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.money import costs, ledger
from bot.services.speaking import audit, outbox
from bot.services.speaking.people import resolve_person
from bot.store import models
from bot.store.db import Database
from bot.store.models import Budget, Person
from bot.values import format_money

log = logging.getLogger(__name__)

SCOPES = ("user", "project")
THRESHOLDS = (50, 80, 100)
MAX_LIMIT_MICROS = 10**15


@dataclass(frozen=True)
class BudgetStatus:
    """A budget and this month's spend against it (micros)."""

    budget_id: int
    scope: str
    subject: str
    limit_micros: int
    spent_micros: int

    @property
    def used_pct(self) -> int:
        """Whole percent used, rounded down."""
        if self.limit_micros <= 0:
            return 100
        return self.spent_micros * 100 // self.limit_micros

    @property
    def exceeded(self) -> bool:
        """True once spend reached the limit."""
        return self.spent_micros >= self.limit_micros


@dataclass(frozen=True)
class BudgetAlert(Notice):
    """A budget crossed ``threshold_pct`` (50, 80 or 100) of its monthly limit; amounts in
    ``currency``."""

    status: BudgetStatus
    threshold_pct: int
    currency: str


@dataclass(frozen=True)
class Spent:
    """Month-to-date spend in micros per user (owner) and per project."""

    by_user: dict[str, int]
    by_project: dict[str, int]

    def of(self, scope: str, subject: str) -> int:
        """Spend of one budget subject."""
        table = self.by_user if scope == "user" else self.by_project
        return table.get(subject, 0)


def parse_scope(text: str) -> str:
    """``user`` or ``project``. Raises UsageError."""
    scope = text.strip().lower()
    if scope not in SCOPES:
        raise UsageError(
            t("{text!r} is not a budget kind", text=text), hint=t("Use `user` or `project`.")
        )
    return scope


def parse_subject(scope: str, text: str) -> str:
    """A user as ``<@U123>``, ``<@U123|name>`` or ``U123``; a project as its name.

    Raises UsageError for anything else."""
    raw = text.strip()
    if scope == "project":
        if not raw or len(raw) > 100 or any(c.isspace() for c in raw):
            raise UsageError(
                t("{text!r} is not a project name", text=text), hint=t("Use a name like `llm`.")
            )
        return raw
    mention = access.parse_mention(raw)
    if mention is not None:
        return mention[0]
    member_id = access.parse_member_id(raw)
    if member_id is not None:
        return member_id
    raise UsageError(
        t("{text!r} is not a Slack user", text=text),
        hint=t("Mention the person, like `/gpu budget set user @alice 500`."),
    )


def resolve_subject(db: Database, scope: str, text: str, caller: Caller | None = None) -> str:
    """Like :func:`parse_subject`, and a user also as ``@name``, read as every command reads a
    person (:func:`bot.services.speaking.people.resolve_person`). Raises UsageError when nobody, or
    more
    than one person, has that name."""
    raw = text.strip()
    if scope != "user" or not raw.startswith("@") or raw.startswith("<@"):
        return parse_subject(scope, text)
    with db.session() as session:
        person_id, _ = resolve_person(session, raw, caller=caller)
    return person_id


def mention_name(text: str) -> str | None:
    """The name in a Slack mention ``<@U123|name>``, if it carries one."""
    mention = access.parse_mention(text)
    name = (mention[1] or "").strip() if mention is not None else ""
    return name[:200] or None


def set_budget(
    rt: Runtime,
    caller: Caller,
    scope: str,
    subject: str,
    limit_micros: int,
    *,
    display_name: str | None = None,
) -> BudgetStatus:
    """Create or change a budget (admins only); ``display_name`` is remembered for a user
    the bot knew by ID only. Raises NotAuthorized, UsageError."""
    _require_admin(rt, caller, t("set budgets"))
    if not 0 < limit_micros <= MAX_LIMIT_MICROS:
        raise UsageError(t("a budget must be more than 0"), hint=t("Give an amount like 500."))
    now = rt.now()
    try:
        budget = _upsert(rt.db, caller, scope, subject, limit_micros, now, display_name)
    except sa_exc.IntegrityError:
        # Another admin created it at the same moment: change theirs.
        budget = _upsert(rt.db, caller, scope, subject, limit_micros, now, display_name)
    spent = month_to_date(rt.db, now, rt.settings.tz())
    return _status(budget, spent)


def remove_budget(rt: Runtime, caller: Caller, scope: str, subject: str) -> None:
    """Delete a budget and its alerts (admins only). Raises NotAuthorized, NotFound."""
    _require_admin(rt, caller, t("remove budgets"))
    with rt.db.session() as session:
        budget = session.exec(
            select(Budget).where(Budget.scope == scope, Budget.subject == subject)
        ).first()
        if budget is None or budget.id is None:
            raise NotFound(
                t("There is no budget for {describe}.", describe=_describe(scope, subject)),
                hint=t("See them all with `/gpu budget list`."),
            )
        session.exec(
            delete(models.BudgetAlert).where(col(models.BudgetAlert.budget_id) == budget.id)
        )
        session.delete(budget)
        audit.record(
            session,
            caller.user_id,
            "budget_remove",
            None,
            at=rt.now(),
            scope=scope,
            subject=subject,
        )


def list_budgets(rt: Runtime, now: datetime) -> list[BudgetStatus]:
    """Every budget with this month's spend, users first, then projects, by name."""
    with rt.db.session() as session:
        budgets = list(session.exec(select(Budget)).all())
    spent = month_to_date(rt.db, now, rt.settings.tz())
    statuses = [_status(budget, spent) for budget in budgets]
    return sorted(statuses, key=lambda s: (SCOPES.index(s.scope), s.subject))


def month_to_date(db: Database, now: datetime, tz: ZoneInfo) -> Spent:
    """This month's spend so far per owner and per project, up to ``now``: the sums of
    :func:`bot.services.money.costs.month_to_date`, the figure `/gpu spend` shows for the month."""
    by_user: dict[str, int] = defaultdict(int)
    by_project: dict[str, int] = defaultdict(int)
    for item in costs.month_to_date(db, now, tz).values():
        by_user[item.owner_id] += item.total_micros
        if item.project:
            by_project[item.project] += item.total_micros
    return Spent(dict(by_user), dict(by_project))


def check_budget(rt: Runtime, caller: Caller, owner_id: str, project: str | None) -> None:
    """Before a new rental or an extension: raise BudgetExceeded when the owner's or the
    project's monthly budget is used up, unless the caller is an admin."""
    if rt.settings.is_admin(caller.user_id):
        return
    with rt.db.session() as session:
        budgets = list(
            session.exec(
                select(Budget)
                .where(
                    ((Budget.scope == "user") & (Budget.subject == owner_id))
                    | ((Budget.scope == "project") & (Budget.subject == (project or "")))
                )
                .order_by(col(Budget.id))
            ).all()
        )
    if not budgets:
        return
    spent = month_to_date(rt.db, rt.now(), rt.settings.tz())
    for budget in budgets:
        status = _status(budget, spent)
        if status.exceeded:
            raise BudgetExceeded(
                t(
                    "The monthly budget of {subject} is used up: {spent} of {limit}.",
                    subject=_describe(status.scope, status.subject),
                    spent=_money(rt, status.spent_micros),
                    limit=_money(rt, status.limit_micros),
                ),
                hint=t(
                    "New rentals and extensions need an admin now: ask one of {admins}, "
                    "or ask them to raise the budget.",
                    admins=_admins(rt),
                ),
            )


def check_alerts(rt: Runtime, now: datetime) -> list[tuple[int, int]]:
    """Queue (and try to post at once) the alerts for thresholds crossed this month; returns
    (budget id, threshold) decided now. Each alert is decided once, in the transaction that
    queues its messages; the outbox retries a post that fails."""
    tz = rt.settings.tz()
    month = ledger.month_of(now, tz)
    with rt.db.session() as session:
        budgets = list(session.exec(select(Budget).order_by(col(Budget.id))).all())
        sent = {
            (alert.budget_id, alert.threshold_pct)
            for alert in session.exec(
                select(models.BudgetAlert).where(models.BudgetAlert.month == month)
            )
        }
    if not budgets:
        return []
    spent = month_to_date(rt.db, now, tz)
    delivered: list[tuple[int, int]] = []
    for budget in budgets:
        status = _status(budget, spent)
        crossed = [
            t for t in THRESHOLDS if status.used_pct >= t and (status.budget_id, t) not in sent
        ]
        if not crossed:
            continue
        # One message for the highest threshold crossed; the lower ones are marked with it.
        queued = _queue_alert(rt, status, crossed, month, now)
        if queued is None:
            continue  # another process decided it
        for message_id in queued:
            outbox.deliver(rt, message_id)
        delivered.extend((status.budget_id, t) for t in crossed)
    return delivered


def budget_tick(rt: Runtime, now: datetime) -> None:
    """Tick hook: send the budget alerts that are due."""
    check_alerts(rt, now)


def _upsert(
    db: Database,
    caller: Caller,
    scope: str,
    subject: str,
    limit_micros: int,
    now: datetime,
    display_name: str | None,
) -> Budget:
    with db.session() as session:
        if scope == "user":
            person = session.get(Person, subject)
            if person is None:
                session.add(Person(slack_id=subject, display_name=display_name, created_at=now))
            elif person.display_name is None and display_name:
                person.display_name = display_name
                session.add(person)
        budget = session.exec(
            select(Budget).where(Budget.scope == scope, Budget.subject == subject)
        ).first()
        if budget is None:
            budget = Budget(
                scope=scope,
                subject=subject,
                limit_micros=limit_micros,
                created_by=caller.user_id,
                created_at=now,
            )
        else:
            budget.limit_micros = limit_micros
        session.add(budget)
        session.flush()
        audit.record(
            session,
            caller.user_id,
            "budget_set",
            None,
            at=now,
            scope=scope,
            subject=subject,
            limit_micros=limit_micros,
        )
        return budget


def _queue_alert(
    rt: Runtime, status: BudgetStatus, thresholds: list[int], month: str, now: datetime
) -> list[int] | None:
    """Mark ``thresholds`` alerted and queue the alert for the highest, in one transaction;
    returns the outbox ids, or None when another process marked them first."""
    top = max(thresholds)
    text, blocks = rt.message(BudgetAlert(status, top, rt.settings.currency))
    try:
        with rt.db.session() as session:
            for threshold in thresholds:
                session.add(
                    models.BudgetAlert(
                        budget_id=status.budget_id,
                        month=month,
                        threshold_pct=threshold,
                        sent_at=now,
                    )
                )
            session.flush()
            return [
                outbox.enqueue(
                    session,
                    key=f"budget:{status.budget_id}:{month}:{top}:{recipient}",
                    kind="budget_alert",
                    recipient=recipient,
                    text=text,
                    blocks=blocks,
                    now=now,
                )
                for recipient in _recipients(rt, status, top)
            ]
    except sa_exc.IntegrityError:
        return None


#: From this share of a person's budget on, the admins hear of it too (they decide what's next).
ADMINS_TOLD_AT_PCT = 100


def _recipients(rt: Runtime, status: BudgetStatus, threshold_pct: int) -> list[str]:
    """Who hears of an alert: a person's own budget goes to them, and once it is used up also
    to the ops channel (or, with none, every admin); a project's goes to the ops channel (or
    the admins)."""
    team = [rt.settings.channel] if rt.settings.channel else sorted(rt.settings.admins)
    if status.scope != "user":
        return team
    if threshold_pct < ADMINS_TOLD_AT_PCT:
        return [status.subject]
    return [status.subject, *(r for r in team if r != status.subject)]


def _status(budget: Budget, spent: Spent) -> BudgetStatus:
    return BudgetStatus(
        budget_id=budget.id or 0,
        scope=budget.scope,
        subject=budget.subject,
        limit_micros=budget.limit_micros,
        spent_micros=spent.of(budget.scope, budget.subject),
    )


def _require_admin(rt: Runtime, caller: Caller, action: str) -> None:
    if rt.settings.is_admin(caller.user_id):
        return
    raise NotAuthorized(
        t("Only an admin can {action}.", action=action),
        hint=t("Ask one of {admins}.", admins=_admins(rt)),
    )


def _admins(rt: Runtime) -> str:
    admins = sorted(rt.settings.admins)
    return ", ".join(f"<@{a}>" for a in admins) if admins else t("the admins (GPUBOT_ADMINS)")


def _describe(scope: str, subject: str) -> str:
    return f"<@{subject}>" if scope == "user" else t("project {name}", name=subject)


def _money(rt: Runtime, micros: int) -> str:
    return format_money(micros, rt.settings.currency)
