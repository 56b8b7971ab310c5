"""SIGTERM while the bot is in the middle of SSH calls that never end: the real `gpubot serve`
process, with an instance on a real sshd on loopback whose agent hangs (the remote command is a
``sleep``), is told to stop in the middle of a poll (the clock's) or of a `/gpu run` (a user's
command on the bot's pool). It exits well inside the service manager's stop timeout without
waiting for the commands, and nothing is lost: the instance is due a poll again and the next
start polls it; the job the agent queued stays in the store, claim given back, and the next
start finds it and replies once.

The poll runs on SQLite; the run, whose abandoned call gives its claim back to the store while
the process winds down, on PostgreSQL too."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlmodel import select

from bot.errors import Unreachable
from bot.fleet import ssh as ssh_module
from bot.fleet.ssh import SshTransport
from bot.local_slack import LocalSlack
from bot.settings import Settings
from bot.slack_requests import signed_headers, slash_command_body
from bot.store.db import Database
from bot.store.models import Job, UtilSample
from tests.bot.services.support import add_instance, get_instance
from tests.fixtures.slack import BOT_TOKEN, SIGNING_SECRET
from tests.fixtures.sshd import SshServer
from tests.fixtures.store import sqlite_only

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: The bot's stop budget here (GPUBOT_STOP_TIMEOUT_S; 22 s by default, under systemd's
#: TimeoutStopSec=30), seconds: short, so that the test does not wait out the default.
STOP_TIMEOUT_S = 6
#: The exit the test demands after SIGTERM, seconds: the budget and the interpreter's exit.
EXIT_WITHIN_S = STOP_TIMEOUT_S + 3.0
#: Far longer than the test: a command the bot waited for would hold the exit past it.
SSH_COMMAND_TIMEOUT_S = 300
#: How long the remote agent hangs when told to.
HANG_S = 600
OWNER = "UOWNER"
CHANNEL = "C0GENERAL"


class Agent:
    """The agent's Python on the instance: a shell script that runs the real interpreter. While
    ``hang("all")`` is in force every agent command notes its pid and sleeps for ``HANG_S``
    seconds instead; under ``hang("after-run")`` the agent's ``run`` does its work (the job is
    queued), then notes its pid and sleeps holding the session open, so that the answer never
    comes back, and every other command hangs as under ``all``."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.flag = directory / "hang"
        self.pids = directory / "hung-pids"
        self.python = directory / "python"
        python = sys.executable
        # The bot runs `PYTHON -I ZIPAPP COMMAND ...`: the agent's command is $3. A run the
        # agent refuses (its zipapp not there yet) fails as usual.
        self.python.write_text(
            "#!/bin/sh\n"
            f"mode=$(cat '{self.flag}' 2>/dev/null)\n"
            'if [ "$mode" = after-run ] && [ "$3" = run ]; then\n'
            f"    '{python}' \"$@\" || exit $?\n"
            "fi\n"
            'if [ -n "$mode" ]; then\n'
            f"    echo \"$3 $$\" >> '{self.pids}'\n"
            f"    exec sleep {HANG_S}\n"
            "fi\n"
            f"exec '{python}' \"$@\"\n"
        )
        self.python.chmod(0o755)

    def hang(self, mode: str | None) -> None:
        """``all``, ``after-run``, or None: answer every command."""
        if mode is None:
            self.flag.unlink(missing_ok=True)
        else:
            self.flag.write_text(mode)

    def hung(self, command: str | None = None) -> list[int]:
        """Pids of the agent commands (``command`` only, when given) that hung: each a
        ``sleep`` still, unless it was ended."""
        if not self.pids.exists():
            return []
        found = [line.split() for line in self.pids.read_text().splitlines() if line]
        return [int(pid) for name, pid in found if command in (None, name)]

    def end_hung(self) -> None:
        for pid in self.hung():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue


class Bot:
    """`python -m bot.cli serve --http` as a subprocess; its output is read in the background."""

    def __init__(self, env: dict[str, str]) -> None:
        self.child = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve", "--http", "--port", "0"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def wait_until(self, what: str, happened: Callable[[], bool], timeout_s: float = 60) -> None:
        """Wait for ``happened()`` while the process runs; fails with its output otherwise."""
        deadline = time.monotonic() + timeout_s
        while not happened():
            assert self.child.poll() is None, f"the bot ended before {what}:\n{self.text()}"
            assert time.monotonic() < deadline, f"no {what} in {timeout_s:g} s:\n{self.text()}"
            time.sleep(0.05)

    def wait_for_line(self, pattern: str, timeout_s: float = 60) -> str:
        """The first group of the first output line matching ``pattern``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no line matching {pattern!r}:\n{self.text()}")
            self.output.append(line)
            found = re.search(pattern, line)
            if found:
                return found[1]

    def terminate(self, timeout_s: float = 120) -> tuple[int, float]:
        """SIGTERM; (exit status, seconds from the signal to the exit)."""
        sent = time.monotonic()
        self.child.send_signal(signal.SIGTERM)
        code = self.child.wait(timeout=timeout_s)
        return code, time.monotonic() - sent

    def kill(self) -> None:
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait(timeout=30)

    def text(self) -> str:
        while not self.lines.empty():
            self.output.append(self.lines.get_nowait())
        return "".join(self.output)

    def _pump(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            self.lines.put(line)


@pytest.fixture(scope="module")
def agent_zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist/gpu-agent.pyz as the build step makes it, built into a temporary directory."""
    from agents.zipapp import build

    return build(tmp_path_factory.mktemp("agent") / "gpu-agent.pyz")


