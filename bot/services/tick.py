"""One tick of the clock: everything the bot does on its own, in order.

``tick(rt, now)`` polls agents, runs the steps in ``TICK_STEPS`` (jobs, the ledger, budgets,
the digest), applies the rules (deadlines, idle, release-when-done), works on due releases,
terminates rentals the bot launched but never registered because it stopped in between (each
Launch row claimed by one process), reconciles with the providers' own lists (one process alone
does this in each slot, by a StepClaim row), closes prompts that no longer apply and posts the
prompts and the outbox's messages that are due (before any platform is asked anything). Every
step reads and writes rows, so running it late, twice, or from two processes neither drops nor
doubles anything. A step that fails is logged and the others still run. Each tick runs under
a request id of its own, and a step that fails tick after tick is logged once with its
traceback, then once a minute (by the tick's clock) with how often it failed
(``STEP_FAILURES``), and once when it works again.

Time budgets (seconds): each step may take a share of ``settings.tick_interval_s``
(``STEP_SHARES``, else ``DEFAULT_STEP_SHARE``, never under ``MIN_STEP_BUDGET_S``). At the default
30 s interval polling and releases get 6 s, posting prompts 3 s and every other step 1.5 s; a
tick's shares add up to less than one interval (reconciling, once every ``RECONCILE_EVERY_S``
and then only without platform pools, comes on top). The tick measures every step, failed ones
too, on ``bot.timebox.monotonic`` into ``TickReport.durations_s``; a step that runs past its
budget is named in ``TickReport.over_budget`` and in a logged warning, and the steps after it
still run. Polling, releases and orphaned rentals also honour their budget: once it is spent
they take no new instance, release or rental, and what is left stays due for the next tick,
first in line; the item in hand is finished, so they can overrun by one item (bounded by the SSH
command timeout, or the platform's HTTP timeout). The ledger (``TIMEBOXED_STEPS``) and the prune
of raw samples honour theirs in slices of rows, each resuming from the store where the last one
stopped, and begin no slice that would not fit. The other steps are measured only: the rules
and ``TICK_STEPS`` work on rows, and posting takes every due message, each bounded by Slack's
timeout.

What is due is looked up first: one statement says which steps have work, and the others are
skipped (named in ``TickReport.skipped``, measured as 0 s), so a tick with nothing due costs
about one query. Each step's module exports the clause its own query selects by
(``DUE_CLAUSES``), and the check is that clause as an indexed ``EXISTS`` per term of its OR: true
exactly when the step would select a row. After a step that had work the checks are made again,
since it may have made work for the steps after it (a warning to post, a release to work on).
Steps without a check always run, and the first tick of every ``FULL_TICK_EVERY_S`` slot of the
clock runs every step whatever the checks say.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy import exists, literal_column, or_, true
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import BooleanClauseList
from sqlmodel import select

from bot.errors import GpubotError
from bot.logging_setup import RepeatLimiter, request_context
from bot.runtime import Runtime
from bot.services import prompt_kinds
from bot.services.instances import deadlines, polling, reconcile, releases, rent
from bot.services.jobs import runs as jobs
from bot.services.money import bills, budgets, digest, ledger, samples
from bot.services.speaking import outbox, prompts
from bot.store.models import (
    Budget,
    Instance,
    Job,
    Launch,
    OutboxMessage,
    Prompt,
    Release,
    StepClaim,
)
from bot.timebox import Timebox

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A step of the tick: called as ``fn(rt, now)``; what it returns is not used.
Step = Callable[[Runtime, datetime], object]

#: The steps run after the agents are polled and before the rules, in order, by step name.
TICK_STEPS: list[tuple[str, Step]] = [
    ("jobs", jobs.poll_all),
    ("ledger", ledger.ledger_tick),
    ("budgets", budgets.budget_tick),
    ("digest", digest.digest_tick),
    ("bills", bills.bills_tick),
]

#: The steps of ``TICK_STEPS`` that take their time budget as ``box=`` and leave the rest of
#: their work for the next tick once it is spent.
TIMEBOXED_STEPS = frozenset({"ledger"})

#: How often the providers' lists are compared with the store.
RECONCILE_EVERY_S = 300
#: How often raw utilisation samples past their retention are pruned (one process per slot).
PRUNE_EVERY_S = 300
#: The pool (and the work's key) of reconciling, with the platform pools.
RECONCILE = "reconcile"
#: Every step runs on the first tick of each slot this long, whatever the due checks say.
FULL_TICK_EVERY_S = 300

#: A step's time budget as a share of the tick interval, by step name.
STEP_SHARES: dict[str, float] = {"poll": 0.2, "releases": 0.2, "prompts": 0.1}
#: The share of every step not in ``STEP_SHARES``.
DEFAULT_STEP_SHARE = 0.05
#: No step's budget is shorter than this many seconds, however short the interval.
MIN_STEP_BUDGET_S = 1.0

_EPOCH = datetime(1970, 1, 1)
#: Failing steps (and the look-up of what is due, as ``due``) logged at most once a minute.
STEP_FAILURES = RepeatLimiter()
#: Characters of an error's message shown on a repeated failure's line.
FAILURE_TEXT_CHARS = 200


@dataclass
class TickReport:
    """What one tick did; ``errors`` names the steps that failed, ``durations_s`` says how long
    each step took (seconds, summed when a step ran twice) and ``over_budget`` names those that
    ran past their budget. ``interval_s`` is the tick interval the budgets derive from (None:
    steps are measured against no budget). ``skipped`` names the steps left out because
    nothing was due for them."""

    now: datetime
    interval_s: float | None = None
    durations_s: dict[str, float] = field(default_factory=dict)
    over_budget: list[str] = field(default_factory=list)
    polled: int = 0
    released_requested: list[int] = field(default_factory=list)
    releases_processed: int = 0
    reconciled: list[int] = field(default_factory=list)
    orphans_terminated: list[str] = field(default_factory=list)
    prompts_closed: int = 0
    prompts_posted: int = 0
    outbox_posted: int = 0
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def tick(rt: Runtime, now: datetime | None = None) -> TickReport:
    """Run every step once at ``now`` (naive UTC; default the runtime's clock), under a
    request id of its own."""
    with request_context():
        return _tick(rt, now or rt.now())


def _tick(rt: Runtime, now: datetime) -> TickReport:
    try:
        return _tick_steps(rt, now)
    finally:
        _remember_tick(rt, now)


def _tick_steps(rt: Runtime, now: datetime) -> TickReport:
    report = TickReport(now=now, interval_s=rt.settings.tick_interval_s)
    run = partial(_run_due, report, _Due(rt, now, full=_full_tick(rt, now)))
    poll = partial(polling.poll_instances, rt, now)
    report.polled = len(run("poll", lambda: poll(timebox=_box(report, "poll"))) or ())
    for name, step in TICK_STEPS:
        if name in TIMEBOXED_STEPS:
            run(name, partial(_boxed, report, name, step, rt, now))
        else:
            run(name, partial(step, rt, now))
    rules: tuple[tuple[str, Callable[[Runtime, datetime], list[int]]], ...] = (
        ("deadlines", deadlines.check_deadlines),
        ("idle", deadlines.check_idle),
        ("jobs_done", deadlines.check_jobs_done),
    )
    for name, rule in rules:
        report.released_requested.extend(run(name, partial(rule, rt, now)) or ())
    run("stopped", partial(deadlines.check_stopped, rt, now))
    # What people must hear goes out before the platforms are asked anything.
    report.prompts_closed = run("refresh", lambda: deadlines.refresh_prompts(rt, now)) or 0
    post = partial(prompts.deliver_pending, rt, now, prompt_kinds.PROMPT_NOTICES)
    report.prompts_posted = run("prompts", post) or 0
    report.outbox_posted = run("outbox", lambda: outbox.deliver_due(rt, now)) or 0
    due = partial(releases.process_due_releases, rt, now)
    processed = run("releases", lambda: due(timebox=_box(report, "releases")))
    report.releases_processed = len(processed or ())
    recover = partial(rent.recover_orphans, rt, now)
    orphans = run("rent_orphans", lambda: recover(timebox=_box(report, "rent_orphans")))
    report.orphans_terminated = orphans or []
    if _slot(now, PRUNE_EVERY_S) != _slot(_previous(rt, now), PRUNE_EVERY_S) and _claimed(
        rt, report, "prune", _slot(now, PRUNE_EVERY_S)
    ):
        _run(report, "prune", lambda: samples.prune(rt, now, box=_box(report, "prune")))
    reconcile_slot = _slot(now, _reconcile_every(rt))
    if _reconcile_due(rt, now) and _claimed(rt, report, "reconcile", reconcile_slot):
        if rt.platform_work is None:
            _reconcile(rt, now, report)
        else:
            rt.platform_work.submit(RECONCILE, RECONCILE, partial(_reconcile, rt, now, None))
    return report


def _boxed(
    report: TickReport, name: str, step: Callable[..., object], rt: Runtime, now: datetime
) -> object:
    """Run ``step`` with its time budget, opened now."""
    return step(rt, now, box=_box(report, name))


def _reconcile(rt: Runtime, now: datetime, report: TickReport | None) -> None:
    """Compare the platforms' lists with the store."""
    into = report or TickReport(now=now, interval_s=rt.settings.tick_interval_s)
    into.reconciled = _run(into, "reconcile", lambda: reconcile.reconcile(rt, now)) or []
    # What reconciling found out (stopped or released outside the bot) is said at once.
    _run(into, "prompts", lambda: prompts.deliver_pending(rt, now, prompt_kinds.PROMPT_NOTICES))
    _run(into, "outbox", lambda: outbox.deliver_due(rt, now))


# --- what is due -------------------------------------------------------------------------------

#: A step's due clause: ``clause(rt, now)`` is the WHERE its own query selects by at ``now``
#: (naive UTC), exported by the step's module.
DueClause = Callable[[Runtime, datetime], Any]


def _now_only(clause: Callable[[datetime], Any]) -> DueClause:
    return lambda _rt, now: clause(now)


def _every_row(_rt: Runtime, _now: datetime) -> Any:
    """Every row: the step reads them all."""
    return true()


def _prompts_due(_rt: Runtime, now: datetime) -> Any:
    return prompts.due_clause(now, prompt_kinds.PROMPT_NOTICES)


#: The steps skipped when their own query would find nothing, by step name: the table that
#: query reads and the clause it selects by.
DUE_CLAUSES: dict[str, tuple[Any, DueClause]] = {
    "poll": (Instance, polling.due_clause),
    "jobs": (Job, _now_only(jobs.due_clause)),
    "ledger": (Instance, _now_only(ledger.due_clause)),
    "budgets": (Budget, _every_row),
    "deadlines": (Instance, deadlines.deadlines_due_clause),
    "idle": (Instance, deadlines.idle_due_clause),
    "jobs_done": (Instance, deadlines.jobs_done_due_clause),
    "stopped": (Instance, deadlines.stopped_due_clause),
    "refresh": (Prompt, deadlines.refresh_due_clause),
    "prompts": (Prompt, _prompts_due),
    "outbox": (OutboxMessage, _now_only(outbox.due_clause)),
    "releases": (Release, _now_only(releases.due_clause)),
    "rent_orphans": (Launch, _now_only(rent.due_clause)),
}


def _branches(clause: Any) -> list[Any]:
    """The terms of a clause that is an OR (each an indexed range), else the clause itself."""
    if isinstance(clause, BooleanClauseList) and clause.operator is operators.or_:
        return list(clause.clauses)
    return [clause]


def due_check(model: Any, clause: Any) -> Any:
    """True when a row of ``model`` meets ``clause``: one EXISTS per term of its OR."""
    return or_(
        *(
            exists(select(literal_column("1")).select_from(model).where(branch))
            for branch in _branches(clause)
        )
    )


def _probe(rt: Runtime, now: datetime) -> Any:
    """The one SELECT of every step's due check at ``now``, each as a column named after its
    step."""
    return select(
        *(
            due_check(model, clause(rt, now)).label(name)
            for name, (model, clause) in DUE_CLAUSES.items()
        )
    )


class _Due:
    """Which steps of one tick may have work: every check in one statement, made again after a
    step that had work. A check that fails counts as due."""

    def __init__(self, rt: Runtime, now: datetime, *, full: bool) -> None:
        self.rt, self.now, self.full = rt, now, full
        self.known: dict[str, bool] | None = None
        self.probe: Any = None  # built once a tick: the same statement at the same ``now``

    def __call__(self, name: str) -> bool:
        if self.full or name not in DUE_CLAUSES:
            return True
        if self.known is None:
            self.known = self._look()
        due = self.known.get(name, True)
        if due:
            self.known = None  # the step may make work for the steps after it
        return due

    def _look(self) -> dict[str, bool]:
        try:
            if self.probe is None:
                self.probe = _probe(self.rt, self.now)
            with self.rt.db.session() as session:
                row = session.execute(self.probe).one()
        except Exception as exc:  # noqa: BLE001 - logged; a failed check holds no step back
            _log_failure(self.now, "due", exc)
            self.full = True
            return {}
        _log_recovery(self.now, "due")
        return {name: bool(value) for name, value in row._mapping.items()}


def _full_tick(rt: Runtime, now: datetime) -> bool:
    """True on the first tick in each ``FULL_TICK_EVERY_S`` slot of the clock."""
    every = max(FULL_TICK_EVERY_S, rt.settings.tick_interval_s)
    return _slot(now, every) != _slot(_previous(rt, now), every)


def _run_due(report: TickReport, due: _Due, name: str, fn: Callable[[], T]) -> T | None:
    """Run step ``name`` when it may have work (see :class:`_Due`); otherwise name it in
    ``report.skipped`` with a duration of 0 s."""
    if due(name):
        return _run(report, name, fn)
    report.skipped.append(name)
    report.durations_s.setdefault(name, 0.0)
    return None


def _claimed(rt: Runtime, report: TickReport, step: str, slot: int) -> bool:
    """:func:`claim_step`, a store that fails counted as the step failing (logged once a
    minute, the tick going on) rather than raised out of the tick."""
    try:
        return claim_step(rt, step, slot)
    except GpubotError as exc:
        report.errors.append(step)
        _log_failure(report.now, step, exc)
        return False


def claim_step(rt: Runtime, step: str, slot: int) -> bool:
    """Whether this process does ``step`` in ``slot``: the first to store the claim does;
    another process, or a second tick in the same slot, does not."""
    try:
        with rt.db.session() as session:
            session.add(StepClaim(step=step, slot=slot, claimed_at=rt.now()))
    except sa_exc.IntegrityError:
        return False
    return True


#: When each runtime last ticked (by ``id``, dropped with the runtime): a clock that moves by
#: more than the tick interval (the console's `:tick`, a bot that slept) still sees every slot
#: boundary it crossed.
_LAST_TICKS: dict[int, datetime] = {}
_LAST_TICKS_LOCK = threading.Lock()


def _remember_tick(rt: Runtime, now: datetime) -> None:
    key = id(rt)
    with _LAST_TICKS_LOCK:
        if key not in _LAST_TICKS:
            weakref.finalize(rt, _forget_ticks, key)
        _LAST_TICKS[key] = now


def _forget_ticks(key: int) -> None:
    with _LAST_TICKS_LOCK:
        _LAST_TICKS.pop(key, None)


def _previous(rt: Runtime, now: datetime) -> datetime:
    """When the tick before this one ran: this runtime's last tick when it was earlier, else
    one interval ago."""
    with _LAST_TICKS_LOCK:
        last = _LAST_TICKS.get(id(rt))
    if last is not None and last < now:
        return last
    return now - timedelta(seconds=rt.settings.tick_interval_s)


def _reconcile_due(rt: Runtime, now: datetime) -> bool:
    """True on the first tick in each ``RECONCILE_EVERY_S`` slot of the clock (or the first
    after it, when the clock jumped past its start)."""
    every = _reconcile_every(rt)
    return _slot(now, every) != _slot(_previous(rt, now), every)


def _reconcile_every(rt: Runtime) -> float:
    return max(RECONCILE_EVERY_S, rt.settings.tick_interval_s)


def _slot(at: datetime, every: float) -> int:
    return int((at - _EPOCH).total_seconds() // every)


def step_budget_s(name: str, interval_s: float) -> float:
    """Seconds step ``name`` may take in a tick every ``interval_s`` seconds."""
    return max(STEP_SHARES.get(name, DEFAULT_STEP_SHARE) * interval_s, MIN_STEP_BUDGET_S)


def _box(report: TickReport, name: str) -> Timebox | None:
    """The time budget of step ``name``, opened now (None when the report has no interval)."""
    if report.interval_s is None:
        return None
    return Timebox.open(step_budget_s(name, report.interval_s))


def _run(report: TickReport, name: str, fn: Callable[[], T]) -> T | None:
    """Run one step: a failure is logged and named in ``report.errors``; its duration is
    recorded, and a run past its budget named in ``report.over_budget`` and logged."""
    box = _box(report, name) or Timebox.open(float("inf"))
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - logged; one failing step stops no other
        _log_failure(report.now, name, exc)
        report.errors.append(name)
        return None
    else:
        _log_recovery(report.now, name)
        return result
    finally:
        took = box.elapsed_s()
        report.durations_s[name] = report.durations_s.get(name, 0.0) + took
        if took > box.budget_s:
            log.warning(
                "tick step %s took %.1f s, past its budget of %.1f s", name, took, box.budget_s
            )
            if name not in report.over_budget:
                report.over_budget.append(name)


def _log_failure(now: datetime, name: str, exc: Exception) -> None:
    """Log step ``name`` failing at ``now``: with its traceback when it starts failing, then at
    most once a minute with a count (``STEP_FAILURES``)."""
    shown = STEP_FAILURES.admit(name, (now - _EPOCH).total_seconds())
    if shown is None:
        return
    what = _described(name)
    if shown.first:
        log.error("tick %s failed", what, exc_info=exc)
        return
    text = (str(exc).splitlines() or [""])[0][:FAILURE_TEXT_CHARS]
    log.error(
        "tick %s failed %d times in the last %.0f s (latest: %s: %s)",
        what,
        shown.count,
        shown.window_s,
        type(exc).__name__,
        text,
    )


def _log_recovery(now: datetime, name: str) -> None:
    """Log step ``name`` working again at ``now`` after failing, once the minute of its last
    failure's line is over (see ``STEP_FAILURES.settle``)."""
    held = STEP_FAILURES.settle(name, (now - _EPOCH).total_seconds())
    if held is not None:
        log.info("tick %s works again (%d failures since the last line)", _described(name), held)


def _described(name: str) -> str:
    return "look-up of what is due" if name == "due" else f"step {name}"
