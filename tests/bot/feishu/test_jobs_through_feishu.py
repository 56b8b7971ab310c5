"""A job run through Feishu: Alice sends `/gpu run local -- …` to the bot in her one-to-one chat
(a signed, encrypted message event to the request URL), on a runtime that serves Feishu alone
as the console builds its own (the instance ``local`` run by the real agent through the local
transport, a fake idle RTX 4090). The bot posts the job's card and answers her message; the
clock then ticks until the job ends, and its completion reply lands once, in the thread of the
job's card, through the official SDK to the OpenAPI stand-in, saying how it ended (a job that
succeeds, and one that exits with code 1). Later ticks post nothing more.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
from sqlmodel import select

from bot.executor import BotExecutor
from bot.feishu.client import FeishuClient
from bot.feishu.events import EventVerifier
from bot.feishu.notifier import FeishuNotifier
from bot.feishu.routing import RoutingNotifier
from bot.feishu.serve import EVENTS_PATH, FeishuEndpoint, build_gate
from bot.feishu.standin import FeishuStandIn, StoredMessage
from bot.http_server import SlackHttpServer
from bot.runtime import Runtime
from bot.services.speaking import identities
from bot.services.tick import tick
from bot.store.models import Job
from tests.bot.feishu.test_events import KEY, TOKEN
from tests.bot.feishu.test_readme_walk import (
    OPEN_ID,
    FeishuSide,
    card_words,
    close,
    console_runtime,
)
from tests.bot.services.support import Clock
from tests.bot.test_readme_zh import RTX_4090
from tests.fixtures.fake_nvml import FakeNvml
from tests.fixtures.store import fresh_database

pytestmark = pytest.mark.integration

OPS_CHAT = "oc_ops"
#: Alice's line: a job that prints a word and ends well.
SAY_HI = "/gpu run local -- python3 -c \"print('hi')\""
#: A job that prints a word and exits with code 1.
SAY_BYE_AND_FAIL = "/gpu run local -- python3 -c \"import sys; print('bye'); sys.exit(1)\""
#: The longest real time a job of a line of Python may take to end and be seen, in seconds.
JOB_WAIT_S = 20.0
#: Real time between ticks while the job runs, in seconds.
TICK_PAUSE_S = 0.05
#: The longest wait for the executor or the platform pools to finish, in seconds.
IDLE_WAIT_S = 20.0


@dataclass
class Served:
    """The runtime serving Feishu alone, its clock, the stand-in and Alice's side of the chat."""

    rt: Runtime
    clock: Clock
    standin: FeishuStandIn
    alice: FeishuSide

    def tick(self) -> None:
        """One tick a poll interval on, its work finished."""
        tick(self.rt, self.clock.advance(seconds=self.rt.settings.poll_interval_s))
        self.settle()

    def settle(self) -> None:
        if self.rt.platform_work is not None:
            assert self.rt.platform_work.wait_idle(IDLE_WAIT_S)
        assert isinstance(self.rt.executor, BotExecutor)
        assert self.rt.executor.wait_idle(IDLE_WAIT_S)

    def tick_until_ended(self, job_id: int) -> int:
        """Tick until the job is final in the bot's store; how many ticks that took."""
        deadline = time.monotonic() + JOB_WAIT_S
        ticks = 0
        while job_row(self.rt, job_id).state in ("queued", "running"):
            assert time.monotonic() < deadline, f"job {job_id} never ended"
            time.sleep(TICK_PAUSE_S)
            self.tick()
            ticks += 1
        return ticks

    def replies_to(self, message_id: str) -> list[StoredMessage]:
        return [m for m in self.standin.messages if m.parent_id == message_id]


