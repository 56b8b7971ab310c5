"""The job service with real parts: the real agent run by the local transport (and over a real
sshd), real SQLite and PostgreSQL, a recording notifier standing in for Slack's Web API and
NVML faked inside the agent build (no GPU here).

What the store decides (claims across restarts and concurrent pollers, finding a job by its
name's prefix) runs on both stores; the rest, the agent's side, on SQLite only."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from agents.jobstore import JobStore
from agents.protocol import FINAL_JOB_STATES
from bot.errors import (
    AgentBroken,
    Conflict,
    NotAuthorized,
    NotFound,
    SlackError,
    Unreachable,
    UsageError,
)
from bot.fleet.fleet import Fleet
from bot.fleet.local import LocalTransport
from bot.i18n import speaking
from bot.notify import MessageRef
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.jobs import runs as svc
from bot.services.speaking import audit, outbox
from bot.store.db import Database
from bot.store.models import AuditLog, InstanceAccess, Job, OutboxMessage, Person
from tests.agents.runner_support import FAST_ENV, Agent, fake_gpu_zipapp
from tests.bot.services.support import Clock, RecordingNotifier, add_instance, make_runtime
from tests.chinese import assert_said_in_chinese
from tests.fixtures.fake_nvml import FakeNvml
from tests.fixtures.sshd import SshServer
from tests.fixtures.store import sqlite_only

pytestmark = pytest.mark.integration

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM", user_name="owner")
FRIEND = Caller(user_id="UFRIEND", channel_id="CTEAM")
STRANGER = Caller(user_id="USTRANGER", channel_id="CTEAM")
ADMIN = Caller(user_id="UADMIN", channel_id="COPS")
PY = shutil.which("python3") or "python3"
WRITE_ARGV = (
    "import json, os, sys; "
    "json.dump(sys.argv[1:], open(os.path.join(os.environ['GPUBOT_JOB_DIR'], 'argv.json'), 'w'))"
)
TRICKY = [
    "it's",
    'say "hi"',
    "two  spaces",
    "$HOME",
    "a;b",
    "x | y && z",
    "`id`",
    "$(whoami)",
    "line1\nline2",
    "",
    "*",
    "--",
    "ünïcødé",
    "back\\slash",
]


@pytest.fixture(scope="session")
def fake_gpu_agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent zipapp with the fake pynvml vendored in place of nvidia-ml-py's."""
    return fake_gpu_zipapp(tmp_path_factory.mktemp("agent") / "gpu-agent.pyz")


