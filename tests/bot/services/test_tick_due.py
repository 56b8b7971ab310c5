"""What is due is looked up first: a tick with nothing due makes one query for the checked
steps and skips them; a step with work runs, and the steps after it see what it made. Each
step selects by the clause its module exports, and its check is true exactly when that clause
finds a row."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import literal_column
from sqlmodel import select

from bot.runtime import Runtime
from bot.services import prompt_kinds
from bot.services import tick as tick_module
from bot.services.instances import deadlines, launches, polling, releases, rent
from bot.services.jobs import runs as jobs
from bot.services.jobs.views import FINAL_STATES
from bot.services.money import ledger
from bot.services.speaking import outbox, prompts
from bot.services.tick import DUE_CLAUSES, tick
from bot.store.models import Instance, Job, Launch, OutboxMessage, Prompt, Release
from tests.bot.services.support import (
    T0,
    Clock,
    add_instance,
    counting_statements,
    get_instance,
    make_runtime,
    selects,
)

#: Not the first tick of a FULL_TICK_EVERY_S slot: the checks decide.
MID_SLOT = T0 + timedelta(seconds=90)


def test_a_tick_with_nothing_due_asks_once_and_skips_the_checked_steps(db):
    clock = Clock(MID_SLOT)
    rt = make_runtime(db, clock, poll_interval_s=60)
    for n in range(20):
        add_instance(
            rt.db,
            name=f"box{n}",
            deadline_at=T0 + timedelta(days=1),
            last_polled_at=MID_SLOT,
            poll_due_at=MID_SLOT + timedelta(seconds=30),
            ledger_due_at=T0 + timedelta(hours=1),
        )
    with counting_statements(rt.db) as statements:
        report = tick(rt, clock.now)
    assert report.errors == []
    assert sorted(report.skipped) == sorted(DUE_CLAUSES)
    assert all(report.durations_s[name] == 0.0 for name in DUE_CLAUSES)
    # One SELECT for every checked step, and the digest's own (it has no check).
    assert len(selects(statements)) == 3, selects(statements)


def test_the_first_tick_of_a_slot_runs_every_step(sqlite_db):
    rt = make_runtime(sqlite_db, Clock(T0), poll_interval_s=60)
    assert tick_module._full_tick(rt, T0)
    assert tick(rt, T0).skipped == []
    assert tick(rt, T0 + timedelta(seconds=30)).skipped == sorted(
        DUE_CLAUSES, key=list(DUE_CLAUSES).index
    )


def test_a_step_s_work_is_seen_by_the_steps_after_it_in_the_same_tick(sqlite_db):
    clock = Clock(MID_SLOT)
    rt = make_runtime(sqlite_db, clock, poll_interval_s=10**7, channel="COPS")
    warned = add_instance(
        rt.db, name="warned", deadline_at=MID_SLOT + timedelta(minutes=20), last_polled_at=T0
    )
    released = add_instance(rt.db, name="gone", last_polled_at=T0)
    releases.request_release(rt, released, reason="user", requested_by="UOWNER", now=MID_SLOT)
    with rt.db.session() as session:
        outbox.enqueue(
            session, key="k1", kind="notice", recipient="COPS", text="hello", now=MID_SLOT
        )
    report = tick(rt, clock.now)
    # deadlines made a warning, the prompts step posted it; the due release and message went.
    assert "deadlines" not in report.skipped
    assert report.prompts_posted == 1
    assert rt.notifier.containing("*warned* will be released")
    assert report.outbox_posted >= 1
    assert report.releases_processed == 1
    assert get_instance(rt.db, released).state == "awaiting_confirmation"  # manual: owner confirms
    assert get_instance(rt.db, warned).state == "active"
    assert {"poll", "idle", "jobs_done", "jobs", "budgets"} <= set(report.skipped)


def test_a_failing_lookup_runs_every_step(sqlite_db, monkeypatch):
    rt = make_runtime(sqlite_db, Clock(MID_SLOT), poll_interval_s=60)

    def broken(rt: Any, now: datetime) -> Any:
        raise RuntimeError("a check that breaks")

    monkeypatch.setitem(DUE_CLAUSES, "poll", (Instance, broken))
    report = tick(rt, MID_SLOT)
    assert report.skipped == []
    assert report.errors == []


def test_a_clock_that_steps_past_the_tick_interval_still_reconciles_every_slot(sqlite_db):
    """The console's `:tick` steps by the poll interval (60 s) while ticks are 30 s apart: a
    reconcile slot that starts between two of its ticks is still reconciled, once."""
    rt = make_runtime(sqlite_db, Clock(T0), poll_interval_s=60, tick_interval_s=30)
    start = T0 + timedelta(seconds=45)  # the 5-minute slots start 15 s after a tick
    reconciled = []
    for step in range(30):
        now = start + timedelta(minutes=step)
        if "reconcile" in tick(rt, now).durations_s:
            reconciled.append(now)
    assert [at - start for at in reconciled] == [timedelta(minutes=m) for m in (5, 10, 15, 20, 25)]


# --- each check is its step's own clause ---------------------------------------------------------

#: Offsets (seconds from T0) the rows' times take: on either side of every boundary a check
#: compares with (the warnings, the idle window, the claim leases, the poll interval).
_OFFSETS_S = (-7200, -1801, -1800, -1799, -600, -300, -121, -120, -61, -60, -1, 0, 1, 60, 1800)


def _at(rng: random.Random, none_share: float = 0.3) -> datetime | None:
    if rng.random() < none_share:
        return None
    return T0 + timedelta(seconds=rng.choice(_OFFSETS_S))


def _fleet(rt: Runtime, seed: int) -> None:
    """Varied rows for every checked step, their times on and beside each boundary."""
    rng = random.Random(seed)
    kinds = [*prompt_kinds.PROMPT_NOTICES, "warning", "idle", "jobs_done", "other"]
    instance_ids = []
    for n in range(24):
        state = rng.choice(("active", "active", "stopped", "released", "provisioning"))
        instance_ids.append(
            add_instance(
                rt.db,
                name=f"box{n}",
                owner_id=rng.choice(("UOWNER", "UOTHER")),
                state=state,
                deadline_at=_at(rng),
                lifetime_cap_at=_at(rng, 0.6),
                idle_since=_at(rng, 0.5),
                stopped_remind_at=_at(rng, 0.5),
                release_when_done=rng.random() < 0.2,
                ledger_settled=rng.random() < 0.5,
                ledger_due_at=_at(rng),
                released_at=_at(rng, 0.7),
                last_polled_at=_at(rng, 0),
                poll_due_at=_at(rng),
            )
        )
    with rt.db.session() as session:
        for n in range(30):
            session.add(
                Job(
                    instance_id=rng.choice(instance_ids),
                    agent_job_id=f"j{n}",
                    requested_by="UOWNER",
                    command_json="[]",
                    state=rng.choice(("queued", "running", *sorted(FINAL_STATES))),
                    release_when_done=rng.random() < 0.2,
                    replied_at=_at(rng, 0.5),
                    reply_claimed_at=_at(rng, 0.5),
                )
            )
            session.add(
                Prompt(
                    instance_id=rng.choice(instance_ids),
                    kind=rng.choice(kinds),
                    key=f"p{n}",
                    recipient="UOWNER",
                    due_at=_at(rng, 0) or T0,
                    sent_at=_at(rng, 0.6),
                    delivery=rng.choice((None, None, "posted")),
                    message_ts=rng.choice((None, "1.0")),
                    resolved_at=_at(rng, 0.7),
                )
            )
            session.add(
                OutboxMessage(
                    key=f"o{n}",
                    kind="notice",
                    recipient="COPS",
                    text="hello",
                    due_at=_at(rng, 0) or T0,
                    claimed_at=_at(rng, 0.6),
                    delivery=rng.choice((None, None, "posted")),
                )
            )
            session.add(
                Release(
                    instance_id=rng.choice(instance_ids),
                    reason="user",
                    requested_by="UOWNER",
                    requested_at=T0 - timedelta(hours=3),
                    state=rng.choice((*releases.OPEN_STATES, "done", "failed")),
                    next_attempt_at=_at(rng),
                )
            )
            session.add(
                Launch(
                    launch_key=f"l{n}",
                    position=1,
                    provider="scripted",
                    instance_type="gpu",
                    renter="UOWNER",
                    state=rng.choice(launches.STATES),
                    lease_until=_at(rng, 0) or T0,
                    started_at=T0 - timedelta(hours=1),
                    changed_at=T0 - timedelta(hours=1),
                )
            )


def _selected(rt: Runtime, name: str, now: datetime) -> bool:
    """Whether step ``name``'s own clause finds a row at ``now``."""
    model, clause = DUE_CLAUSES[name]
    query = select(literal_column("1")).select_from(model).where(clause(rt, now)).limit(1)
    with rt.db.session() as session:
        return session.exec(query).first() is not None


