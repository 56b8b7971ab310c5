"""The trust model through the real Bolt app: signed HTTP requests on loopback, a real sshd as
the rented machine, the Slack stand-in; what each person sees and that nothing changed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlmodel import SQLModel

from bot.fleet.base import LOCAL_HOST
from bot.services.access import Caller
from bot.services.money import budgets
from bot.store.db import Database
from bot.store.models import AuditLog, Instance, Job, OutboxMessage
from tests.bot.services.support import Clock, add_instance, grant_key
from tests.fixtures.providers import RunpodStandIn
from tests.fixtures.slack import SlackBot, payload_json, start_slack_bot
from tests.fixtures.sshd import SshServer

pytestmark = pytest.mark.integration

ADMIN = "U0ADMIN"
#: The members the admin granted the sshd key to (`/gpu keys allow`).
MEMBERS = ("U0ALICE", "U0BOB")
NOW = datetime(2026, 12, 2, 12, 0)


@pytest.fixture
def bot(
    sqlite_db: Database, tmp_path: Path, sshd: SshServer, fake_gpu_zipapp: Path
) -> Iterator[SlackBot]:
    """The app on HTTP, its machines reached over sshd with keys named from sshd's dir."""
    grant_key(sqlite_db, sshd.client_key_path.name, *MEMBERS)
    with start_slack_bot(
        sqlite_db,
        tmp_path,
        clock=Clock(NOW),
        admins=frozenset({ADMIN}),
        ssh_key_dir=sshd.directory,
        agent_zipapp=fake_gpu_zipapp,
        ssh_connect_timeout_s=5.0,
        ssh_command_timeout_s=30.0,
    ) as started:
        started.slack.add_user(ADMIN, "admin")
        yield started


def ask(bot: SlackBot, text: str, user: str = "U0ALICE") -> str:
    """Send `/gpu TEXT` as ``user``; the reply everything it says, as JSON text."""
    before = len(bot.slack.responses)
    assert bot.command(text, user=user, user_name=bot.slack.user_name(user) or user) == 200
    replies = bot.replies(before + 1, timeout_s=60)
    return payload_json(replies[before])


def rows(db: Database, *skip: str) -> dict[str, list[tuple[Any, ...]]]:
    with db.session() as session:
        return {
            table.name: sorted(map(tuple, session.execute(select(table)).all()), key=repr)
            for table in SQLModel.metadata.sorted_tables
            # bot.replay records each signed request's signature
            if table.name not in {*skip, "seen_signature"}
        }


def register_text(sshd: SshServer, name: str, extra: str = "", host: str | None = None) -> str:
    address = f"{sshd.user}@{host or sshd.host}:{sshd.port}"
    key = sshd.client_key_path.name
    return f"register {name} {address} --key {key} --gpu a100 --price 1/h {extra}".strip()


def test_local_is_refused_from_slack_in_every_form(bot: SlackBot, sqlite_db: Database) -> None:
    # The console shares this store and has registered this machine as `local`.
    local_id = add_instance(
        sqlite_db, name="local", host=LOCAL_HOST, port=0, owner_id="U0ALICE", deadline_at=None
    )
    before = rows(sqlite_db, "person")
    for user in ("U0ALICE", ADMIN):
        for text in (
            "register local local",
            "register box local",
            "register local root@203.0.113.7",
        ):
            text += " --gpu a100 --price 1/h"
            assert "can be used only from the bot's own console" in ask(bot, text, user)
        for text in (
            "run local -- sh -c 'id; env'",
            "status local",
            "health local",
            "health local --full",
            "release local",
            "extend local 1h",
            "jobs local",
            "logs local:20261202-120000-0001",
            "cancel local:20261202-120000-0001",
            "who local",
            "allow local U0BOB",
            "policy local --idle-release 1h",
            *(["cap local 3d"] if user == ADMIN else []),  # members hear it is admins' only
        ):
            assert "There is no instance called 'local'" in ask(bot, text, user), text
        for action in ("instance_release_confirm", "instance_release_done", "instance_release_ask"):
            count = len(bot.slack.responses)
            assert bot.click(action, str(local_id), user=user) == 200
            answer = payload_json(bot.replies(count + 1)[count])
            assert f"There is no instance with id {local_id}" in answer, action
    assert "local" not in ask(bot, "list").replace("local_", "")
    assert rows(sqlite_db, "person") == before  # nothing ran, nothing changed