@dataclass
class World:
    rt: Runtime
    db: Database
    clock: Clock
    notifier: RecordingNotifier
    instance_id: int
    agent_home: Path
    fleet: Fleet

    @property
    def store(self) -> JobStore:
        return JobStore(str(self.agent_home))

    def runtime(self, notifier: Any = None) -> Runtime:
        """Another bot process on the same store and instance (a restart)."""
        return make_runtime(
            self.db,
            self.clock,
            notifier=notifier or RecordingNotifier(),
            fleet=self.fleet,
            console=True,
        )

    def row(self, job_id: int) -> Job:
        with self.db.session() as session:
            job = session.get(Job, job_id)
            assert job is not None
            return job

    def wait_agent(self, agent_job_id: str, states=tuple(FINAL_JOB_STATES), timeout=20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.store.read(agent_job_id)["state"] not in states:
            assert time.monotonic() < deadline, f"agent job {agent_job_id} never reached {states}"
            time.sleep(0.05)

    def started(self, agent_job_id: str, timeout: float = 20.0) -> int:
        """The pid of the agent job's command, once its supervisor wrote it: under load that
        comes after the job is running and after the command's own first output."""
        deadline = time.monotonic() + timeout
        while not (pid := self.store.read(agent_job_id).get("job_pid")):
            assert time.monotonic() < deadline, f"agent job {agent_job_id} never started"
            time.sleep(0.05)
        return int(pid)

    def replies(self, notifier: RecordingNotifier | None = None) -> list[Any]:
        return [p for p in (notifier or self.notifier).posts if "Job " in p.text and p.thread_ts]


@pytest.fixture
def world(
    db: Database,
    tmp_path: Path,
    fake_gpu_agent: Path,
    fake_nvml: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[World]:
    for key, value in FAST_ENV.items():
        monkeypatch.setenv(key, value)
    fake_nvml.gpus(2)  # idle: free for any job
    clock = Clock()
    notifier = RecordingNotifier()
    # The services run as in the console, on this machine as `local`.
    rt = make_runtime(db, clock, notifier=notifier, ssh_command_timeout_s=30.0, console=True)
    login = tmp_path / "login"
    login.mkdir()
    fleet = Fleet(
        rt.settings, zipapp_path=fake_gpu_agent, local_transport=LocalTransport(home=login)
    )
    rt.fleet = fleet
    agent_home = tmp_path / "agent-home"
    instance_id = add_instance(
        db,
        name="box",
        host="local",
        ssh_user="me",
        agent_home=str(agent_home),
        price_micros=3_600_000,
        gpu_count=2,
    )
    with db.session() as session:
        session.add(Person(slack_id="UFRIEND"))
        session.flush()
        session.add(
            InstanceAccess(instance_id=instance_id, person_id="UFRIEND", granted_by="UOWNER")
        )
    try:
        yield World(rt, db, clock, notifier, instance_id, agent_home, fleet)
    finally:
        Agent(agent_home, {}).cleanup()
        fleet.close()


def run(world: World, caller: Caller, command: list[str], **kwargs: Any) -> Job:
    result = svc.submit(world.rt, caller, "box", command, **kwargs)
    assert result.job.id is not None
    return world.row(result.job.id)


#: A job that fills 8 GiB of its GPU (GPU 0: the fake NVML's configuration changes as a real
#: GPU's memory would) and says hello.
FILL_GPU_0 = (
    "import json, os, time\n"
    "path = os.environ['GPUBOT_FAKE_NVML']\n"
    "config = json.load(open(path))\n"
    "config['gpus'][0].update(memory_used=8 * 2**30, util_gpu=40)\n"
    "json.dump(config, open(path + '.new', 'w'))\n"
    "os.replace(path + '.new', path)\n"
    "print('hello from the job')\n"
    "time.sleep(0.6)\n"
)


@sqlite_only
def test_run_posts_the_message_and_exactly_one_completion_reply_in_its_thread(world: World):
    # No --gpus: the job gets one free GPU (GPU 0 here), not the CPU.
    job = run(world, OWNER, [PY, "-c", FILL_GPU_0])
    assert job.agent_job_id.startswith("2")  # the agent's id, no longer pending
    assert job.requested_by == "UOWNER"
    assert job.reply_claimed_at is None
    (message,) = world.notifier.posts
    assert (message.channel, message.thread_ts) == ("CTEAM", None)
    assert "Job 1 queued on box" in message.text
    assert (job.channel_id, job.message_ts) == ("CTEAM", message.ts)
    with world.db.session() as session:
        (entry,) = audit.entries(session, action="job_run")
    assert audit.details(entry)["command"] == [PY, "-c", FILL_GPU_0]

    world.wait_agent(job.agent_job_id)
    report = svc.poll_all(world.rt)
    assert (report.updated, report.replied) == (1, 1)
    (reply,) = world.replies()
    assert (reply.channel, reply.thread_ts) == ("CTEAM", message.ts)
    assert "Job 1 on box succeeded" in reply.text
    body = json.dumps(reply.blocks)
    assert "hello from the job" in body
    assert "GPU 0: " in body
    assert "busy on average, peak memory 8.0 GiB" in body  # what the job itself took
    assert "instance_release_ask" in body
    row = world.row(1)
    assert (row.state, row.exit_code, row.gpus, row.gpu_count) == ("succeeded", 0, "0", 1)
    assert row.replied_at == world.clock.now
    assert row.cost_micros is not None
    assert row.cost_micros >= 1

    assert svc.poll_all(world.rt).replied == 0
    world.clock.advance(hours=1)
    assert svc.poll_all(world.rt).replied == 0
    assert len(world.replies()) == 1


@pytest.mark.parametrize(
    ("db", "crash_at"),
    [
        pytest.param("sqlite", "before_post", id="sqlite-before_post"),
        pytest.param("sqlite", "after_claim_expired", id="sqlite-after_claim_expired"),
        pytest.param(
            "postgresql",
            "after_claim_expired",
            id="postgresql-after_claim_expired",
            marks=pytest.mark.integration,
        ),
    ],
    indirect=["db"],
)
def test_exactly_one_reply_across_a_bot_restart(world: World, crash_at: str):
    job = run(world, OWNER, ["true"])
    world.wait_agent(job.agent_job_id)

    class Crash(RuntimeError):
        pass

    class DyingNotifier(RecordingNotifier):
        def post(self, *args: Any, **kwargs: Any) -> MessageRef:
            raise Crash("the bot process died here")

    dying = world.runtime(DyingNotifier())
    with pytest.raises(Crash):
        svc.poll_all(dying)
    claimed = world.row(job.id or 0)
    assert claimed.state == "succeeded"
    assert claimed.replied_at == world.clock.now  # its reply is queued, in the same commit
    with world.db.session() as session:
        (queued,) = outbox.pending(session, kind="job_reply")
    assert queued.claimed_at == world.clock.now  # and was being posted when the bot died

    restarted = RecordingNotifier()
    rt2 = world.runtime(restarted)
    world.clock.advance(minutes=1)
    assert svc.poll_all(rt2).replied == 0  # queued once: polling never queues it again
    assert outbox.deliver_due(rt2, world.clock.now) == 0  # the claim may still be in flight
    if crash_at == "after_claim_expired":
        world.clock.advance(minutes=10)
    else:
        world.clock.advance(seconds=outbox.CLAIM_LEASE_S)
    assert outbox.deliver_due(rt2, world.clock.now) == 1
    rt3 = world.runtime(restarted)
    world.clock.advance(hours=2)
    assert svc.poll_all(rt3).replied == 0
    assert outbox.deliver_due(rt3, world.clock.now) == 0
    assert len(world.replies(restarted)) == 1
    assert world.replies(restarted)[0].thread_ts == job.message_ts


@sqlite_only
def test_a_failed_post_is_retried_and_still_sent_once(world: World):
    job = run(world, OWNER, ["sh", "-c", "exit 3"])
    world.wait_agent(job.agent_job_id)
    world.notifier.fail_posts = True
    assert svc.poll_all(world.rt).replied == 0
    assert world.row(job.id or 0).replied_at is not None  # queued in the outbox
    world.notifier.fail_posts = False
    assert svc.poll_all(world.rt).replied == 0  # never queued twice
    assert outbox.deliver_due(world.rt, world.clock.now) == 0  # waiting out its back-off
    world.clock.advance(seconds=outbox.RETRY_FIRST_S)
    assert outbox.deliver_due(world.rt, world.clock.now) == 1
    assert outbox.deliver_due(world.rt, world.clock.now) == 0
    (reply,) = world.replies()
    assert "Job 1 on box failed" in reply.text
    assert "*Exit code*\\n3" in json.dumps(reply.blocks)


@sqlite_only
def test_a_reply_whose_answer_was_lost_is_never_posted_again(world: World):
    job = run(world, OWNER, ["true"])
    world.wait_agent(job.agent_job_id)

    class SlowSlack(RecordingNotifier):
        """Stores the post, then its answer comes after the client gave up."""

        def post(self, *args: Any, **kwargs: Any) -> MessageRef:
            super().post(*args, **kwargs)
            raise SlackError("Slack's answer timed out", error="unreachable", outcome_unknown=True)

    slow = SlowSlack()
    restarted = world.runtime(slow)
    svc.poll_all(restarted)
    world.clock.advance(seconds=outbox.CLAIM_LEASE_S + svc.CLAIM_TIMEOUT.total_seconds() + 60)
    svc.poll_all(restarted)
    outbox.deliver_due(restarted, world.clock.now)
    other = world.runtime(RecordingNotifier())
    svc.poll_all(other)  # nor by another process
    outbox.deliver_due(other, world.clock.now)
    assert len(slow.containing("Job 1 on box")) == 1
    assert world.row(job.id or 0).replied_at is not None
    with world.db.session() as session:
        [row] = session.exec(select(AuditLog).where(AuditLog.action == "outbox_unconfirmed")).all()
        (message,) = session.exec(select(OutboxMessage)).all()
    assert audit.details(row)["key"] == f"job_reply:{job.id}"
    assert message.delivery == outbox.UNCONFIRMED


def test_concurrent_pollers_post_each_reply_once(world: World):
    with world.db.session() as session:
        for i in range(12):
            session.add(
                Job(
                    instance_id=world.instance_id,
                    agent_job_id=f"done-{i}",
                    requested_by="UOWNER",
                    command_json='["true"]',
                    state="succeeded",
                    channel_id="CTEAM",
                    message_ts=f"{i}.0001",
                )
            )
    notifiers = [RecordingNotifier() for _ in range(4)]
    runtimes = [world.runtime(n) for n in notifiers]
    barrier = threading.Barrier(len(runtimes))
    errors: list[BaseException] = []

    def reply(rt: Runtime) -> None:
        try:
            barrier.wait()
            svc.send_replies(rt)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reply, args=(rt,)) for rt in runtimes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    threads_replied = sorted(p.thread_ts or "" for n in notifiers for p in n.posts)
    assert threads_replied == sorted(f"{i}.0001" for i in range(12))


def test_a_job_whose_confirmation_was_lost_is_found_and_answered(world: World):
    # The bot wrote the pending row, then the connection dropped after the agent queued it.
    with world.db.session() as session:
        session.add(
            Job(
                instance_id=world.instance_id,
                agent_job_id=f"{svc.PENDING_PREFIX}abc123",
                requested_by="UOWNER",
                command_json='["true"]',
                state="queued",
                submitted_at=world.clock.now,
                channel_id="CTEAM",
            )
        )
        session.add(
            Job(
                instance_id=world.instance_id,
                agent_job_id=f"{svc.PENDING_PREFIX}neverarrived",
                requested_by="UOWNER",
                command_json='["true"]',
                state="queued",
                submitted_at=world.clock.now,
            )
        )
    agent = world.fleet.agent(svc.target_for(world.rt, _instance(world)))
    record = agent.run(["true"], name=f"{svc.NAME_PREFIX}abc123")
    world.wait_agent(record.id)
    svc.poll_all(world.rt)
    with world.db.session() as session:
        adopted = session.exec(select(Job).where(Job.agent_job_id == record.id)).one()
        waiting = session.exec(select(Job).where(Job.agent_job_id.endswith("neverarrived"))).one()  # type: ignore[attr-defined]
    assert adopted.state == "succeeded"
    assert waiting.state == "queued"
    world.clock.advance(minutes=11)
    svc.poll_all(world.rt)
    assert world.row(waiting.id or 0).state == "lost"
    texts = sorted(p.text for p in world.notifier.posts)
    assert texts[0].startswith(f"Job {adopted.id} on box succeeded")
    assert texts[1].startswith(f"Job {waiting.id} on box lost")
    # Neither got its channel message posted: the requester hears directly.
    assert [(p.channel, p.thread_ts) for p in world.notifier.posts] == [("UOWNER", None)] * 2


@sqlite_only
def test_a_job_the_agent_forgot_is_lost(world: World):
    job = run(world, OWNER, ["sleep", "30"])
    world.wait_agent(job.agent_job_id, ("running",))
    Agent(world.agent_home, {}).cleanup()
    shutil.rmtree(world.agent_home / "jobs" / job.agent_job_id)
    (world.agent_home / "active" / job.agent_job_id).unlink()
    svc.poll_all(world.rt)
    row = world.row(job.id or 0)
    assert row.state == "lost"
    (reply,) = world.replies()
    assert "no longer knows this job" in json.dumps(reply.blocks)


@sqlite_only
def test_only_owner_allowed_people_and_admins_run_and_cancel(world: World):
    with pytest.raises(NotAuthorized, match="Only <@UOWNER>"):
        svc.submit(world.rt, STRANGER, "box", ["true"])
    with world.db.session() as session:
        assert session.exec(select(Job)).all() == []
    assert world.store.all_ids() == []
    friend = run(world, FRIEND, ["sleep", "30"])
    admin = run(world, ADMIN, ["sleep", "30"])
    assert (friend.requested_by, admin.requested_by) == ("UFRIEND", "UADMIN")
    world.wait_agent(friend.agent_job_id, ("running",))
    with pytest.raises(NotAuthorized):
        svc.cancel(world.rt, STRANGER, str(friend.id))
    assert world.store.read(friend.agent_job_id)["state"] == "running"
    cancelled = svc.cancel(world.rt, FRIEND, str(friend.id))
    assert cancelled.state == "cancelled"
    # By the start of its agent id: the shortest start no other job shares (two jobs started
    # in the same second share the time).
    start = next(
        admin.agent_job_id[:n]
        for n in range(17, len(admin.agent_job_id) + 1)
        if not friend.agent_job_id.startswith(admin.agent_job_id[:n])
    )
    assert svc.cancel(world.rt, OWNER, start).state == "cancelled"
    with pytest.raises(Conflict, match="already finished"):
        svc.cancel(world.rt, OWNER, str(friend.id))
    svc.poll_all(world.rt)
    replies = world.replies()
    assert len(replies) == 2
    assert all("cancelled" in r.text for r in replies)
    by_whom = sorted(r.blocks[0]["text"]["text"].split("Cancelled by ")[1] for r in replies)
    assert by_whom == ["<@UFRIEND>.", "<@UOWNER>."]


@sqlite_only
def test_bad_requests_change_nothing(world: World):
    for kwargs, error, message in (
        ({"command": []}, UsageError, "Nothing to run"),
        ({"command": ["true"], "gpus": "a,b"}, UsageError, "not understood"),
        ({"command": ["true"], "retries": 101}, UsageError, "between 0 and 100"),
    ):
        with pytest.raises(error, match=message):
            svc.submit(world.rt, OWNER, "box", **kwargs)
    with pytest.raises(NotFound):
        svc.submit(world.rt, OWNER, "nope", ["true"])
    # The agent's own words, first and alone, with the instance named.
    with pytest.raises(UsageError) as caught:
        svc.submit(world.rt, OWNER, "box", ["true"], gpus="3")
    assert caught.value.message.startswith("box has 2 GPUs (0, 1); --gpus 3 names GPU 3, ")
    assert "--gpus any:N (at most 2 here)" in caught.value.message
    assert "exit code" not in caught.value.user_text()
    with pytest.raises(UsageError) as caught:
        svc.submit(world.rt, OWNER, "box", ["true"], gpus="any:3")
    assert caught.value.message == "box has 2 GPUs (0, 1); --gpus any:3 asks for 3."
    with pytest.raises(UsageError, match=r"^no-such-program-xyz: command not found on PATH\.$"):
        svc.submit(world.rt, OWNER, "box", ["no-such-program-xyz"])
    # In Chinese: the agent's error document read through the catalogue, no English left.
    with speaking("zh"), pytest.raises(UsageError) as caught:
        svc.submit(world.rt, OWNER, "box", ["true"], gpus="3")
    assert caught.value.message.startswith("box 有 2 块 GPU")
    assert "--gpus 3 " in caught.value.message
    assert_said_in_chinese(caught.value.message)
    with speaking("zh"), pytest.raises(UsageError) as caught:
        svc.submit(world.rt, OWNER, "box", ["no-such-program-xyz"])
    assert_said_in_chinese(caught.value.message)
    with world.db.session() as session:
        assert session.exec(select(Job)).all() == []
    assert world.notifier.posts == []


@sqlite_only
def test_logs_jobs_and_who(world: World, fake_nvml: FakeNvml):
    job = run(world, OWNER, ["sh", "-c", "for i in 1 2 3; do echo line $i; done; sleep 30"])
    world.wait_agent(job.agent_job_id, ("running",))
    deadline = time.monotonic() + 10
    while "line 3" not in svc.logs(world.rt, OWNER, str(job.id)).text:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert svc.logs(world.rt, OWNER, f"#{job.id}", tail=1).text == "line 3\n"
    assert svc.logs(world.rt, OWNER, f"box:{job.agent_job_id}", tail=2).text == "line 2\nline 3\n"
    with pytest.raises(UsageError):
        svc.logs(world.rt, OWNER, str(job.id), tail=0)
    with pytest.raises(NotFound):
        svc.logs(world.rt, OWNER, "999")

    listing = svc.list_jobs(world.rt, "box")
    assert [(j.id, j.state) for j in listing.jobs] == [(job.id, "running")]
    assert svc.list_jobs(world.rt).jobs[0].requested_by == "UOWNER"

    pid = world.started(job.agent_job_id)
    fake_nvml.gpus(2, per_gpu={1: {"processes": [{"pid": pid, "used_memory": 3 * 1024**3}]}})
    view = svc.who(world.rt, "box")
    assert [len(g.processes) for g in view.gpus] == [0, 1]
    (proc,) = view.gpus[1].processes
    assert (proc.pid, proc.slack_user, proc.job_ref) == (pid, "UOWNER", str(job.id))
    assert svc.cancel(world.rt, OWNER, str(job.id)).state == "cancelled"


@sqlite_only
def test_who_counts_the_agents_reservations(world: World, fake_nvml: FakeNvml):
    starting = run(world, OWNER, ["sleep", "30"], gpus="0,")
    world.wait_agent(starting.agent_job_id, ("running",))
    waiting = run(world, OWNER, ["sleep", "30"], gpus="0,")
    any_two = run(world, OWNER, ["sleep", "30"], gpus="any:2")
    pid = world.started(starting.agent_job_id)
    fake_nvml.gpus(
        2,
        per_gpu={1: {"processes": [{"pid": pid, "used_memory": 1024**3}]}},
        process_utilization=[{"pid": pid, "sm": 55, "mem": 20}],
    )
    view = svc.who(world.rt, "box")
    first, second = view.gpus
    assert first.processes == ()
    assert first.held_by is not None
    assert (first.held_by.job_ref, first.held_by.slack_user, first.held_by.starting) == (
        str(starting.id),
        "UOWNER",
        True,
    )
    assert [w.job_ref for w in first.waiting] == [str(waiting.id)]
    assert [(w.job_ref, w.wanted) for w in view.waiting_any] == [
        (str(any_two.id), "any 2 free GPUs")
    ]
    (proc,) = second.processes  # the job's process, seen on the other GPU
    assert (proc.job_ref, proc.sm_util_pct) == (str(starting.id), 55)
    assert proc.elapsed_s is not None
    assert second.held_by is None
    for job in (any_two, waiting, starting):
        assert svc.cancel(world.rt, OWNER, str(job.id)).state == "cancelled"


@sqlite_only
def test_unfinished_jobs_of_a_released_instance_are_lost(world: World):
    job = run(world, OWNER, ["sleep", "30"])
    with world.db.session() as session:
        inst = _instance(world, session)
        inst.state = "released"
        session.add(inst)
    svc.poll_all(world.rt)
    assert world.row(job.id or 0).state == "lost"
    (reply,) = world.replies()
    assert "the instance was released" in json.dumps(reply.blocks)
    assert "instance_release_ask" not in json.dumps(reply.blocks)


@sqlite_only
def test_a_job_message_that_cannot_be_posted_still_gets_its_reply(world: World):
    class NoChannel(RecordingNotifier):
        def post(
            self,
            channel: str,
            text: str,
            blocks: Any = (),
            *,
            thread_ts: Any = None,
            key: str | None = None,
        ) -> MessageRef:
            if channel == "CTEAM":
                raise SlackError("not_in_channel", error="not_in_channel")
            return super().post(channel, text, blocks, thread_ts=thread_ts, key=key)

    notifier = NoChannel()
    rt = world.runtime(notifier)
    result = svc.submit(rt, OWNER, "box", ["true"])
    assert result.posted is False
    job = world.row(result.job.id or 0)
    world.wait_agent(job.agent_job_id)
    assert svc.poll_all(rt).replied == 1
    (reply,) = notifier.posts
    assert (reply.channel, reply.thread_ts) == ("UOWNER", None)


@sqlite_only
def test_catch_up_after_the_instance_was_unreachable(
    db: Database, tmp_path: Path, sshd: SshServer, fake_gpu_agent: Path
):
    clock = Clock()
    notifier = RecordingNotifier()
    rt = make_runtime(
        db, clock, notifier=notifier, ssh_connect_timeout_s=3.0, ssh_command_timeout_s=30.0
    )
    rt.fleet = Fleet(rt.settings, zipapp_path=fake_gpu_agent)
    agent_home = tmp_path / "remote-agent-home"
    add_instance(
        db,
        name="box",
        host=sshd.host,
        port=sshd.port,
        ssh_user=sshd.user,
        ssh_key_path=str(sshd.client_key_path),
        host_key_type=sshd.host_key.key_type,
        host_key_b64=sshd.host_key.key_b64,
        host_key_fingerprint=sshd.host_key.fingerprint,
        agent_home=str(agent_home),
    )
    try:
        result = svc.submit(rt, OWNER, "box", [PY, "-c", WRITE_ARGV, *TRICKY])
        job_id = result.job.id or 0
        with db.session() as session:
            agent_job_id = session.get(Job, job_id).agent_job_id  # type: ignore[union-attr]
        store = JobStore(str(agent_home))
        deadline = time.monotonic() + 20
        while store.read(agent_job_id)["state"] not in FINAL_JOB_STATES:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        written = json.loads((agent_home / "jobs" / agent_job_id / "argv.json").read_text())
        assert written == TRICKY  # crossed SSH and the remote shell exactly as given

        sshd.stop()
        report = svc.poll_all(rt)
        assert report.unreachable == ("box",)
        assert [p for p in notifier.posts if p.thread_ts] == []
        sshd.restart()
        rt.fleet.forget("box")
        clock.advance(hours=3)
        report = svc.poll_all(rt)
        assert (report.unreachable, report.replied) == ((), 1)
        assert svc.poll_all(rt).replied == 0
    finally:
        Agent(agent_home, {}).cleanup()
        rt.fleet.close()


def _instance(world: World, session: Any = None) -> Any:
    from bot.store.models import Instance

    if session is not None:
        inst = session.get(Instance, world.instance_id)
        assert inst is not None
        return inst
    with world.db.session() as own:
        inst = own.get(Instance, world.instance_id)
        assert inst is not None
        return inst


@sqlite_only
def test_logs_and_cancel_of_a_job_the_instance_does_not_have_say_how_to_list_them(
    world: World,
) -> None:
    for call in (
        lambda: svc.logs(world.rt, OWNER, "box:20260101-000000-dead"),
        lambda: svc.cancel(world.rt, OWNER, "box:20260101-000000-dead"),
    ):
        with pytest.raises(NotFound) as caught:
            call()
        assert "box has no job '20260101-000000-dead'" in caught.value.message
        assert caught.value.hint == "`/gpu jobs box` lists its jobs."
    with world.db.session() as session:
        assert session.exec(select(Job)).all() == []


@sqlite_only
def test_gpus_name_cards_as_cuda_visible_devices_does(world: World):
    """``--gpus 1`` is GPU 1 (not "any one"), ``--gpus 0`` GPU 0 (not none); the job sees it
    as CUDA_VISIBLE_DEVICES and the job's messages say which card it got."""
    code = "import os; print('CVD=' + os.environ['CUDA_VISIBLE_DEVICES'])"
    second = run(world, OWNER, [PY, "-c", code], gpus="1")
    first = run(world, OWNER, [PY, "-c", code], gpus="0")
    cpu = run(world, OWNER, [PY, "-c", code], gpus="none")
    queued = [p.text for p in world.notifier.posts]
    for job in (second, first, cpu):
        world.wait_agent(job.agent_job_id)
    svc.poll_all(world.rt)
    assert [world.row(j.id or 0).gpus for j in (second, first)] == ["1", "0"]
    assert world.row(cpu.id or 0).gpu_count == 0
    bodies = {r.thread_ts: json.dumps(r.blocks) for r in world.replies()}
    assert "CVD=1" in bodies[second.message_ts]
    assert "GPU 1 (CUDA_VISIBLE_DEVICES=1)" in bodies[second.message_ts]
    assert "GPU 0 (CUDA_VISIBLE_DEVICES=0)" in bodies[first.message_ts]
    assert "no GPU (CPU only)" in bodies[cpu.message_ts]
    assert len(queued) == 3
    listing = {j.id: j for j in svc.list_jobs(world.rt, "box").jobs}
    assert listing[second.id].gpus_assigned == (1,)


@sqlite_only
def test_who_shows_a_reserved_gpu_as_held_and_unseen_memory_as_in_use(
    world: World, fake_nvml: FakeNvml
):
    # GPU 1: 20 GiB in use and no process visible (another container's); GPU 0: a job holds
    # it but has not opened CUDA yet.
    fake_nvml.gpus(2, per_gpu={1: {"memory_used": 20 * 1024**3}})
    holder = run(world, OWNER, ["sleep", "30"], gpus="0")
    world.wait_agent(holder.agent_job_id, ("running",))
    view = svc.who(world.rt, "box")
    reserved, unseen = view.gpus
    assert reserved.held_by is not None
    assert (reserved.held_by.job_ref, reserved.held_by.starting) == (str(holder.id), True)
    assert not reserved.free
    assert unseen.processes == ()
    assert unseen.unseen_mem_bytes == 20 * 1024**3
    assert not unseen.free
    from bot.blocks.jobs import who_message

    text, _ = who_message(view)
    assert text.endswith(
        f"GPU 0: held by job {holder.id}; GPU 1: in use (no process visible: another container?)"
    )
    assert svc.cancel(world.rt, OWNER, str(holder.id)).state == "cancelled"


@sqlite_only
def test_who_without_a_driver_says_so_in_the_agents_words(world: World, fake_nvml: FakeNvml):
    fake_nvml.no_library()
    with pytest.raises(AgentBroken) as caught:
        svc.who(world.rt, "box")
    message = caught.value.message
    assert message.startswith("No NVIDIA driver on box (nvidia-smi / NVML not found): ")
    assert "libnvidia-ml.so.1" in message
    assert "exit code" not in caught.value.user_text()


@sqlite_only
def test_without_a_usable_gpu_the_default_runs_on_the_cpu_and_says_why(
    world: World, fake_nvml: FakeNvml
):
    fake_nvml.no_library()
    job = run(world, OWNER, ["true"])
    (message,) = world.notifier.posts
    assert "GPUs: no GPU (CPU only) (box has no usable NVIDIA GPU, so the job runs on the CPU)" in (
        json.dumps(message.blocks)
    )
    with pytest.raises(AgentBroken, match=r"^No NVIDIA GPU can be used on box "):
        svc.submit(world.rt, OWNER, "box", ["true"], gpus="any:1")
    world.wait_agent(job.agent_job_id)
    svc.poll_all(world.rt)
    assert world.row(job.id or 0).gpu_count == 0


@sqlite_only
def test_logs_and_the_fleet_list_show_the_state_the_agent_has_now(world: World):
    job = run(world, OWNER, ["sh", "-c", "echo all done"])
    world.wait_agent(job.agent_job_id)
    # No poll has run: the bot's row still says queued.
    assert world.row(job.id or 0).state == "queued"
    shown = svc.logs(world.rt, OWNER, str(job.id))
    assert (shown.text, shown.job.state) == ("all done\n", "succeeded")
    assert not shown.state_stale
    other = run(world, OWNER, ["sh", "-c", "echo second"])
    world.wait_agent(other.agent_job_id)
    fleet = {j.id: j.state for j in svc.list_jobs(world.rt).jobs}
    assert fleet == {job.id: "succeeded", other.id: "succeeded"}
    one = {j.id: j.state for j in svc.list_jobs(world.rt, "box").jobs}
    assert one == fleet
    assert world.row(other.id or 0).state == "succeeded"
    assert svc.poll_all(world.rt).replied == 2  # the replies still come from the clock, once


@sqlite_only
def test_the_fleet_list_labels_jobs_of_an_instance_it_could_not_ask(world: World):
    job = run(world, OWNER, ["sleep", "30"])
    world.wait_agent(job.agent_job_id, ("running",))

    class Down:
        closed = False

        def fan_out(self, targets: Any, call: Any, **_: Any) -> dict[str, Any]:
            return {t.name: Unreachable(f"{t.name}: no route to host") for t in targets}

    real = world.rt.fleet
    world.rt.fleet = Down()  # type: ignore[assignment]
    try:
        listing = svc.list_jobs(world.rt)
    finally:
        world.rt.fleet = real
    assert [(j.id, j.state) for j in listing.jobs] == [(job.id, "queued")]
    assert listing.problem == "Could not ask box now: its jobs are shown as the bot last saw them."
    assert svc.cancel(world.rt, OWNER, str(job.id)).state == "cancelled"
