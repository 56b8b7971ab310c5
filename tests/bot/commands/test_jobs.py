"""`/gpu run`, `jobs`, `logs`, `cancel`, `who` through the real Bolt app (signed HTTP on
loopback), the Slack stand-in and the real agent on an instance reached over a real sshd (a
runtime serving Slack refuses the console-only instance ``local``)."""

from __future__ import annotations

import getpass
import json
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.jobstore import JobStore
from agents.protocol import FINAL_JOB_STATES
from bot.commands import build_registry
from bot.commands.parser import parse
from bot.errors import UsageError
from bot.local_slack import Message, ResponseUrlPost, check_blocks
from bot.services import tick
from bot.store.db import Database
from tests.agents.runner_support import FAST_ENV, Agent, fake_gpu_zipapp
from tests.bot.services.support import Clock, add_instance
from tests.fixtures.fake_nvml import CONFIG_ENV, FakeNvml, fake_driver_library_dir
from tests.fixtures.slack import CHANNEL, SlackBot, payload_json, start_slack_bot
from tests.fixtures.sshd import SshServer, start_sshd

pytestmark = pytest.mark.integration

PY = shutil.which("python3") or "python3"
WRITE_ARGV = (
    "import json, os, sys; "
    "json.dump(sys.argv[1:], open(os.path.join(os.environ['GPUBOT_JOB_DIR'], 'argv.json'), 'w'))"
)
GIB = 1024**3
TRICKY = ["it's", 'say "hi"', "a  b", "$HOME", "a;b", "x | y", "`id`", "$(whoami)", "<&>", ""]


@pytest.fixture(scope="session")
def fake_gpu_agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_gpu_zipapp(tmp_path_factory.mktemp("agent") / "gpu-agent.pyz")


@pytest.fixture
def instance_sshd(
    tmp_path_factory: pytest.TempPathFactory, fake_nvml: FakeNvml
) -> Iterator[SshServer]:
    """A real sshd on loopback standing for the instance: its sessions (so the agent) get the
    fast timings and the fake NVML with two GPUs, since the test's environment stays here."""
    fake_nvml.gpus(2)
    env = {
        **FAST_ENV,
        CONFIG_ENV: str(fake_nvml.path),
        "LD_LIBRARY_PATH": str(fake_driver_library_dir()),
    }
    server = start_sshd(tmp_path_factory.mktemp("sshd"), env=env)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def agent_home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "agent-home"
    yield home
    Agent(home, {}).cleanup()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def start(db: Database, tmp_path: Path, clock: Clock, fake_gpu_agent: Path):  # type: ignore[no-untyped-def]
    return start_slack_bot(db, tmp_path, clock=clock, agent_zipapp=fake_gpu_agent)


@pytest.fixture
def box(sqlite_db: Database, instance_sshd: SshServer, agent_home: Path) -> int:
    return add_instance(
        sqlite_db,
        name="box",
        owner_id="U0ALICE",
        host=instance_sshd.host,
        port=instance_sshd.port,
        ssh_user=instance_sshd.user,
        ssh_key_path=str(instance_sshd.client_key_path),
        host_key_type=instance_sshd.host_key.key_type,
        host_key_b64=instance_sshd.host_key.key_b64,
        host_key_fingerprint=instance_sshd.host_key.fingerprint,
        agent_home=str(agent_home),
        price_micros=7_200_000,
        gpu_count=2,
    )


def ask(bot: SlackBot, text: str, **kwargs: str) -> ResponseUrlPost:
    before = len(bot.slack.responses)
    assert bot.command(text, **kwargs) == 200
    return bot.replies(before + 1)[before]


def channel_messages(bot: SlackBot) -> list[Message]:
    return [e for e in bot.slack.events if isinstance(e, Message) and not e.via_response_url]


def wait_agent(home: Path, timeout: float = 20.0) -> str:
    store = JobStore(str(home))
    deadline = time.monotonic() + timeout
    while True:
        ids = store.all_ids()
        if ids and all(store.read(i)["state"] in FINAL_JOB_STATES for i in ids):
            return ids[-1]
        assert time.monotonic() < deadline, "the agent's jobs did not finish"
        time.sleep(0.05)