@pytest.fixture
def slack() -> Iterator[LocalSlack]:
    with LocalSlack(token=BOT_TOKEN, channels={CHANNEL: "general"}, users={OWNER: "owner"}) as s:
        yield s


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    hanging = Agent(tmp_path / "instance")
    try:
        yield hanging
    finally:
        hanging.end_hung()


def _bot_env(db: Database, slack: LocalSlack, data_dir: Path, zipapp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    env.update(
        {
            "SLACK_BOT_TOKEN": BOT_TOKEN,
            "SLACK_SIGNING_SECRET": SIGNING_SECRET,
            "GPUBOT_SLACK_API_URL": slack.api_url,
            "GPUBOT_DATABASE_URL": db.url.render_as_string(hide_password=False),
            "GPUBOT_DATA_DIR": str(data_dir),
            "GPUBOT_METRICS_PORT": "0",
            "GPUBOT_AGENT_ZIPAPP": str(zipapp),
            "GPUBOT_TICK_INTERVAL_S": "1",
            "GPUBOT_POLL_INTERVAL_S": "2",
            "GPUBOT_SSH_COMMAND_TIMEOUT_S": str(SSH_COMMAND_TIMEOUT_S),
            "GPUBOT_STOP_TIMEOUT_S": str(STOP_TIMEOUT_S),
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


def _register(db: Database, sshd: SshServer, agent: Agent) -> int:
    """The instance ``box`` of UOWNER on ``sshd``, its agent's Python being ``agent``'s."""
    return add_instance(
        db,
        name="box",
        host=sshd.host,
        port=sshd.port,
        ssh_user=sshd.user,
        ssh_key_path=str(sshd.client_key_path),
        host_key_type=sshd.host_key.key_type,
        host_key_b64=sshd.host_key.key_b64,
        host_key_fingerprint=sshd.host_key.fingerprint,
        agent_home=sshd.target("box").agent_home,
        python_path=str(agent.python),
    )


def _good_polls(db: Database, instance_id: int) -> int:
    with db.session() as session:
        rows = session.exec(
            select(UtilSample).where(UtilSample.instance_id == instance_id, UtilSample.ok)
        ).all()
    return len(rows)


def _samples(db: Database, instance_id: int) -> int:
    with db.session() as session:
        rows = session.exec(select(UtilSample).where(UtilSample.instance_id == instance_id)).all()
    return len(rows)


def _jobs(db: Database) -> list[Job]:
    with db.session() as session:
        return list(session.exec(select(Job)).all())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _hung_up_by_the_bot(sshd: SshServer) -> bool:
    """Whether the bot closed its first connection (the one whose command hung)."""
    log = sshd.log_path.read_text(errors="replace")
    found = re.search(r"Accepted publickey for \S+ from (\S+) port (\d+)", log)
    assert found is not None, log
    return f"Connection closed by {found[1]} port {found[2]}" in log


def test_closing_the_transport_ends_a_hung_command_at_once(sshd: SshServer) -> None:
    """What the stop relies on: closing the connection (Fleet.close) ends a command hung on the
    instance with Unreachable at once, not after the grace for late output, so the call's
    own cleanup (a job's claim given back) runs before the process exits."""
    transport = SshTransport(
        sshd.target("box"), settings=Settings(ssh_connect_timeout_s=5, ssh_command_timeout_s=300)
    )
    marker = sshd.directory / "started"
    outcome: queue.Queue[BaseException | None] = queue.Queue()

    def call() -> None:
        try:
            transport.exec(["sh", "-c", f"touch '{marker}'; exec sleep {HANG_S}"], timeout_s=300)
        except BaseException as exc:  # handed to the test
            outcome.put(exc)
        else:
            outcome.put(None)

    threading.Thread(target=call, daemon=True).start()
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.02)
    closed = time.monotonic()
    transport.close()
    ended = outcome.get(timeout=30)
    took_s = time.monotonic() - closed
    assert isinstance(ended, Unreachable), ended
    assert took_s < ssh_module.EOF_GRACE_S / 2, took_s


@sqlite_only
def test_sigterm_mid_poll_exits_at_once_and_the_next_start_polls_again(
    db: Database, sshd: SshServer, slack: LocalSlack, agent: Agent, agent_zipapp: Path
) -> None:
    iid = _register(db, sshd, agent)
    env = _bot_env(db, slack, agent.directory / "data", agent_zipapp)
    agent.hang("all")
    first = Bot(env)
    try:
        # The clock's first tick polls the instance: its status command hangs there.
        first.wait_until("a hung poll", lambda: bool(agent.hung()))
        time.sleep(0.5)  # well inside the call
        code, took_s = first.terminate()
    finally:
        first.kill()
    print(f"mid-poll: exit {code} {took_s:.2f} s after SIGTERM")
    assert code == 0, first.text()
    assert took_s < EXIT_WITHIN_S, first.text()
    # Abandoned, not waited for: the bot hung up while the command still runs on the instance.
    [hung] = agent.hung()
    assert _alive(hung)
    assert _hung_up_by_the_bot(sshd)
    # Nothing lost: the instance is still active and no poll pretends to have succeeded.
    inst = get_instance(db, iid)
    assert inst.state == "active"
    assert inst.last_polled_at is not None  # the first process had claimed this poll
    assert _good_polls(db, iid) == 0
    # A poll the bot hung up on at shutdown is no failed poll: nothing recorded of the machine.
    assert inst.last_poll_ok is None
    assert _samples(db, iid) == 0

    agent.hang(None)
    second = Bot(env)
    try:
        second.wait_until("a poll by the next start", lambda: _good_polls(db, iid) >= 1)
        code, took_s = second.terminate()
    finally:
        second.kill()
    print(f"mid-poll, next start: exit {code} {took_s:.2f} s after SIGTERM")
    assert code == 0, second.text()
    assert took_s < EXIT_WITHIN_S, second.text()
    polled = get_instance(db, iid)
    assert (polled.state, polled.last_poll_ok) == ("active", True)


def test_sigterm_mid_run_abandons_the_command_and_the_next_start_replies_once(
    db: Database, sshd: SshServer, slack: LocalSlack, agent: Agent, agent_zipapp: Path
) -> None:
    _register(db, sshd, agent)
    env = _bot_env(db, slack, agent.directory / "data", agent_zipapp)
    agent.hang("after-run")  # the job is queued; the answer never comes back
    first = Bot(env)
    try:
        url = first.wait_for_line(r"serving Slack requests at (http://\S+/slack/events)")
        body = slash_command_body(
            text="run box --gpus none -- true",
            user_id=OWNER,
            user_name="owner",
            channel_id=CHANNEL,
            response_url=slack.response_url(CHANNEL, OWNER),
        )
        request = urllib.request.Request(
            url, data=body.encode(), headers=signed_headers(body, SIGNING_SECRET)
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200  # acked: the command runs on the bot's pool
        first.wait_until("a hung `run`", lambda: bool(agent.hung("run")))
        time.sleep(0.5)
        code, took_s = first.terminate()
    finally:
        first.kill()
    output = first.text()
    print(f"mid-run: exit {code} {took_s:.2f} s after SIGTERM")
    assert code == 0, output
    assert took_s < EXIT_WITHIN_S, output
    [hung] = agent.hung("run")
    assert _alive(hung)
    assert _hung_up_by_the_bot(sshd)
    # Nothing lost: the job the agent queued is in the store, waiting to be confirmed.
    [job] = _jobs(db)
    assert job.state == "queued"
    assert job.agent_job_id.startswith("pending-")
    assert job.reply_claimed_at is None  # the abandoned call gave its claim back

    agent.hang(None)
    second = Bot(env)
    try:
        second.wait_until(
            "the job's reply", lambda: all(j.replied_at is not None for j in _jobs(db))
        )
        code, took_s = second.terminate()
    finally:
        second.kill()
    print(f"mid-run, next start: exit {code} {took_s:.2f} s after SIGTERM")
    assert code == 0, second.text()
    assert took_s < EXIT_WITHIN_S, second.text()
    [job] = _jobs(db)
    assert (job.state, job.exit_code) == ("succeeded", 0)  # found, not lost
    assert not job.agent_job_id.startswith("pending-")
    # The owner was told the bot would find the job, and hears that it ended, once.
    [answer] = [r.payload["text"] for r in slack.responses]
    assert "I will find it and reply when it ends" in answer
    posts = [str(c.args.get("text")) for c in slack.calls_to("chat.postMessage")]
    done = [text for text in posts if "on box succeeded" in text]
    assert len(done) == 1, posts
    assert done[0].startswith("Job 1 on box succeeded"), posts
