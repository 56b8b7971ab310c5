"""The bot process killed with SIGKILL between a warning and the deadline, then started again
after the deadline: the instance is released once and its owner was warned once.

Real parts: the bot's runtime in a subprocess on a SQLite file, the real Slack notifier talking
to the local Slack stand-in, the real RunPod provider talking to its HTTP stand-in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import select

from bot.local_slack import LocalSlack
from bot.store.db import Database
from bot.store.models import Instance, Release
from tests.bot.services.support import add_instance
from tests.fixtures.providers import RunpodStandIn

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 2, 12, 0, 0)
D = T0 + timedelta(hours=1)
OWNER = "U0OWNER"
ROOT = Path(__file__).resolve().parents[2]


class BotProcess:
    """tests/bot/tick_driver.py as a subprocess; ``tick_at`` waits for the tick to finish."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.bot.tick_driver"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self._line() == "ready"

    def tick_at(self, at: datetime) -> str:
        self.send(at)
        line = self._line()
        assert line.startswith(f"ticked {at.isoformat()}"), line
        return line.rsplit(" ", 1)[-1]

    def send(self, at: datetime) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(at.isoformat() + "\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        assert self.process.returncode == -signal.SIGKILL

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(30)

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"the bot process ended (exit {self.process.poll()})")
        return line.strip()


@pytest.fixture
def slack():
    with LocalSlack(token="xoxb-restart", users={OWNER: "owner"}) as stand_in:
        yield stand_in


def _warnings(slack: LocalSlack) -> list[str]:
    return [
        str(call.args.get("text", ""))
        for call in slack.calls_to("chat.postMessage")
        if "will be released" in str(call.args.get("text", ""))
    ]


def test_killed_between_warning_and_deadline_releases_once_and_warns_once(
    tmp_path, runpod_cloud: RunpodStandIn, slack
):
    runpod = runpod_cloud
    db_url = f"sqlite:///{tmp_path / 'bot.sqlite3'}"
    db = Database(db_url)
    db.migrate()
    pod = runpod.add()
    iid = add_instance(
        db,
        name="pod1",
        owner_id=OWNER,
        provider="runpod",
        provider_instance_id=pod,
        deadline_at=D,
        created_at=T0,
        last_polled_at=T0,
    )
    env = {
        **os.environ,
        "GPUBOT_DATABASE_URL": db_url,
        "GPUBOT_DATA_DIR": str(tmp_path / "data"),
        "GPUBOT_SLACK_API_URL": slack.api_url,
        "SLACK_BOT_TOKEN": slack.token,
        "GPUBOT_RUNPOD_API_URL": runpod.url,
        "GPUBOT_RUNPOD_API_KEY": runpod.api_key,
        "GPUBOT_POLL_INTERVAL_S": str(10**8),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("SLACK_APP_TOKEN", None)

    first = BotProcess(env)
    for at in (D - timedelta(minutes=40), D - timedelta(minutes=30), D - timedelta(minutes=25)):
        first.tick_at(at)
    assert len(_warnings(slack)) == 1
    first.send(D - timedelta(minutes=20))  # killed in the middle of a tick
    first.kill()

    # Down through the 10-minute warning and the deadline; back five minutes after it.
    second = BotProcess(env)
    second.tick_at(D + timedelta(minutes=5))
    for minute in (6, 7, 20):
        second.tick_at(D + timedelta(minutes=minute))
    second.stop()

    # And once more, as a restart after the release.
    third = BotProcess(env)
    third.tick_at(D + timedelta(minutes=30))
    third.stop()

    assert len(_warnings(slack)) == 1
    assert len(runpod.calls_to("DELETE", f"/pods/{pod}")) == 1
    assert pod not in runpod.instances
    with db.session() as session:
        inst = session.get(Instance, iid)
        assert inst is not None
        assert inst.state == "released"
        assert inst.released_at == D + timedelta(minutes=5)
        assert [(r.reason, r.state) for r in session.exec(select(Release)).all()] == [
            ("deadline", "confirmed")
        ]
    updates = [str(c.args.get("text", "")) for c in slack.calls_to("chat.update")]
    assert any("Release requested (its deadline passed)" in text for text in updates)
    db.dispose()