def wait_log(home: Path, fragment: str, timeout: float = 20.0) -> None:
    """Wait until the first job's log holds ``fragment``."""
    deadline = time.monotonic() + timeout
    while True:
        logs = sorted(home.glob("jobs/*/log"))
        if logs and fragment in logs[0].read_text(errors="replace"):
            return
        assert time.monotonic() < deadline, f"no {fragment!r} in the job's log"
        time.sleep(0.05)


def test_run_reaches_the_instance_exactly_as_typed_and_replies_once_in_its_thread(
    sqlite_db: Database,
    tmp_path: Path,
    clock: Clock,
    fake_gpu_agent: Path,
    box: int,
    agent_home: Path,
) -> None:
    typed = " ".join(shlex.quote(part) for part in [PY, "-c", WRITE_ARGV, *TRICKY])
    with start(sqlite_db, tmp_path, clock, fake_gpu_agent) as bot:
        answer = ask(bot, f"run box --gpus 1 --retries 1 -- {typed}")
        assert answer.payload["response_type"] == "ephemeral"
        assert "Queued job 1 on box" in payload_json(answer)
        (queued,) = channel_messages(bot)
        assert queued.channel == CHANNEL
        assert not check_blocks(list(queued.blocks))
        agent_job_id = wait_agent(agent_home)
        written = json.loads((agent_home / "jobs" / agent_job_id / "argv.json").read_text())
        assert written == TRICKY

        tick.tick(bot.rt)
        replies = [m for m in channel_messages(bot) if m.thread_ts == queued.ts]
        assert len(replies) == 1
        reply = replies[0]
        assert "Job 1 on box succeeded" in reply.text
        assert not check_blocks(list(reply.blocks))
        buttons = [e for b in reply.blocks if b["type"] == "actions" for e in b["elements"]]
        assert [(b["action_id"], b["value"]) for b in buttons] == [
            ("instance_release_ask", str(box))
        ]
        tick.tick(bot.rt)
    clock.advance(hours=1)
    with start(sqlite_db, tmp_path / "again", clock, fake_gpu_agent) as restarted:
        tick.tick(restarted.rt)
        assert [m for m in channel_messages(restarted) if m.thread_ts] == []


def test_a_job_that_ends_while_the_bot_is_down_gets_one_reply_after_restart(
    sqlite_db: Database,
    tmp_path: Path,
    clock: Clock,
    fake_gpu_agent: Path,
    box: int,
    agent_home: Path,
) -> None:
    with start(sqlite_db, tmp_path, clock, fake_gpu_agent) as bot:
        ask(bot, "run box -- sh -c 'sleep 0.5; echo finished'")
        (queued,) = channel_messages(bot)
    wait_agent(agent_home)
    clock.advance(minutes=30)
    with start(sqlite_db, tmp_path / "again", clock, fake_gpu_agent) as restarted:
        tick.tick(restarted.rt)
        tick.tick(restarted.rt)
        replies = [m for m in channel_messages(restarted) if m.thread_ts == queued.ts]
        assert len(replies) == 1
        assert "finished" in json.dumps(replies[0].blocks)


def test_jobs_logs_who_and_cancel(
    sqlite_db: Database,
    tmp_path: Path,
    clock: Clock,
    fake_gpu_agent: Path,
    box: int,
    agent_home: Path,
) -> None:
    with start(sqlite_db, tmp_path, clock, fake_gpu_agent) as bot:
        ask(bot, "run box --gpus 0,1 -- sh -c 'echo started; sleep 60'")
        wait_log(agent_home, "started")

        listing = ask(bot, "jobs box")
        assert not check_blocks(listing.payload["blocks"])
        assert "running" in payload_json(listing)
        logs = ask(bot, "logs 1 --tail 5")
        assert "started" in payload_json(logs)
        who = ask(bot, "who box")
        assert "GPU 0" in payload_json(who)
        assert "GPU 1" in payload_json(who)
        refused = ask(bot, "cancel 1", user="U0BOB", user_name="bob")
        assert "Only <@U0ALICE>" in payload_json(refused)
        cancelled = ask(bot, "cancel 1")
        assert "Cancelled job 1 on box" in payload_json(cancelled)
        tick.tick(bot.rt)
        threaded = [m for m in channel_messages(bot) if m.thread_ts]
        assert len(threaded) == 1
        assert "cancelled" in threaded[0].text


