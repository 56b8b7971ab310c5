"""Keys per person, job commands per reader, and names and spreadsheets that cannot lie.

* An admin grants a key of GPUBOT_SSH_KEY_DIR to a person (bot.services.instances.key_grants); a
  member uses only keys granted to them, and the answer to a member never names a key.
* A job's command line is shown only to its requester, the instance's owner, the people
  allowed on it and admins (bot.services.jobs.access).
* Names and projects refuse control and format characters (bot.text); CSV cells that would be
  formulas start with ``'`` while the amounts stay exact (bot.services.money.spend.spend_csv).
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

import pytest

from bot import text
from bot.errors import NotAuthorized, UsageError
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import key_grants
from bot.services.jobs import access as job_access
from bot.services.jobs.views import JobListView, WhoGpuView, WhoProcess, WhoView
from bot.services.money.spend import spend_csv
from bot.store.db import Database
from bot.store.models import AuditLog, InstanceAccess, KeyGrant, Person
from tests.bot.blocks.test_jobs import job
from tests.bot.blocks.test_money import report, spend_item
from tests.bot.services.support import Clock, add_instance, make_runtime, rows

ADMIN = Caller(user_id="UADMIN", channel_id="CTEAM")
ALICE = Caller(user_id="U0ALICE", channel_id="CTEAM", user_name="alice")
BOB = Caller(user_id="U0BOB", channel_id="CTEAM", user_name="bob")
CAROL = Caller(user_id="U0CAROL", channel_id="CTEAM", user_name="carol")


@pytest.fixture
def key_rt(db: Database, tmp_path: Path) -> Runtime:
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("lab-a100", "secret-h100"):
        (keys / name).write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    return make_runtime(db, Clock(), ssh_key_dir=keys, admins=frozenset({ADMIN.user_id}))


def test_a_member_uses_only_the_keys_an_admin_granted(key_rt: Runtime, db: Database) -> None:
    with pytest.raises(UsageError) as refused:
        key_grants.usable_key(key_rt, ALICE, "lab-a100")
    with pytest.raises(UsageError) as missing:
        key_grants.usable_key(key_rt, ALICE, "nothing-here")
    # One answer for a key not theirs and a key not there, naming no key of the directory.
    said = refused.value.user_text().replace("lab-a100", "NAME")
    assert said == missing.value.user_text().replace("nothing-here", "NAME")
    assert "secret-h100" not in said
    change = key_grants.allow(key_rt, ADMIN, "lab-a100", "<@U0ALICE>")
    assert (change.granted, change.changed) == (True, True)
    assert key_grants.allow(key_rt, ADMIN, "lab-a100", "<@U0ALICE>").changed is False
    assert key_grants.usable_key(key_rt, ALICE, "lab-a100").name == "lab-a100"
    with pytest.raises(UsageError):
        key_grants.usable_key(key_rt, BOB, "lab-a100")
    with pytest.raises(UsageError):
        key_grants.usable_key(key_rt, ALICE, "secret-h100")
    assert key_grants.usable_key(key_rt, ADMIN, "secret-h100").name == "secret-h100"
    assert key_grants.revoke(key_rt, ADMIN, "lab-a100", "<@U0ALICE>").changed is True
    with pytest.raises(UsageError):
        key_grants.usable_key(key_rt, ALICE, "lab-a100")
    actions = [row.action for row in rows(db, AuditLog)]
    assert actions == ["key.allow", "key.revoke"]


def test_only_an_admin_grants_lists_or_learns_the_key_names(key_rt: Runtime, db: Database) -> None:
    for attempt in (
        lambda: key_grants.allow(key_rt, ALICE, "lab-a100", "<@U0ALICE>"),
        lambda: key_grants.revoke(key_rt, ALICE, "lab-a100", "<@U0BOB>"),
        lambda: key_grants.listing(key_rt, ALICE),
    ):
        with pytest.raises(NotAuthorized):
            attempt()
    assert rows(db, KeyGrant) == []
    with pytest.raises(UsageError) as to_admin:
        key_grants.allow(key_rt, ADMIN, "no-such", "<@U0ALICE>")
    assert "lab-a100, secret-h100" in to_admin.value.user_text()
    key_grants.allow(key_rt, ADMIN, "secret-h100", "<@U0BOB>")
    view = key_grants.listing(key_rt, ADMIN)
    assert [(k.key_name, k.people) for k in view.keys] == [
        ("lab-a100", ()),
        ("secret-h100", ("U0BOB",)),
    ]


def test_a_jobs_command_is_shown_to_its_requester_owner_allowed_people_and_admins(
    db: Database,
) -> None:
    rt = make_runtime(db, Clock(), admins=frozenset({ADMIN.user_id}))
    inst_id = add_instance(db, name="box1", owner_id=ALICE.user_id)
    with db.session() as session:
        session.add(Person(slack_id=BOB.user_id))
        session.flush()
        session.add(InstanceAccess(instance_id=inst_id, person_id=BOB.user_id, granted_by="x"))
    secret = ("python", "train.py", "--token", "hf_SECRET")
    listing = JobListView(
        "box1",
        (
            job(instance_id=inst_id, command=secret, requested_by=ALICE.user_id),
            job(id=43, instance_id=inst_id, command=("ls",), requested_by=CAROL.user_id),
        ),
    )
    for reader in (ALICE, BOB, ADMIN):
        shown = job_access.readable_jobs(rt, reader, listing)
        assert [j.command for j in shown.jobs] == [secret, ("ls",)]
    dave = Caller(user_id="U0DAVE")
    hidden = job_access.readable_jobs(rt, dave, listing)
    assert [(j.command, j.command_hidden, j.state, j.requested_by) for j in hidden.jobs] == [
        ((), True, "succeeded", ALICE.user_id),
        ((), True, "succeeded", CAROL.user_id),
    ]
    # Carol sees her own job's command on someone else's instance, not Alice's.
    carols = job_access.readable_jobs(rt, CAROL, listing)
    assert [j.command_hidden for j in carols.jobs] == [True, False]
    who = WhoView(
        "box1",
        (
            WhoGpuView(
                0,
                "H100",
                (
                    WhoProcess(1, "root", ALICE.user_id, "42", " ".join(secret), None),
                    WhoProcess(2, "root", dave.user_id, None, "python mine.py", None),
                ),
            ),
        ),
    )
    procs = job_access.readable_who(rt, dave, who).gpus[0].processes
    assert [(p.command, p.command_hidden) for p in procs] == [
        (None, True),
        ("python mine.py", False),
    ]
    assert job_access.readable_who(rt, BOB, who) == who


def test_names_and_projects_refuse_hidden_characters_and_keep_cjk() -> None:
    assert text.instance_name("卡4090") == "卡4090"
    assert text.instance_name("\uff42\uff4f\uff58\uff11") == "box1"
    assert text.project("大模型 训练") == "大模型 训练"
    for bad in ("box\u202e1", "box\u200b1", "a\nb", "a\u2028b", "b\u2066x\u2069"):
        with pytest.raises(UsageError, match="invisible or direction-changing"):
            text.instance_name(bad)
        with pytest.raises(UsageError, match="invisible or direction-changing"):
            text.project(bad)
    for homoglyph in ("\u0430bc", "bøx"):
        with pytest.raises(UsageError):
            text.instance_name(homoglyph)


def test_the_csv_export_writes_formulas_as_text_and_amounts_exactly() -> None:
    item = spend_item(
        1, name="box-1", project='=HYPERLINK("https://evil.example","x")', gpu_model="@SUM(1)"
    )
    credit = replace(spend_item(2, project="-1+2"), compute_micros=-1_500_000)
    raw = spend_csv(report([item, credit], by="project"))
    assert raw.startswith("\ufeff".encode())
    table = list(csv.DictReader(io.StringIO(raw.decode("utf-8-sig"))))
    by_name = {row["instance"]: row for row in table}
    assert by_name["box-1"]["project"] == '\'=HYPERLINK("https://evil.example","x")'
    assert by_name["box-1"]["gpu_model"] == "'@SUM(1)"
    assert by_name["box-2"]["project"] == "'-1+2"
    assert by_name["box-2"]["compute_USD"] == "-1.500000"
    assert by_name["box-1"]["compute_USD"] == "2.000000"