@pytest.fixture
def served(
    tmp_path: Path,
    fake_nvml: FakeNvml,
    fake_gpu_zipapp: Path,
) -> Iterator[Served]:
    """As `gpubot feishu --http` serves Feishu alone, on the console's runtime (the walk's)."""
    fake_nvml.gpus(1, RTX_4090)  # idle: free for the job
    seconds = itertools.count(0.0, 1.0)  # a second between calls: no chat's rate is reached
    with (
        FeishuStandIn(clock=lambda: next(seconds)) as standin,
        fresh_database("sqlite", tmp_path) as db,
    ):
        client = FeishuClient(standin.app_id, standin.app_secret, api_url=standin.url)
        clock = Clock()
        router = RoutingNotifier(slack=None, feishu=FeishuNotifier(client, now=clock))
        rt = console_runtime(
            db, tmp_path, fake_gpu_zipapp, router, clock, channel=OPS_CHAT, feishu_chat=OPS_CHAT
        )
        router.feishu_of = partial(identities.feishu_of, rt)
        gate = build_gate(rt, client)
        verifier = EventVerifier(verification_token=TOKEN, encrypt_key=KEY)
        server = SlackHttpServer(None, chat=FeishuEndpoint(verifier, gate), port=0).start()
        try:
            url = server.base_url + EVENTS_PATH
            yield Served(rt, clock, standin, FeishuSide(rt, standin, url, client, "jobs"))
        finally:
            server.shutdown()
            gate.front.close()
            close(rt)


def job_row(rt: Runtime, job_id: int) -> Job:
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def only_job(rt: Runtime) -> Job:
    with rt.db.session() as session:
        [job] = session.exec(select(Job)).all()
        return job


def run_through_feishu(served: Served, line: str) -> tuple[Job, StoredMessage]:
    """Alice sends ``line``; the job it queued and the job's card, checked to be where she
    typed, with the answer to her message."""
    chat = served.standin.p2p_chat(OPEN_ID)
    before = len(served.standin.messages)
    shown = served.alice.command(line)
    job = only_job(served.rt)
    assert job.id is not None
    new = served.standin.messages[before:]
    typed, card, answer = new  # her message (sent in her name), the job's card, the answer
    assert typed.msg_type == "text"
    assert (card.chat_id, card.parent_id, card.msg_type) == (chat, None, "interactive")
    assert f"Job {job.id} queued on local" in card_words(card.card)
    assert (job.channel_id, job.message_ts) == (chat, card.message_id)
    assert (answer.parent_id, answer.chat_id) == (typed.message_id, chat)
    assert f"Queued job {job.id} on local" in card_words(answer.card)
    assert "I'll reply in its thread when it ends" in card_words(answer.card)
    assert len(shown) == 2
    return job, card


def replied_in_thread(served: Served, message_id: str) -> list[bool]:
    """``reply_in_thread`` of each reply to ``message_id`` Feishu took, in order."""
    path = f"/open-apis/im/v1/messages/{message_id}/reply"
    return [
        bool(r.body.get("reply_in_thread"))
        for r in served.standin.requests
        if r.method == "POST" and r.path == path and r.answered == 200
    ]


@pytest.mark.parametrize(
    ("line", "state", "mark", "exit_code", "said"),
    [
        (SAY_HI, "succeeded", "✅", 0, "hi"),
        (SAY_BYE_AND_FAIL, "failed", "❌", 1, "bye"),
    ],
    ids=["succeeds", "fails"],
)
def test_a_job_run_through_feishu_gets_one_completion_reply_in_its_thread(
    served: Served, line: str, state: str, mark: str, exit_code: int, said: str
) -> None:
    job, card = run_through_feishu(served, line)
    assert job.id is not None
    assert job.state in ("queued", "running")
    assert job.replied_at is None

    assert served.tick_until_ended(job.id) >= 1
    ended = job_row(served.rt, job.id)
    assert (ended.state, ended.exit_code) == (state, exit_code)
    assert ended.replied_at is not None
    [reply] = served.replies_to(card.message_id)
    assert (reply.chat_id, reply.root_id, reply.msg_type) == (
        card.chat_id,
        card.message_id,
        "interactive",
    )
    assert reply.thread_id is not None
    assert replied_in_thread(served, card.message_id) == [True]
    words = card_words(reply.card)
    assert words.startswith(f"{mark} Job {job.id} on local {state} @{OPEN_ID}")
    assert f"State {state}" in words
    assert f"Exit code {exit_code}" in words
    assert said in words.split()  # the log's last line

    # The clock goes on: nothing more is posted or changed, in the thread or anywhere.
    sent = len(served.standin.requests)
    posted = len(served.standin.messages)
    for _ in range(3):
        served.tick()
    assert len(served.standin.messages) == posted
    assert served.replies_to(card.message_id) == [reply]
    assert [
        r.path for r in served.standin.requests[sent:] if r.path.startswith("/open-apis/im/")
    ] == []