def test_owner_allows_someone_who_may_then_run(
    sqlite_db: Database,
    tmp_path: Path,
    clock: Clock,
    fake_gpu_agent: Path,
    box: int,
    agent_home: Path,
) -> None:
    with start(sqlite_db, tmp_path, clock, fake_gpu_agent) as bot:
        refused = ask(bot, "run box -- true", user="U0BOB", user_name="bob")
        assert "Ask <@U0ALICE> to give you access" in payload_json(refused)
        assert not (agent_home / "jobs").exists() or not any((agent_home / "jobs").iterdir())
        not_owner = ask(bot, "allow box <@U0BOB|bob>", user="U0BOB", user_name="bob")
        assert "Only <@U0ALICE>" in payload_json(not_owner)
        allowed = ask(bot, "allow box <@U0BOB|bob>")
        assert not check_blocks(allowed.payload["blocks"])
        assert "<@U0BOB> may now run and cancel jobs on *box*" in payload_json(allowed)
        ran = ask(bot, "run box -- true", user="U0BOB", user_name="bob")
        assert "Queued job 1 on box" in payload_json(ran)
        denied = ask(bot, "deny box @bob")
        assert "may no longer run" in payload_json(denied)
        again = ask(bot, "run box -- true", user="U0BOB", user_name="bob")
        assert "give you access" in payload_json(again)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("run box", "Nothing to run after `--`"),
        ("run box --", "Nothing to run after `--`"),
        ("run box --retries x -- true", "--retries 'x' is not a whole number"),
        ("logs 3 --tail 0", "--tail must be 1 or more, not 0"),
        ("run -- true", "The following arguments are required: NAME"),
        ("logs", "The following arguments are required: JOB"),
        ("cancel", "The following arguments are required: JOB"),
        ("who", "The following arguments are required: NAME"),
        ("allow box", "The following arguments are required: @user"),
        ("deny", "The following arguments are required: NAME, @user"),
    ],
)
def test_usage_errors(text: str, message: str) -> None:
    registry = build_registry()
    with pytest.raises(UsageError) as caught:
        parse(text, registry)
    assert message in caught.value.message
    assert caught.value.usage.startswith("/gpu ")


def test_run_keeps_everything_after_the_double_dash_as_the_command() -> None:
    spec, args = parse(
        "run box --gpus 0,1 --retries 2 --release-when-done -- python t.py --gpus 3 -- 'a b'",
        build_registry(),
    )
    assert spec.name == "run"
    assert (args.name, args.gpus, args.retries, args.release_when_done) == ("box", "0,1", 2, True)
    assert args.command == ["python", "t.py", "--gpus", "3", "--", "a b"]
    _, listing = parse("jobs", build_registry())
    assert listing.name is None


def test_run_says_which_gpus_and_refuses_a_missing_one_in_the_agents_words(
    sqlite_db: Database,
    tmp_path: Path,
    clock: Clock,
    fake_gpu_agent: Path,
    box: int,
    agent_home: Path,
) -> None:
    with start(sqlite_db, tmp_path, clock, fake_gpu_agent) as bot:
        missing = payload_json(ask(bot, "run box --gpus 3 -- true"))
        assert "box has 2 GPUs (0, 1); --gpus 3 names GPU 3, which it does not have." in missing
        assert "exit code" not in missing
        assert "gpu-agent" not in missing
        refused = payload_json(ask(bot, "run box --gpus 2gpus -- true"))
        assert "--gpus any:2 (any 2 free GPUs)" in refused
        pinned = ask(bot, """run box --gpus 1 -- python3 -c "print('it ran')" """)
        assert "Queued job 1 on box with GPU 1 (CUDA_VISIBLE_DEVICES=1)." in payload_json(pinned)
        default = ask(bot, "run box -- true")
        assert "with one free GPU (picked when the job starts)" in payload_json(default)
        (first, _) = channel_messages(bot)
        shown = json.dumps(first.blocks)
        assert """python3 -c \\"print('it ran')\\\"""" in shown
        assert "'\"'\"'" not in shown
        assert "GPUs: GPU 1 (CUDA_VISIBLE_DEVICES=1)" in shown


def test_help_for_run_states_what_gpus_means() -> None:
    from bot.commands.jobs import RUN

    text = RUN.summary + " ".join(RUN.examples) + RUN.usage
    for fragment in (
        "--gpus 0 is GPU 0",
        "CUDA_VISIBLE_DEVICES",
        "--gpus any:2",
        "--gpus none",
        "Without --gpus a job gets one free GPU",
        "[--gpus 0,1|any:N|all|none]",
    ):
        assert fragment in text, fragment