def test_a_machine_someone_holds_is_refused_by_address_or_host_key(
    bot: SlackBot, sqlite_db: Database, sshd: SshServer
) -> None:
    assert "Registered alices" in ask(bot, register_text(sshd, "alices", "--price 2/h"))
    ask(bot, "run alices -- sleep 30")
    before = rows(sqlite_db, "person")
    for text in (
        register_text(sshd, "bobs"),
        register_text(sshd, "alices"),
        register_text(sshd, "bobs", host="localhost"),  # same host key, another address
    ):
        said = ask(bot, text, "U0BOB")
        assert "already registered as alices, held by <@U0ALICE>" in said
    with sqlite_db.session() as session:
        [job] = session.exec(select(Job)).scalars().all()
    for text in (
        "run alices -- id",
        f"cancel {job.id}",
        f"logs {job.id}",
        f"cancel alices:{job.agent_job_id}",
        f"logs alices:{job.agent_job_id}",
        "health alices --full",
    ):
        assert "Only <@U0ALICE> (the owner of alices), the people they allowed" in ask(
            bot, text, "U0BOB"
        ), text
    said = ask(bot, "release alices", "U0BOB")
    assert "Only <@U0ALICE> (the owner of alices) or an admin can release it" in said
    assert rows(sqlite_db, "person") == before
    assert f"Cancelled job {job.id} on alices" in ask(bot, f"cancel {job.id}")


def test_re_registering_with_a_new_price_keeps_the_past_cost(
    bot: SlackBot, sqlite_db: Database, sshd: SshServer
) -> None:
    clock = bot.rt.clock
    assert isinstance(clock, Clock)
    ask(bot, register_text(sshd, "box", "--price 3.60/h --release-in 5h"))
    clock.advance(minutes=90)
    said = ask(bot, register_text(sshd, "box", "--price 1.20/h"))
    assert "Re-registered box" in said
    clock.advance(minutes=60)
    status = ask(bot, "status box")
    assert "$6.60" in status  # 1.5 h at $3.60, then 1 h at $1.20
    with sqlite_db.session() as session:
        [inst] = session.exec(select(Instance)).scalars().all()
        actions = [a.action for a in session.exec(select(AuditLog)).scalars().all()]
    assert inst.price_micros == 1_200_000
    assert actions == ["register", "re_register"]


def test_re_registering_past_a_used_up_budget_needs_an_admin(
    bot: SlackBot, sqlite_db: Database, sshd: SshServer
) -> None:
    clock = bot.rt.clock
    assert isinstance(clock, Clock)
    ask(bot, register_text(sshd, "box", "--price 2/h --release-in 4h --project llm"))
    budgets.set_budget(bot.rt, Caller(ADMIN), "project", "llm", 3_000_000)
    clock.advance(hours=2)
    later = register_text(sshd, "box", "--release-in 8h --project llm")
    said = ask(bot, later)
    assert "The monthly budget of project llm is used up" in said
    with sqlite_db.session() as session:
        [inst] = session.exec(select(Instance)).scalars().all()
    assert inst.deadline_at == NOW + timedelta(hours=4)
    ask(bot, later, ADMIN)
    with sqlite_db.session() as session:
        [inst] = session.exec(select(Instance)).scalars().all()
    assert inst.deadline_at == clock.now + timedelta(hours=8)
    assert inst.owner_id == "U0ALICE"


