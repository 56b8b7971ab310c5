"""The trust model (bot.services.access), rule by rule, on SQLite and PostgreSQL: real sshd
servers for the machines, the real agent, and the local transport only where the console is."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlmodel import select

from bot.errors import (
    BudgetExceeded,
    Conflict,
    LocalRefused,
    NotAuthorized,
    NotFound,
    UsageError,
)
from bot.fleet.base import LOCAL_HOST, Target
from bot.fleet.fleet import Fleet
from bot.fleet.keys import key_path
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import fleet_views, lifecycle, lookup, policies, registration
from bot.services.instances.registration import RegisterRequest
from bot.services.jobs import runs as jobs
from bot.services.money import budgets, ledger, spend
from bot.services.speaking import audit
from bot.store.db import Database
from bot.store.models import AuditLog, Charge, Instance, Job
from tests.bot.services.support import (
    Clock,
    RecordingNotifier,
    ScriptedPlatform,
    add_instance,
    grant_key,
    make_runtime,
)
from tests.fixtures.sshd import SshServer, start_sshd

pytestmark = pytest.mark.integration

ALICE = Caller(user_id="U0ALICE", channel_id="CTEAM", user_name="alice")
BOB = Caller(user_id="U0BOB", channel_id="CTEAM", user_name="bob")
ADMIN = Caller(user_id="UADMIN", channel_id="CTEAM")
USD = 1_000_000
UTC = ZoneInfo("UTC")


@pytest.fixture
def second_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """Another sshd for the same login user, with a host key of its own: another machine."""
    server = start_sshd(tmp_path_factory.mktemp("sshd2"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def slack_rt(db: Database, fake_gpu_zipapp: Path, sshd: SshServer) -> Iterator[Runtime]:
    """A runtime as Slack's (no console): machines over SSH, keys by name from sshd's dir."""
    rt = make_runtime(
        db,
        Clock(),
        notifier=RecordingNotifier(),
        ssh_key_dir=sshd.directory,
        ssh_connect_timeout_s=3.0,
        ssh_command_timeout_s=30.0,
    )
    rt.fleet = Fleet(rt.settings, zipapp_path=fake_gpu_zipapp)
    grant_key(db, sshd.client_key_path.name, ALICE.user_id, BOB.user_id)
    try:
        yield rt
    finally:
        rt.fleet.close()


def _on(server: SshServer, name: str, **changes: object) -> RegisterRequest:
    values: dict[str, object] = {
        "name": name,
        "address": f"{server.user}@{server.host}:{server.port}",
        "price_micros_per_hour": 2 * USD,
        "release_in": timedelta(hours=3),
        "key_name": server.client_key_path.name,
    }
    values.update(changes)
    return RegisterRequest(**values)  # type: ignore[arg-type]


def _live(db: Database) -> list[Instance]:
    with db.session() as session:
        return list(
            session.exec(
                select(Instance).where(Instance.state != "released").order_by(Instance.id)  # type: ignore[arg-type]
            ).all()
        )


def _audit_actions(db: Database) -> list[str]:
    with db.session() as session:
        return [row.action for row in session.exec(select(AuditLog).order_by(AuditLog.id)).all()]  # type: ignore[arg-type]


def _spend(rt: Runtime, clock: Clock) -> int:
    report = spend.spend_report(
        rt.db,
        ledger.month_of(clock.now, UTC),
        tz=UTC,
        now=clock.now,
        idle_threshold_pct=rt.settings.idle_threshold_pct,
        currency=rt.settings.currency,
    )
    return report.total_micros


# --- rule 1: local exists only in the console -------------------------------------------------


def test_local_is_refused_outside_the_console_in_every_form(db: Database, sshd: SshServer) -> None:
    rt = make_runtime(db, Clock())  # not the console's
    rt.fleet = Fleet(rt.settings)
    try:
        for request in (
            RegisterRequest(name="local", address="local"),
            RegisterRequest(name="box", address="local"),
            RegisterRequest(name="local", address="root@203.0.113.7"),
        ):
            with pytest.raises(NotAuthorized, match="only from the bot's own console"):
                registration.register(rt, ADMIN, request)
        with pytest.raises(NotAuthorized):
            registration.ensure_local_instance(rt, ALICE.user_id)
        # A `local` row in a store the console shares: Slack cannot see or reach it.
        local_id = add_instance(db, name="local", host=LOCAL_HOST, port=0, owner_id="U0ALICE")
        for call in (
            lambda: fleet_views.instance_detail(rt, "local"),
            lambda: fleet_views.health(rt, ALICE, "local"),
            lambda: lifecycle.extend(rt, ALICE, "local", timedelta(hours=1)),
            lambda: lifecycle.ask_release(rt, ALICE, "local"),
            lambda: lifecycle.release(rt, ALICE, local_id),
            lambda: lifecycle.confirm_released(rt, ALICE, local_id),
            lambda: lookup.instance_by_id(rt, local_id),
            lambda: jobs.submit(rt, ALICE, "local", ["id"]),
            lambda: jobs.list_jobs(rt, "local"),
            lambda: jobs.who(rt, "local"),
            lambda: jobs.logs(rt, ALICE, "local:20260101-000000-0001"),
            lambda: policies.set_lifetime_cap(rt, ADMIN, "local", timedelta(days=1)),
        ):
            with pytest.raises(NotFound):
                call()
        assert fleet_views.list_instances(rt).rows == ()
        assert _audit_actions(db) == []
        with pytest.raises(LocalRefused, match="only from the console"):
            rt.fleet.agent(Target(name="local", host=LOCAL_HOST, port=0, user="me")).status()
    finally:
        rt.fleet.close()


# --- rule 2: one machine, one live registration, one owner ------------------------------------


def test_a_held_machine_is_refused_to_others_by_address_host_key_or_any_name(
    slack_rt: Runtime, db: Database, sshd: SshServer
) -> None:
    registration.register(slack_rt, ALICE, _on(sshd, "alices"))
    attempts = [
        _on(sshd, "bobs"),  # the same address under another name
        _on(sshd, "alices"),  # the same name and address
        # Another address for the same machine: the pinned host key gives it away.
        _on(sshd, "bobs2", address=f"{sshd.user}@localhost:{sshd.port}"),
    ]
    for request in attempts:
        with pytest.raises(Conflict, match=r"already registered as alices, held by <@U0ALICE>"):
            registration.register(slack_rt, BOB, request)
    [inst] = _live(db)
    assert (inst.name, inst.owner_id) == ("alices", "U0ALICE")
    assert _audit_actions(db) == ["register"]
    # Bob cannot reach her machine through any name of his either.
    for call in (
        lambda: jobs.submit(slack_rt, BOB, "alices", ["id"]),
        lambda: lifecycle.release(slack_rt, BOB, inst.id or 0),
        lambda: fleet_views.health(slack_rt, BOB, "alices", full=True),
        lambda: lifecycle.extend(slack_rt, BOB, "alices", timedelta(hours=1)),
    ):
        with pytest.raises(NotAuthorized):
            call()


def test_the_owner_renames_and_an_admin_re_registers_the_same_registration(
    slack_rt: Runtime, db: Database, sshd: SshServer
) -> None:
    first = registration.register(slack_rt, ALICE, _on(sshd, "alices"))
    renamed = registration.register(slack_rt, ALICE, _on(sshd, "trainer", release_in=None))
    assert renamed.re_registered
    assert renamed.instance.id == first.instance.id
    again = registration.register(slack_rt, ADMIN, _on(sshd, "trainer", release_in=None))
    assert again.instance.owner_id == "U0ALICE"  # an admin's re-registration keeps the owner
    [inst] = _live(db)
    assert inst.name == "trainer"
    with pytest.raises(NotFound):
        fleet_views.instance_detail(slack_rt, "alices")
    assert _audit_actions(db) == ["register", "rename", "re_register"]
    with db.session() as session:
        row = session.exec(select(AuditLog).where(AuditLog.action == "rename")).one()
    details = audit.details(row)
    assert (details["before"]["name"], details["after"]["name"]) == ("alices", "trainer")
    assert details["before"]["host_key_fingerprint"] == sshd.host_key.fingerprint


def test_a_machine_is_one_registration_by_provider_id(slack_rt: Runtime, db: Database) -> None:
    platform = ScriptedPlatform()
    platform.name = "runpod"  # a platform with an API, scripted
    slack_rt.providers.add(platform)  # type: ignore[arg-type]
    add_instance(
        db,
        name="pod",
        owner_id="U0ALICE",
        provider="runpod",
        provider_instance_id="pod-123",
        host="203.0.113.7",
        port=40_001,
    )
    request = RegisterRequest(
        name="mine",
        address="root@203.0.113.8:40002",
        provider="runpod",
        provider_id="pod-123",
    )
    with pytest.raises(Conflict, match="held by <@U0ALICE>"):
        # Refused before the platform or the machine is asked anything.
        registration.register(slack_rt, BOB, request)
    assert len(_live(db)) == 1
    assert platform.release_calls == []


# --- rule 3: a re-registration is a change like any other -------------------------------------


def test_a_new_price_applies_from_then_on_and_status_spend_and_ledger_agree(
    local_rt: Runtime, db: Database
) -> None:
    rt = local_rt
    clock = rt.clock
    assert isinstance(clock, Clock)
    clock.set(clock.now.replace(minute=0))
    local = RegisterRequest(
        name="local",
        address="local",
        price_micros_per_hour=3_600_000,
        release_in=timedelta(hours=5),
    )
    registration.register(rt, ALICE, local)
    start = clock.now
    clock.advance(minutes=90)
    ledger.accrue(rt.db, clock.now, UTC)  # the first hour is charged at the old price
    registration.register(
        rt, ALICE, RegisterRequest(name="local", address="local", price_micros_per_hour=1_200_000)
    )
    assert fleet_views.list_instances(rt).rows[0].cost_micros == 5_400_000  # 1.5 h at $3.60
    clock.advance(minutes=60)
    [row] = fleet_views.list_instances(rt).rows
    assert row.cost_micros == 5_400_000 + 1_200_000  # then 1 h at $1.20
    ledger.accrue(rt.db, clock.now, UTC)
    with db.session() as session:
        charges = session.exec(select(Charge).order_by(Charge.start_at)).all()  # type: ignore[arg-type]
    assert [c.amount_micros for c in charges] == [3_600_000, 1_800_000, 600_000]
    assert [c.start_at - start for c in charges] == [
        timedelta(0),
        timedelta(hours=1),
        timedelta(minutes=90),
    ]
    # The ledger holds complete buckets; spend, like status, adds what the open half hour owes.
    assert sum(c.amount_micros for c in charges) == 6_000_000
    assert _spend(rt, clock) == row.cost_micros == 6_600_000
    inst_id = row.instance.id
    lifecycle.release(rt, ALICE, inst_id)
    lifecycle.confirm_released(rt, ALICE, inst_id)
    spent = _spend(rt, clock)  # accrues the charges the release made due
    with db.session() as session:
        charged = sum(c.amount_micros for c in session.exec(select(Charge)).all())
    assert charged == spent == fleet_views.instance_detail(rt, "local").row.cost_micros == 6_600_000
    with db.session() as session:
        re_register = session.exec(select(AuditLog).where(AuditLog.action == "re_register")).one()
    details = audit.details(re_register)
    assert (details["before"]["price_micros"], details["after"]["price_micros"]) == (
        3_600_000,
        1_200_000,
    )
    assert details["after"]["compute_carried_micros"] == 5_400_000


def test_a_later_deadline_by_re_registering_passes_the_budget_and_the_cap(
    local_rt: Runtime, db: Database
) -> None:
    rt = local_rt
    clock = rt.clock
    assert isinstance(clock, Clock)
    local = RegisterRequest(
        name="local",
        address="local",
        price_micros_per_hour=2 * USD,
        release_in=timedelta(hours=4),
        project="llm",
    )
    registration.register(rt, ALICE, local)
    budgets.set_budget(rt, ADMIN, "project", "llm", 3 * USD)
    clock.advance(hours=2)  # $4 of $3 spent
    longer = RegisterRequest(
        name="local", address="local", release_in=timedelta(hours=8), project="llm"
    )
    with pytest.raises(BudgetExceeded, match="project llm is used up"):
        registration.register(rt, ALICE, longer)
    [inst] = _live(db)
    assert inst.deadline_at == clock.now + timedelta(hours=2)
    # An earlier deadline needs nothing; an admin may go past the budget.
    registration.register(
        rt,
        ALICE,
        RegisterRequest(
            name="local", address="local", release_in=timedelta(hours=1), project="llm"
        ),
    )
    assert registration.register(rt, ADMIN, longer).instance.deadline_at == clock.now + timedelta(
        hours=8
    )
    policies.set_lifetime_cap(rt, ADMIN, "local", timedelta(hours=12))
    budgets.remove_budget(rt, ADMIN, "project", "llm")
    past_cap = RegisterRequest(name="local", address="local", release_in=timedelta(hours=11))
    with pytest.raises(NotAuthorized, match="a limit an admin set"):
        registration.register(rt, ALICE, past_cap)
    assert registration.register(rt, ADMIN, past_cap).instance.deadline_at == clock.now + timedelta(
        hours=11
    )


# --- rule 4: jobs and the reads that leak or disturb -------------------------------------------


def test_two_registrations_that_log_in_as_one_user_never_see_each_others_jobs(
    slack_rt: Runtime, db: Database, sshd: SshServer, second_sshd: SshServer
) -> None:
    assert sshd.user == second_sshd.user
    second_sshd.authorized_keys_path.write_text(  # type: ignore[union-attr]
        sshd.client_key_path.with_suffix(".pub").read_text()
    )
    request_a = _on(sshd, "alices")
    request_b = _on(second_sshd, "bobs")  # the bot's key, from the key directory
    a = registration.register(slack_rt, ALICE, request_a)
    b = registration.register(slack_rt, BOB, request_b)
    homes = {row.name: row.agent_home for row in _live(db)}
    assert homes["alices"] != homes["bobs"]
    assert a.instance.ssh_user == b.instance.ssh_user
    job_a = jobs.submit(slack_rt, ALICE, "alices", ["sleep", "30"]).job
    job_b = jobs.submit(slack_rt, BOB, "bobs", ["sleep", "30"]).job
    try:
        listed_a = {j.agent_job_id for j in jobs.list_jobs(slack_rt, "alices").jobs}
        listed_b = {j.agent_job_id for j in jobs.list_jobs(slack_rt, "bobs").jobs}
        assert listed_a == {job_a.agent_job_id}
        assert listed_b == {job_b.agent_job_id}
        # Bob names Alice's agent job through his own registration: his agent does not have it.
        with pytest.raises(NotFound, match="bobs has no job"):
            jobs.cancel(slack_rt, BOB, f"bobs:{job_a.agent_job_id}")
        with pytest.raises(NotFound, match="bobs has no job"):
            jobs.logs(slack_rt, BOB, f"bobs:{job_a.agent_job_id}")
        # And through hers, or by number, he is refused.
        for ref in (str(job_a.id), f"alices:{job_a.agent_job_id}"):
            with pytest.raises(NotAuthorized):
                jobs.cancel(slack_rt, BOB, ref)
            with pytest.raises(NotAuthorized, match="read the logs"):
                jobs.logs(slack_rt, BOB, ref)
    finally:
        jobs.cancel(slack_rt, ALICE, str(job_a.id))
        jobs.cancel(slack_rt, BOB, str(job_b.id))
    with db.session() as session:
        states = {row.agent_job_id: row.state for row in session.exec(select(Job)).all()}
    assert set(states.values()) <= {"cancelled", "running", "queued"}


def test_logs_and_the_full_health_check_are_for_the_owner_the_allowed_and_admins(
    local_rt: Runtime,
) -> None:
    rt = local_rt
    registration.register(rt, ALICE, RegisterRequest(name="local", address="local"))
    job = jobs.submit(rt, ALICE, "local", ["echo", "secret-token"]).job
    with pytest.raises(NotAuthorized, match="read the logs of jobs on local"):
        jobs.logs(rt, BOB, str(job.id))
    with pytest.raises(NotAuthorized, match="run the full health check on local"):
        fleet_views.health(rt, BOB, "local", full=True)
    assert fleet_views.health(rt, BOB, "local").checks  # the quick check is for everyone
    from bot.services.jobs import access as job_access

    job_access.allow(rt, ALICE, "local", "U0BOB")
    assert jobs.logs(rt, BOB, str(job.id)).job.id == job.id
    assert jobs.logs(rt, ADMIN, str(job.id)).job.id == job.id


# --- rule 7: keys by name ----------------------------------------------------------------------


def test_keys_are_chosen_by_name_and_nothing_says_what_exists_elsewhere(
    tmp_path: Path, db: Database
) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "bot").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    rt = make_runtime(db, Clock(), ssh_key_dir=keys)
    assert key_path(rt.settings, "bot") == (keys / "bot").resolve()
    (tmp_path / "exists").write_text("a file outside the key directory")
    messages = []
    for name in ("exists", "missing"):
        with pytest.raises(UsageError) as info:
            key_path(rt.settings, name, names_shown=True)
        messages.append(info.value.user_text().replace(name, "NAME"))
    assert messages[0] == messages[1]
    assert "Keys it has: bot." in messages[0]  # to an admin (bot.services.instances.key_grants)
    with pytest.raises(UsageError) as member:
        key_path(rt.settings, "missing")
    assert "bot" not in member.value.user_text().replace("/gpu keys", "")
    for bad in ("../exists", "/etc/passwd", "..", "a/b", "~root"):
        with pytest.raises(UsageError, match="is not a key name"):
            key_path(rt.settings, bad)
    (keys / "escape").symlink_to(tmp_path / "exists")
    with pytest.raises(UsageError, match="no SSH key called 'escape'"):
        key_path(rt.settings, "escape")