def test_free_means_free_over_ssh_other_tenants_and_unseen_memory_are_named(
    sqlite_db: Database,
    tmp_path: Path,
    clock: Clock,
    fake_gpu_agent: Path,
    fake_nvml: FakeNvml,
    box: int,
    agent_home: Path,
) -> None:
    """A 4-GPU instance: GPU 0 runs another tenant's 70 GiB process at 97 %, GPU 1 holds
    78 GiB with no process visible (another container's). The default job goes to GPU 2;
    ``--gpus any:2`` waits for two really free GPUs and its replies name what holds each GPU;
    ``/gpu who`` marks the use outside gpubot."""
    tenant = subprocess.Popen(["sleep", "120"])
    gate = tmp_path / "gate"
    try:
        fake_nvml.gpus(
            4,
            per_gpu={
                0: {
                    "util_gpu": 97,
                    "memory_used": 70 * GIB,
                    "processes": [{"pid": tenant.pid, "used_memory": 70 * GIB}],
                },
                1: {"memory_used": 78 * GIB},
            },
        )
        wait_for_gate = (
            f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)"
        )
        with start(sqlite_db, tmp_path, clock, fake_gpu_agent) as bot:
            default = payload_json(ask(bot, f"run box -- {PY} -c {shlex.quote(wait_for_gate)}"))
            assert "Queued job 1 on box with one free GPU" in default
            assert "These GPUs are in use" not in default
            store = JobStore(str(agent_home))
            first = wait_running(store)
            assert store.read(first)["gpus_assigned"] == [2]

            pair = payload_json(ask(bot, "run box --gpus any:2 -- true"))
            me = getpass.getuser()
            holders = [
                f"*GPU 0*: pid {tenant.pid} · {me} · 70.0 GiB · not a gpubot job; 97% busy",
                "*GPU 1*: 78.0 GiB in use, no process visible (another container?)",
                "*GPU 2*: job `1` · <@U0ALICE>",
            ]
            assert "It waits for any 2 free GPUs (picked when the job starts).*" in pair
            for line in holders:
                assert line in pair  # the caller's answer
            _, queued = channel_messages(bot)
            assert not check_blocks(list(queued.blocks))
            posted = json.dumps(queued.blocks, ensure_ascii=False)
            for line in holders:
                assert line in posted  # and the job's message in the channel
            assert "sleep 120" not in posted  # who holds a GPU, not what it runs
            assert "*GPU 3*" not in posted

            who = payload_json(ask(bot, "who box"))
            assert f"pid {tenant.pid} · {me} · not a gpubot job · 70.0 GiB" in who
            # GPUs 0 and 1; not GPU 2 (job 1's) nor GPU 3 (free).
            assert who.count(":warning: in use outside gpubot: new jobs wait for it") == 2
            assert "GPU 0: 1 process(es), in use outside gpubot; GPU 1: in use" in who
            time.sleep(0.5)
            second = next(i for i in store.all_ids() if i != first)
            assert store.read(second)["state"] == "queued"  # GPU 3 alone is not two

            fake_nvml.gpus(4)  # the tenant and the other container are done
            deadline = time.monotonic() + 20
            while store.read(second)["state"] != "succeeded":
                assert time.monotonic() < deadline, "any:2 never started on the freed GPUs"
                time.sleep(0.05)
            assert store.read(second)["gpus_assigned"] == [0, 1]
            gate.touch()
            wait_agent(agent_home)
            tick.tick(bot.rt)
            replies = {m.thread_ts: json.dumps(m.blocks) for m in channel_messages(bot)}
            first_message, second_message = channel_messages(bot)[:2]
            assert "GPU 2 (CUDA_VISIBLE_DEVICES=2)" in replies[first_message.ts]
            assert "GPUs 0, 1 (CUDA_VISIBLE_DEVICES=0,1)" in replies[second_message.ts]
    finally:
        tenant.kill()
        tenant.wait()


def wait_running(store: JobStore, timeout: float = 20.0) -> str:
    """The id of the first job once it runs."""
    deadline = time.monotonic() + timeout
    while True:
        ids = store.all_ids()
        if ids and store.read(ids[0])["state"] == "running":
            return ids[0]
        assert time.monotonic() < deadline, "the first job never started"
        time.sleep(0.05)
