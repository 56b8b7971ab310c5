"""Fault drills with two bot processes on one store: the first, a real subprocess running a tick,
is killed with SIGKILL in the middle of a post and in the middle of a release; the second (this
test's runtime) ticks after the first one's claim has run out. Slack and RunPod are the
stand-ins, answering late so that the kill lands while the call is under way. Each drill ends
with nothing lost and nothing doubled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from slack_sdk import WebClient
from sqlmodel import select

from bot.local_slack import LocalSlack
from bot.providers.lambda_cloud import LambdaProvider
from bot.providers.runpod import RunpodProvider
from bot.runtime import Runtime
from bot.services.instances import releases
from bot.services.speaking import outbox, prompts
from bot.services.tick import tick
from bot.settings import Settings
from bot.slack_notifier import SlackNotifier
from bot.store.db import Database
from bot.store.models import AuditLog, OutboxMessage, Prompt, Release
from tests.bot.services.support import T0, Clock, add_instance, get_instance, make_runtime
from tests.fixtures.providers import LambdaStandIn, RunpodStandIn
from tests.fixtures.store import sqlite_only

pytestmark = pytest.mark.integration

TOKEN = "xoxb-drill"
REPO = Path(__file__).resolve().parents[2]
D = T0 + timedelta(hours=1)
#: The first process's tick, as a program: the store, Slack and RunPod from the environment.
FIRST_PROCESS = textwrap.dedent(
    """
    import sys
    from datetime import datetime
    from bot.app import build_runtime
    from bot.services.tick import tick
    from bot.settings import Settings
    from bot.store.db import Database

    settings = Settings.from_env(poll_interval_s=10**7)
    rt = build_runtime(settings, db=Database(settings.effective_database_url))
    rt.platform_work = None  # do the release in this tick, so the kill lands inside it
    at = datetime.fromisoformat(sys.argv[1])
    rt.clock = lambda: at  # the drill's time, as in the second process
    print("ticking", flush=True)
    tick(rt, at)
    """
)


@pytest.fixture
def slack() -> Iterator[LocalSlack]:
    with LocalSlack(token=TOKEN, channels={"COPS": "ops"}, users={"UOWNER": "owner"}) as stand_in:
        yield stand_in


def _second_process(db: Database, slack: LocalSlack, clock: Clock, **providers: object) -> Runtime:
    client = WebClient(token=TOKEN, base_url=slack.api_url, timeout=5)
    return make_runtime(
        db,
        clock,
        providers=list(providers.values()),  # type: ignore[arg-type]
        notifier=SlackNotifier(client),
        poll_interval_s=10**7,
    )


def _start_first(db: Database, slack: LocalSlack, at: str, **env: str) -> subprocess.Popen[str]:
    environment = {
        **os.environ,
        "SLACK_BOT_TOKEN": TOKEN,
        "GPUBOT_SLACK_API_URL": slack.api_url,
        "GPUBOT_DATABASE_URL": db.url.render_as_string(hide_password=False),
        "GPUBOT_CHANNEL": "COPS",
        "PYTHONPATH": str(REPO),
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-c", FIRST_PROCESS, at],
        env=environment,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _kill_when(process: subprocess.Popen[str], happened: object, timeout_s: float = 30) -> None:
    """SIGKILL ``process`` as soon as ``happened()`` is true (it must be, in time)."""
    deadline = time.monotonic() + timeout_s
    while not happened():  # type: ignore[operator]
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        assert time.monotonic() < deadline, "the first process never got there"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    assert process.returncode == -signal.SIGKILL


def test_killed_in_the_middle_of_a_post_the_warning_is_found_not_posted_again(
    db: Database, slack: LocalSlack
) -> None:
    iid = add_instance(db, deadline_at=D, last_polled_at=T0 + timedelta(days=1))
    slack.answer_late("chat.postMessage", delay_s=20.0)  # stored, answer held: the kill lands
    first_try = D - timedelta(minutes=30)
    first = _start_first(db, slack, first_try.isoformat())
    _kill_when(first, lambda: slack.calls_to("chat.postMessage"))

    clock = Clock(first_try + timedelta(seconds=prompts.CLAIM_LEASE_S + 1))
    second = _second_process(db, slack, clock)
    tick(second, clock.now)
    tick(second, clock.now + timedelta(minutes=1))
    stored = [c for c in slack.calls_to("chat.postMessage") if "will be released" in str(c.args)]
    assert len(stored) == 1  # the warning the owner got, once
    with db.session() as session:
        [warning] = session.exec(select(Prompt).where(Prompt.instance_id == iid)).all()
    assert (warning.delivery, warning.attempts) == ("posted", 2)
    assert warning.message_ts is not None  # found: its buttons can be taken away later
    assert get_instance(db, iid).state == "active"


# The release's claim on PostgreSQL: the drill below, where the survivor takes it over.
@sqlite_only
def test_killed_in_the_middle_of_a_release_the_next_process_finishes_it_once(
    db: Database, slack: LocalSlack
) -> None:
    runpod = RunpodStandIn()
    runpod.start()
    try:
        pod = runpod.add()
        iid = add_instance(
            db, provider="runpod", provider_instance_id=pod, last_polled_at=T0 + timedelta(days=1)
        )
        clock = Clock(T0)
        provider = RunpodProvider.from_settings(
            Settings(runpod_api_url=runpod.url, runpod_api_key=runpod.api_key)
        )
        second = _second_process(db, slack, clock, runpod=provider)
        opened = releases.request_release(second, iid, reason="user", requested_by="UOWNER")
        runpod.holds["DELETE"] = 20.0  # the pod is terminated, the answer held: the kill lands
        first = _start_first(
            db,
            slack,
            T0.isoformat(),
            GPUBOT_RUNPOD_API_URL=runpod.url,
            GPUBOT_RUNPOD_API_KEY=runpod.api_key,
        )
        _kill_when(first, lambda: runpod.calls_to("DELETE"))
        runpod.holds.clear()
        assert pod not in runpod.instances  # the platform did it; nobody recorded it

        clock.advance(seconds=releases.CLAIM_LEASE_S + 1)
        tick(second, clock.now)
        tick(second, clock.now + timedelta(minutes=1))
    finally:
        runpod.close()
    done = releases.load_release(second, opened.id or 0)
    assert done.state == "confirmed"
    assert get_instance(db, iid).state == "released"
    with db.session() as session:
        confirmed = session.exec(
            select(AuditLog).where(AuditLog.action == "release_confirmed")
        ).all()
        assert len(session.exec(select(Release)).all()) == 1
    assert len(confirmed) == 1
    notices = [c for c in slack.calls_to("chat.postMessage") if "is released" in str(c.args)]
    assert len(notices) == 1  # the owner hears it once


def test_killed_while_releasing_the_survivor_takes_over_within_a_minute(
    db: Database, slack: LocalSlack
) -> None:
    lam = LambdaStandIn()
    lam.start()
    try:
        iid = add_instance(
            db,
            provider="lambda",
            provider_instance_id=lam.add(),
            last_polled_at=T0 + timedelta(days=1),
        )
        clock = Clock(T0)
        url = lam.url + "/api/v1"
        provider = LambdaProvider.from_settings(
            Settings(lambda_api_url=url, lambda_api_key=lam.api_key)
        )
        second = _second_process(db, slack, clock, **{"lambda": provider})
        opened = releases.request_release(second, iid, reason="user", requested_by="UOWNER")
        lam.holds["POST"] = 20.0  # terminated, the answer held: the kill lands mid-release
        first = _start_first(
            db,
            slack,
            T0.isoformat(),
            GPUBOT_LAMBDA_API_URL=url,
            GPUBOT_LAMBDA_API_KEY=lam.api_key,
        )
        _kill_when(first, lambda: lam.calls_to("POST"))
        lam.holds.clear()

        clock.advance(seconds=30)  # the dead holder's claim still stands
        tick(second, clock.now)
        assert releases.load_release(second, opened.id or 0).state == "in_progress"
        clock.advance(seconds=30)  # a minute after the kill: taken over and finished
        tick(second, clock.now)
    finally:
        lam.close()
    done = releases.load_release(second, opened.id or 0)
    assert done.state == "confirmed"
    assert done.confirmed_at is not None
    assert done.confirmed_at <= T0 + timedelta(minutes=1)
    assert get_instance(db, iid).state == "released"
    with db.session() as session:
        confirmed = session.exec(
            select(AuditLog).where(AuditLog.action == "release_confirmed")
        ).all()
    assert len(confirmed) == 1


def test_killed_in_the_middle_of_an_outbox_post_the_message_is_found_not_posted_again(
    db: Database, slack: LocalSlack
) -> None:
    at = T0 + timedelta(hours=2)
    with db.session() as session:
        message_id = outbox.enqueue(
            session,
            key="notice:drill",
            kind="notice",
            recipient="UOWNER",
            text="your rental was recovered",
            now=at,
        )
    slack.answer_late("chat.postMessage", delay_s=20.0)  # stored, answer held: the kill lands
    first = _start_first(db, slack, at.isoformat())
    _kill_when(first, lambda: slack.calls_to("chat.postMessage"))

    clock = Clock(at + timedelta(seconds=outbox.CLAIM_LEASE_S + 1))
    second = _second_process(db, slack, clock)
    tick(second, clock.now)
    tick(second, clock.now + timedelta(minutes=30))
    stored = [
        c for c in slack.calls_to("chat.postMessage") if "rental was recovered" in str(c.args)
    ]
    assert len(stored) == 1  # the person got it once
    with db.session() as session:
        row = session.get(OutboxMessage, message_id)
    assert row is not None
    assert (row.delivery, row.attempts) == (outbox.POSTED, 2)
    assert row.message_ts is not None