def _checks(rt: Runtime, now: datetime) -> dict[str, bool]:
    with rt.db.session() as session:
        row = session.execute(tick_module._probe(rt, now)).one()
    return {name: bool(value) for name, value in row._mapping.items()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_check_is_true_exactly_when_its_step_s_clause_finds_a_row(db, seed):
    rt = make_runtime(db, Clock(T0), poll_interval_s=60, warning_offsets_s=(1800, 600))
    _fleet(rt, seed)
    shifts_s = (0, 1, -1, 60, 120, 300, 600, 1800, -1800, -7200)
    times = sorted({T0 + timedelta(seconds=o + s) for o in _OFFSETS_S for s in shifts_s})
    seen: dict[str, set[bool]] = {name: set() for name in DUE_CLAUSES}
    for now in times:
        checks = _checks(rt, now)
        assert set(checks) == set(DUE_CLAUSES)
        for name in DUE_CLAUSES:
            assert checks[name] == _selected(rt, name, now), (name, now)
            seen[name].add(checks[name])
    # The times span both answers for the steps whose work depends on the clock.
    for name in ("poll", "deadlines", "idle", "stopped", "prompts", "outbox", "rent_orphans"):
        assert seen[name] == {False, True}, name


def test_an_empty_store_is_due_nowhere(sqlite_db):
    rt = make_runtime(sqlite_db, Clock(T0))
    assert not any(_checks(rt, T0).values())


def _recording(monkeypatch: pytest.MonkeyPatch, module: Any, attr: str) -> list[Any]:
    """Wrap ``module.attr`` so that the clauses it returns are kept."""
    made: list[Any] = []
    original = getattr(module, attr)

    def wrapped(*args: Any) -> Any:
        made.append(original(*args))
        return made[-1]

    monkeypatch.setattr(module, attr, wrapped)
    return made


#: Each checked step as the tick runs it, and the exported clauses its query is built from.
_STEPS: dict[str, tuple[Any, tuple[tuple[Any, str], ...]]] = {
    "poll": (lambda rt, now: polling.poll_instances(rt, now), ((polling, "due_clause"),)),
    "jobs": (jobs.poll_all, ((jobs, "poll_clause"), (jobs, "reply_clause"))),
    "ledger": (ledger.ledger_tick, ((ledger, "due_clause"),)),
    "deadlines": (deadlines.check_deadlines, ((deadlines, "deadlines_due_clause"),)),
    "idle": (deadlines.check_idle, ((deadlines, "idle_due_clause"),)),
    "jobs_done": (deadlines.check_jobs_done, ((deadlines, "jobs_done_due_clause"),)),
    "stopped": (deadlines.check_stopped, ((deadlines, "stopped_due_clause"),)),
    "refresh": (deadlines.refresh_prompts, ((deadlines, "refresh_due_clause"),)),
    "prompts": (
        lambda rt, now: prompts.deliver_pending(rt, now, prompt_kinds.PROMPT_NOTICES),
        ((prompts, "due_clause"),),
    ),
    "outbox": (outbox.deliver_due, ((outbox, "due_clause"),)),
    "releases": (releases.process_due_releases, ((releases, "due_clause"),)),
    "rent_orphans": (rent.recover_orphans, ((launches, "due_clause"),)),
}


@pytest.mark.parametrize("name", sorted(_STEPS))
def test_each_step_selects_by_the_clause_its_check_is_made_of(sqlite_db, monkeypatch, name):
    rt = make_runtime(sqlite_db, Clock(MID_SLOT), poll_interval_s=60)
    step, exported = _STEPS[name]
    made = [_recording(monkeypatch, module, attr) for module, attr in exported]
    step(rt, MID_SLOT)
    assert all(made), f"{name} does not select by {exported}"


def test_every_checked_step_names_its_clause():
    assert set(_STEPS) | {"budgets"} == set(DUE_CLAUSES)


def test_rows_a_rule_works_on_make_its_check_true(sqlite_db):
    """What check_deadlines, check_stopped and the releases step work on is what their
    clause selects; at a time their clause finds nothing, they do nothing."""
    rt = make_runtime(sqlite_db, Clock(T0), poll_interval_s=10**7, warning_offsets_s=(1800, 600))
    near = add_instance(rt.db, name="near", deadline_at=T0 + timedelta(seconds=1800))
    add_instance(rt.db, name="far", deadline_at=T0 + timedelta(seconds=1801))
    stopped = add_instance(
        rt.db,
        name="cold",
        state="stopped",
        stopped_at=T0 - timedelta(days=1),
        stopped_remind_at=T0,
    )
    early = T0 - timedelta(seconds=1)
    assert not _checks(rt, early)["deadlines"]
    assert not _checks(rt, early)["stopped"]
    assert deadlines.check_deadlines(rt, early) == []
    assert deadlines.check_stopped(rt, early) == []
    assert _checks(rt, T0)["deadlines"]
    assert _checks(rt, T0)["stopped"]
    deadlines.check_deadlines(rt, T0)
    with rt.db.session() as session:
        warned = {p.instance_id for p in session.exec(select(Prompt)).all()}
    assert warned == {near}
    assert deadlines.check_stopped(rt, T0) == [stopped]
    releases.request_release(rt, near, reason="user", requested_by="UOWNER", now=T0)
    assert _checks(rt, T0)["releases"]
    with rt.db.session() as session:
        due = set(session.exec(select(Release.id).where(releases.due_clause(T0))).all())
    taken = releases.process_due_releases(rt, T0)
    assert taken
    assert set(taken) <= due