# --- trust in what a registration claims --------------------------------------------------------


@contextmanager
def _bot_with_runpod(
    sqlite_db: Database,
    tmp_path: Path,
    sshd: SshServer,
    zipapp: Path,
    pods: RunpodStandIn,
    **settings: object,
) -> Iterator[SlackBot]:
    grant_key(sqlite_db, sshd.client_key_path.name, *MEMBERS)
    with start_slack_bot(
        sqlite_db,
        tmp_path,
        clock=Clock(NOW),
        admins=frozenset({ADMIN}),
        channel="C0OPS",
        ssh_key_dir=sshd.directory,
        agent_zipapp=zipapp,
        ssh_connect_timeout_s=5.0,
        ssh_command_timeout_s=30.0,
        runpod_api_url=pods.url,
        runpod_api_key=pods.api_key,
        **settings,
    ) as started:
        started.slack.add_user(ADMIN, "admin")
        yield started


@pytest.fixture
def pods_elsewhere() -> Iterator[RunpodStandIn]:
    """RunPod, whose pods are at another address than the sshd's."""
    standin = RunpodStandIn(ssh_host="198.51.100.9", ssh_port=22)
    standin.start()
    yield standin
    standin.close()


@pytest.fixture
def pods_here(sshd: SshServer) -> Iterator[RunpodStandIn]:
    """RunPod, whose pods are at the sshd's address and port."""
    standin = RunpodStandIn(ssh_host=sshd.host, ssh_port=sshd.port)
    standin.start()
    yield standin
    standin.close()


def test_bob_cannot_register_his_box_under_a_pod_nobody_registered(
    sqlite_db: Database,
    tmp_path: Path,
    sshd: SshServer,
    fake_gpu_zipapp: Path,
    pods_elsewhere: RunpodStandIn,
) -> None:
    pod = pods_elsewhere.add()  # started from RunPod's console: nobody registered it
    with _bot_with_runpod(sqlite_db, tmp_path, sshd, fake_gpu_zipapp, pods_elsewhere) as bot:
        said = ask(
            bot, register_text(sshd, "bobs", f"--provider runpod --provider-id {pod}"), "U0BOB"
        )
        assert f"RunPod reports instance {pod} at 198.51.100.9:22" in said
        assert f"not at {sshd.host}:{sshd.port}" in said
        with sqlite_db.session() as session:
            assert session.exec(select(Instance)).scalars().all() == []
        assert pods_elsewhere.calls_to("DELETE") == []


def test_adopting_is_an_admin_s_act_and_the_ops_channel_hears_of_it(
    sqlite_db: Database,
    tmp_path: Path,
    sshd: SshServer,
    fake_gpu_zipapp: Path,
    pods_here: RunpodStandIn,
) -> None:
    pod = pods_here.add()
    text = f"adopt runpod {pod} rp1 --user {sshd.user} --key {sshd.client_key_path.name}"
    with _bot_with_runpod(sqlite_db, tmp_path, sshd, fake_gpu_zipapp, pods_here) as bot:
        said = ask(bot, text, "U0BOB")
        assert "Only an admin can adopt an instance" in said
        assert f"Ask an admin in the ops channel to adopt runpod {pod} for you" in said
        with sqlite_db.session() as session:
            assert session.exec(select(Instance)).scalars().all() == []
        assert "Registered rp1" in ask(bot, text, ADMIN)
        with sqlite_db.session() as session:
            [inst] = session.exec(select(Instance)).scalars().all()
            told = session.exec(
                select(OutboxMessage).where(OutboxMessage.key == f"adopted:{inst.id}")
            ).scalar_one()
        assert (inst.owner_id, inst.provider, inst.provider_instance_id) == (ADMIN, "runpod", pod)
        assert told.recipient == "C0OPS"
        assert f"<@{ADMIN}> adopted *RunPod* instance `{pod}` (trainer) as *rp1*" in told.text


