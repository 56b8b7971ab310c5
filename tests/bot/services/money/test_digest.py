"""The monthly digest: due on the 1st at 00:15 local, exactly once, catch-up after downtime."""

from __future__ import annotations

import json
import threading
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlmodel import select

from bot.app import build_runtime
from bot.local_slack import LocalSlack, Message, SharedFile
from bot.services.money import digest
from bot.services.speaking import outbox
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import Digest, Job
from tests.bot.services.support import Clock, RecordingNotifier, add_instance, make_runtime

BERLIN = ZoneInfo("Europe/Berlin")
USD = 1_000_000


class UploadingNotifier(RecordingNotifier):
    """The recording notifier, keeping uploads too."""

    def __init__(self) -> None:
        super().__init__()
        self.uploads: list[tuple[str, str, bytes, str | None]] = []
        self.titles: list[str] = []

    def upload_file(
        self,
        channel: str,
        filename: str,
        content: bytes,
        *,
        title: str,
        comment: str = "",
        thread_ts: str | None = None,
    ) -> None:
        self.uploads.append((channel, filename, content, thread_ts))
        self.titles.append(title)


def seed(db: Database) -> None:
    """February: a 4090 run for 100 h; March: an H100 box for 700 h, long enough that the
    monthly plan in the price table is cheaper, with one expensive job."""
    feb = add_instance(
        db,
        name="rtx",
        owner_id="UBOB",
        gpu_model="rtx-4090",
        price_micros=700_000,
        created_at=datetime(2026, 2, 2, 0, 0),
        released_at=datetime(2026, 2, 6, 4, 0),
        state="released",
    )
    march = add_instance(
        db,
        name="big",
        owner_id="UALICE",
        project="llm",
        gpu_model="h100-sxm",
        gpu_count=1,
        price_micros=3 * USD,
        created_at=datetime(2026, 3, 1, 0, 0),
        released_at=datetime(2026, 3, 30, 4, 0),
        state="released",
    )
    with db.session() as session:
        session.add(
            Job(
                instance_id=march,
                agent_job_id="j-42",
                requested_by="UALICE",
                command_json=json.dumps(["python", "train.py", "--epochs", "3"]),
                state="succeeded",
                started_at=datetime(2026, 3, 2, 0, 0),
                finished_at=datetime(2026, 3, 4, 0, 0),
            )
        )
    assert feb != march


def runtime(db: Database, clock: Clock, notifier: RecordingNotifier | None = None) -> Any:
    return make_runtime(
        db, clock, notifier=notifier or UploadingNotifier(), timezone="Europe/Berlin"
    )


def test_due_time_is_a_quarter_past_midnight_local_on_the_first() -> None:
    assert digest.digest_due_at("2026-03", BERLIN) == datetime(2026, 3, 31, 22, 15)  # CEST
    assert digest.digest_due_at("2026-01", BERLIN) == datetime(2026, 1, 31, 23, 15)  # CET
    assert digest.digest_due_at("2026-12", ZoneInfo("UTC")) == datetime(2027, 1, 1, 0, 15)


def test_posts_each_month_once_including_missed_ones(db: Database) -> None:
    seed(db)
    clock = Clock(datetime(2026, 3, 31, 22, 14))  # 00:14 in Berlin: March is not due yet
    notifier = UploadingNotifier()
    rt = runtime(db, clock, notifier)
    # February was missed while the bot was down; it goes out now, March not yet.
    assert digest.post_due_digests(rt, clock.now) == ["2026-02"]
    assert digest.post_due_digests(rt, clock.now) == []
    clock.advance(minutes=1)
    assert digest.post_due_digests(rt, clock.now) == ["2026-03"]
    clock.advance(days=3)
    assert digest.post_due_digests(rt, clock.now) == []
    assert [p.channel for p in notifier.posts] == ["COPS", "COPS"]
    assert [u[1] for u in notifier.uploads] == ["gpu-spend-2026-02.png", "gpu-spend-2026-03.png"]
    assert notifier.uploads[1][3] == notifier.posts[1].ts  # the chart is in the thread
    assert notifier.uploads[1][2].startswith(b"\x89PNG")
    with db.session() as session:
        rows = list(session.exec(select(Digest).order_by(Digest.month)))
    assert [(r.month, r.posted_at is not None, r.message_ts) for r in rows] == [
        ("2026-02", True, notifier.posts[0].ts),
        ("2026-03", True, notifier.posts[1].ts),
    ]


def test_digest_content(db: Database) -> None:
    seed(db)
    clock = Clock(datetime(2026, 4, 1, 7, 0))
    notifier = UploadingNotifier()
    digest.post_due_digests(runtime(db, clock, notifier), clock.now)
    march = notifier.posts[-1]
    body = json.dumps(march.blocks)
    # 700 h at $3 = $2,100 against February's 100 h at $0.70 = $70.
    assert "$2,100.00" in march.text
    assert "up 2900% on the month before" in march.text
    assert "<@UALICE>" in body
    assert "h100-sxm" in body
    assert "llm" in body
    assert "A monthly plan would have been cheaper" in body
    assert "$530.00 less" in body  # $2,100 - the table's $1,570 plan
    assert "j-42" in body
    assert "python train.py --epochs 3" in body
    assert "$144.00" in body  # the job's 48 h share
    assert notifier.titles[-1] == "GPU spend per day, March 2026"


def test_top_jobs_keep_the_whole_command(db: Database) -> None:
    seed(db)
    jobs = digest.top_jobs(db, datetime(2026, 3, 1), datetime(2026, 4, 1))
    assert [(j.job_id, j.command, j.duration_s) for j in jobs] == [
        ("j-42", "python train.py --epochs 3", 48 * 3600)
    ]


