"""Kill drill for a rental, on PostgreSQL: a real bot process rents on the RunPod stand-in and is
killed with SIGKILL after the platform answered the launch and before the pod was registered (it
waits for the pod's SSH port, which never answers). Two more bot processes then tick at once,
once the dead process's lease on its Launch row has run out: the orphaned pod is terminated
exactly once, by one of them, and its renter is told once."""

from __future__ import annotations

import json
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
from sqlmodel import select

from bot.local_slack import LocalSlack
from bot.services.instances import launches
from bot.store.db import Database
from bot.store.models import AuditLog, Launch
from tests.bot.services.support import T0
from tests.fixtures.providers import RunpodStandIn, free_port
from tests.fixtures.store import fresh_database

pytestmark = pytest.mark.integration

TOKEN = "xoxb-drill"
REPO = Path(__file__).resolve().parents[2]
#: The process that rents: the store, Slack and RunPod from the environment, the drill's time.
RENTING = textwrap.dedent(
    """
    import sys
    from datetime import datetime
    from bot.app import build_runtime
    from bot.services.access import Caller
    from bot.services.instances import rent
    from bot.settings import Settings
    from bot.store.db import Database

    settings = Settings.from_env(poll_interval_s=10**7)
    rt = build_runtime(settings, db=Database(settings.effective_database_url))
    at = datetime.fromisoformat(sys.argv[1])
    rt.clock = lambda: at
    caller = Caller("UOWNER", channel_id="COPS")
    plan = rent.plan_rent(rt, caller, rent.RentRequest("runpod", "NVIDIA A40", name="drill"))
    print("renting", flush=True)
    rent.rent(rt, caller, plan)
    print("registered", flush=True)
    """
)
#: A process that ticks once at the drill's time, when the file ``argv[2]`` appears, and prints
#: the ids of the orphans it terminated. Before claiming a due row it waits (up to 10 s) until the
#: other process is about to claim too, so that both have found the row due.
TICKING = textwrap.dedent(
    """
    import glob, json, os, sys, time
    from datetime import datetime
    from bot.app import build_runtime
    from bot.services.tick import tick
    from bot.settings import Settings
    from bot.store.db import Database

    from bot.services.instances import launches

    real_claim = launches.claim_orphan

    def claim_together(*args, **kwargs):
        # Each process has read the due row before either claims it: the race the claim settles.
        open(f"{sys.argv[2]}.{os.getpid()}", "w").close()
        deadline = time.monotonic() + 10
        while len(glob.glob(f"{sys.argv[2]}.*")) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        return real_claim(*args, **kwargs)

    launches.claim_orphan = claim_together
    settings = Settings.from_env(poll_interval_s=10**7)
    rt = build_runtime(settings, db=Database(settings.effective_database_url))
    rt.platform_work = None  # the platform calls in this tick, so both processes race
    at = datetime.fromisoformat(sys.argv[1])
    rt.clock = lambda: at
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
        time.sleep(0.005)
    report = tick(rt, at)
    print("terminated " + json.dumps(report.orphans_terminated), flush=True)
    """
)


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Database]:
    with fresh_database("postgresql", tmp_path) as database:
        yield database


@pytest.fixture
def slack() -> Iterator[LocalSlack]:
    with LocalSlack(token=TOKEN, channels={"COPS": "ops"}, users={"UOWNER": "owner"}) as stand_in:
        yield stand_in


@pytest.fixture
def runpod() -> Iterator[RunpodStandIn]:
    stand_in = RunpodStandIn(ssh_port=free_port())  # nothing listens: SSH never answers
    stand_in.start()
    try:
        yield stand_in
    finally:
        stand_in.close()


def _start(
    program: str, db: Database, slack: LocalSlack, runpod: RunpodStandIn, *args: str
) -> subprocess.Popen[str]:
    environment = {
        **os.environ,
        "SLACK_BOT_TOKEN": TOKEN,
        "GPUBOT_SLACK_API_URL": slack.api_url,
        "GPUBOT_DATABASE_URL": db.url.render_as_string(hide_password=False),
        "GPUBOT_CHANNEL": "COPS",
        "GPUBOT_RUNPOD_API_URL": runpod.url,
        "GPUBOT_RUNPOD_API_KEY": runpod.api_key,
        "PYTHONPATH": str(REPO),
    }
    return subprocess.Popen(
        [sys.executable, "-c", program, *args],
        env=environment,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _launched(db: Database) -> list[Launch]:
    with db.session() as session:
        return list(session.exec(select(Launch).where(Launch.state == launches.LAUNCHED)).all())


def _wait_line(process: subprocess.Popen[str], expected: str) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == expected:
            return
    raise AssertionError(f"the process ended before {expected!r} (rc {process.wait()})")


def test_a_rental_killed_between_launch_and_adopt_is_terminated_once_by_one_process(
    pg: Database, slack: LocalSlack, runpod: RunpodStandIn, tmp_path: Path
) -> None:
    renting = _start(RENTING, pg, slack, runpod, T0.isoformat())
    deadline = time.monotonic() + 60
    # Killed once the platform's answer is recorded and the process waits for the pod.
    while not (_launched(pg) and runpod.calls_to("GET", "/pods/")):
        assert renting.poll() is None, renting.stdout.read() if renting.stdout else ""
        assert time.monotonic() < deadline, "the renting process never launched"
        time.sleep(0.02)
    renting.send_signal(signal.SIGKILL)
    renting.wait(timeout=10)
    assert renting.returncode == -signal.SIGKILL
    [row] = _launched(pg)
    pod = row.provider_id
    assert pod in runpod.instances  # running and billing; only its Launch row knows it
    assert row.lease_until == T0 + timedelta(seconds=launches.CLAIM_LEASE_S)

    # Two processes tick at once, once the dead process's lease has run out.
    at = row.lease_until.isoformat()
    go = tmp_path / "go"
    survivors = [_start(TICKING, pg, slack, runpod, at, str(go)) for _ in range(2)]
    try:
        for process in survivors:
            _wait_line(process, "ready")
        # A slow platform: each look at a pod answers late, so that a second process that
        # wrongly went ahead would find the pod still running and terminate it again.
        runpod.holds["GET"] = 0.5
        go.touch()
        outputs = [process.communicate(timeout=120)[0] for process in survivors]
    finally:
        for process in survivors:
            if process.poll() is None:
                process.kill()
    assert [p.returncode for p in survivors] == [0, 0], outputs
    said = sorted(
        json.loads(line.removeprefix("terminated "))
        for out in outputs
        for line in out.splitlines()
        if line.startswith("terminated ")
    )
    assert said == [[], [pod]], outputs  # one process terminated it, the other found it taken

    assert len(runpod.calls_to("DELETE", f"/pods/{pod}")) == 1  # terminated exactly once
    assert pod not in runpod.instances
    with pg.session() as session:
        [final] = session.exec(select(Launch)).all()
        recovered = session.exec(select(AuditLog).where(AuditLog.action == "rent_recovered")).all()
    assert (final.state, final.provider_id, final.holder) == ("terminated", pod, None)
    assert len(recovered) == 1
    told = [c for c in slack.calls_to("chat.postMessage") if "never registered" in str(c.args)]
    assert len(told) == 1  # the renter hears it once