def test_re_registering_without_provider_keeps_the_platform(
    sqlite_db: Database,
    tmp_path: Path,
    sshd: SshServer,
    fake_gpu_zipapp: Path,
    pods_here: RunpodStandIn,
) -> None:
    pod = pods_here.add()
    with _bot_with_runpod(sqlite_db, tmp_path, sshd, fake_gpu_zipapp, pods_here) as bot:
        first = register_text(sshd, "rp", f"--provider runpod --provider-id {pod} --release-in 2h")
        assert "Registered rp" in ask(bot, first)
        assert "Re-registered rp" in ask(bot, register_text(sshd, "rp", "--price 2/h"))
        said = ask(bot, register_text(sshd, "rp", "--provider runpod --provider-id pod9999xyz"))
        assert "Only an admin can change the platform or the platform's id of rp" in said
        with sqlite_db.session() as session:
            [inst] = session.exec(select(Instance)).scalars().all()
        assert (inst.provider, inst.provider_instance_id) == ("runpod", pod)
        assert inst.price_micros == 2_000_000


@pytest.fixture
def public_only_bot(
    sqlite_db: Database, tmp_path: Path, sshd: SshServer, fake_gpu_zipapp: Path
) -> Iterator[SlackBot]:
    """The app with GPUBOT_INSTANCE_NETWORKS at its default: public addresses only."""
    grant_key(sqlite_db, sshd.client_key_path.name, *MEMBERS)
    with start_slack_bot(
        sqlite_db,
        tmp_path,
        clock=Clock(NOW),
        admins=frozenset({ADMIN}),
        ssh_key_dir=sshd.directory,
        agent_zipapp=fake_gpu_zipapp,
        ssh_connect_timeout_s=5.0,
        instance_networks=("public",),
    ) as started:
        started.slack.add_user(ADMIN, "admin")
        yield started


def test_internal_addresses_are_refused_from_slack_whatever_the_port(
    public_only_bot: SlackBot, sqlite_db: Database, sshd: SshServer
) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    before = rows(sqlite_db, "person")
    answers = set()
    for host in ("169.254.169.254", "127.0.0.1", "10.0.0.1", "[::1]"):
        for port in (sshd.port, closed_port):
            text = f"register probe root@{host}:{port} --gpu a100 --price 1/h"
            said = ask(public_only_bot, text, "U0BOB")
            answers.add(said.replace(host.strip("[]"), "HOST"))
    assert len(answers) == 1, answers
    assert "HOST is not an address the bot registers instances at from Slack" in answers.pop()
    assert rows(sqlite_db, "person") == before  # nothing stored, nothing audited


def test_key_names_are_an_admins_and_names_with_hidden_characters_are_refused(
    bot: SlackBot, sqlite_db: Database, sshd: SshServer
) -> None:
    key = sshd.client_key_path.name
    assert "Only an admin" in ask(bot, "keys", user="U0BOB")
    listed = ask(bot, "keys", user=ADMIN)
    assert key in listed
    assert "<@U0ALICE>" in listed
    address = f"{sshd.user}@{sshd.host}:{sshd.port}"
    refused = ask(bot, f"register boxk {address} --key nosuch --gpu a100 --price 1/h", "U0BOB")
    assert "no SSH key called" in refused
    assert key not in refused
    before = rows(sqlite_db, "seen_signature", "person")
    for text in (
        register_text(sshd, "box\u202e1"),
        register_text(sshd, "boxp", "--project 'ml\u202eaxe'"),
        register_text(sshd, "boxz", "--project 'a\u200bb'"),
    ):
        assert "invisible or direction-changing" in ask(bot, text)
    assert rows(sqlite_db, "seen_signature", "person") == before
    granted = ask(bot, f"keys revoke {key} <@U0BOB>", user=ADMIN)
    assert "may no longer register" in granted
    assert "no SSH key called" in ask(bot, register_text(sshd, "boxb"), "U0BOB")