def test_two_processes_ticking_together_post_once(db: Database) -> None:
    seed(db)
    clock = Clock(datetime(2026, 4, 1, 7, 5))
    notifiers = [UploadingNotifier(), UploadingNotifier(), UploadingNotifier()]
    barrier = threading.Barrier(len(notifiers))
    errors: list[BaseException] = []

    def run(notifier: UploadingNotifier) -> None:
        other = Database(db.url.render_as_string(hide_password=False))
        try:
            barrier.wait(timeout=10)
            digest.post_due_digests(runtime(other, clock, notifier), clock.now)
        except BaseException as exc:
            errors.append(exc)
        finally:
            other.dispose()

    threads = [threading.Thread(target=run, args=(n,)) for n in notifiers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    months = sorted(p.text.split(":")[0] for n in notifiers for p in n.posts)
    assert months == ["GPU spend in February 2026", "GPU spend in March 2026"]


def test_a_claim_left_by_a_crash_is_retried_after_it_goes_stale(db: Database) -> None:
    seed(db)
    clock = Clock(datetime(2026, 4, 1, 7, 0))
    for month in ("2026-02", "2026-03"):
        assert digest.claim(db, month, clock.now)  # then the process died before posting
    notifier = UploadingNotifier()
    rt = runtime(db, clock, notifier)
    clock.advance(minutes=14)
    assert digest.post_due_digests(rt, clock.now) == []
    clock.advance(minutes=2)
    assert digest.post_due_digests(rt, clock.now) == ["2026-02", "2026-03"]
    assert digest.post_due_digests(rt, clock.now) == []
    assert len(notifier.posts) == 2


def test_a_failed_post_is_retried(db: Database) -> None:
    seed(db)
    clock = Clock(datetime(2026, 4, 1, 7, 0))
    notifier = UploadingNotifier()
    rt = runtime(db, clock, notifier)
    notifier.fail_posts = True
    assert digest.post_due_digests(rt, clock.now) == ["2026-02", "2026-03"]  # queued once
    assert notifier.posts == []
    assert notifier.uploads == []
    notifier.fail_posts = False
    clock.advance(minutes=16)
    assert digest.post_due_digests(rt, clock.now) == []  # never built twice
    assert outbox.deliver_due(rt, clock.now) == 2  # the outbox retries both
    assert outbox.deliver_due(rt, clock.now) == 0
    assert len(notifier.posts) == 2
    assert [u[1] for u in notifier.uploads] == ["gpu-spend-2026-02.png", "gpu-spend-2026-03.png"]
    assert [u[3] for u in notifier.uploads] == [post.ts for post in notifier.posts]  # in thread


def test_no_channel_no_digest(db: Database) -> None:
    seed(db)
    clock = Clock(datetime(2026, 4, 1, 7, 0))
    rt = make_runtime(db, clock, notifier=UploadingNotifier(), channel=None)
    assert digest.post_due_digests(rt, clock.now) == []
    with db.session() as session:
        assert list(session.exec(select(Digest))) == []


def test_catch_up_is_bounded(db: Database) -> None:
    add_instance(db, created_at=datetime(2024, 1, 1), price_micros=USD)
    clock = Clock(datetime(2026, 4, 2))
    months = digest.due_months(db, clock.now, BERLIN)
    assert len(months) == digest.MAX_CATCH_UP_MONTHS
    assert months[-1] == "2026-03"


@pytest.mark.integration
def test_chart_goes_through_the_three_step_upload(
    sqlite_db: Database, tmp_path: Path, local_slack: LocalSlack
) -> None:
    seed(sqlite_db)
    clock = Clock(datetime(2026, 4, 1, 7, 0))
    settings = Settings(
        slack_bot_token="xoxb-test-token",
        slack_api_url=local_slack.api_url,
        data_dir=tmp_path / "data",
        channel="C0GENERAL",
        timezone="Europe/Berlin",
    )
    rt = build_runtime(settings, db=sqlite_db, clock=clock)
    try:
        assert digest.post_due_digests(rt, clock.now) == ["2026-02", "2026-03"]
    finally:
        rt.executor.shutdown(wait=True)
    assert len(local_slack.calls_to("files.getUploadURLExternal")) == 2
    assert len(local_slack.calls_to("files.completeUploadExternal")) == 2
    files = [e for e in local_slack.events if isinstance(e, SharedFile)]
    assert [f.filename for f in files] == ["gpu-spend-2026-02.png", "gpu-spend-2026-03.png"]
    assert all(f.content.startswith(b"\x89PNG") for f in files)
    assert all(f.channel == "C0GENERAL" for f in files)
    digests = [e for e in local_slack.events if isinstance(e, Message) and e.thread_ts is None]
    assert [m.text.split(":")[0] for m in digests] == [
        "GPU spend in February 2026",
        "GPU spend in March 2026",
    ]
    # Each chart sits in the thread of its own month's message.
    assert [f.thread_ts for f in files] == [m.ts for m in digests]


def test_plans_priced_in_another_currency_are_not_compared(db: Database) -> None:
    seed(db)
    clock = Clock(datetime(2026, 4, 1, 7, 0))
    notifier = UploadingNotifier()
    rt = make_runtime(db, clock, notifier=notifier, timezone="Europe/Berlin", currency="EUR")
    digest.post_due_digests(rt, clock.now)
    march = notifier.posts[-1]
    body = json.dumps(march.blocks)
    assert "€2,100.00" in march.text
    assert "A monthly plan would have been cheaper" not in body
