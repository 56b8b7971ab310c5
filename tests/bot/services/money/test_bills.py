"""`/gpu bills`: the platforms' bills (AWS Cost Explorer through its stand-in and the real boto3
client) beside gpubot's own ledger, on SQLite and PostgreSQL: matches, flags with their causes,
one ops post per difference across ticks and a restart, and a platform that fails."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import event
from sqlmodel import select

from bot.commands import build_registry
from bot.commands.parser import parse
from bot.commands.registry import Reply
from bot.local_slack import check_blocks
from bot.platform_work import PlatformWork
from bot.providers.aws import AwsProvider
from bot.providers.registry import ProviderRegistry
from bot.runtime import Runtime
from bot.services import tick
from bot.services.access import Caller
from bot.services.money import bills, ledger
from bot.services.speaking import outbox
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import BillFetch, OutboxMessage, PlatformBill
from tests.bot.services.support import Clock, RecordingNotifier, add_instance, make_runtime
from tests.fixtures.platforms.cost_explorer import CostExplorerStandIn, cost_explorer_standin
from tests.fixtures.platforms.runpod import RunpodStandIn
from tests.fixtures.slack import start_slack_bot

pytestmark = pytest.mark.integration

USD = 1_000_000
#: When the clock reads the bills: they cover whole days up to Dec 4 00:00, from Nov 20.
NOW = datetime(2026, 12, 4, 10, 0)
REGISTRY = build_registry()
ADMIN = Caller(user_id="UADMIN", channel_id="CTEAM")


@pytest.fixture
def ce(monkeypatch: pytest.MonkeyPatch) -> Iterator[CostExplorerStandIn]:
    with cost_explorer_standin(monkeypatch) as standin:
        yield standin


class Notifier(RecordingNotifier):
    """Records posts; files (the month's digest chart) are taken and dropped."""

    def upload_file(self, channel: str, filename: str, content: bytes, **kwargs: object) -> None:
        return None

    def flags(self) -> list[str]:
        return [p.text for p in self.to("COPS") if "Likely cause" in p.text]


def runtime(
    db: Database,
    clock: Clock,
    ce: CostExplorerStandIn,
    *,
    ec2: str | None = None,
    **kwargs: Any,
) -> Runtime:
    aws = AwsProvider(region="us-east-1", endpoint_url=ec2, cost_explorer_url=ce.url)
    return make_runtime(db, clock, providers=[aws], notifier=Notifier(), **kwargs)


def released(
    db: Database, name: str, pid: str, start: datetime, end: datetime, **fields: object
) -> int:
    values: dict[str, object] = {"provider": "aws", **fields}
    return add_instance(
        db,
        name=name,
        provider_instance_id=pid,
        state="released",
        created_at=start,
        released_at=end,
        release_mode="terminate",
        **values,
    )


def fleet(db: Database, ce: CostExplorerStandIn) -> None:
    """gpubot's instances and AWS's bill for them: some agree, others differ by one cause each."""
    d1, d2, d3 = (datetime(2026, 12, day) for day in (1, 2, 3))
    # Agrees: 2 h at $2/h.
    released(
        db,
        "match",
        "i-match",
        d1 + timedelta(hours=10),
        d1 + timedelta(hours=12),
        price_micros=2 * USD,
    )
    ce.bill("i-match", date(2026, 12, 1), "4.00")
    # gpubot bills from SSH-ready (10:20), AWS from the launch (10:00): 20 min at $3/h.
    released(
        db,
        "late",
        "i-late",
        d2 + timedelta(hours=10),
        d2 + timedelta(hours=12),
        price_micros=3 * USD,
        billing_from="ssh_ready",
        ssh_ready_at=d2 + timedelta(hours=10, minutes=20),
    )
    ce.bill("i-late", date(2026, 12, 2), "6.00")
    # 24 h at $1/h plus 1000 GB of EBS at $0.10/GB-month, which AWS bills apart (not EC2).
    released(
        db,
        "disk",
        "i-disk",
        d1,
        d2,
        price_micros=USD,
        disk_gb=1000.0,
        storage_micros_per_gb_month=100_000,
    )
    ce.bill("i-disk", date(2026, 12, 1), "24.00")
    # gpubot was told "per minute": 10 min 30 s billed as 11 min at $60/h; AWS bills seconds.
    released(
        db,
        "minute",
        "i-minute",
        d3 + timedelta(hours=10),
        d3 + timedelta(hours=10, minutes=10, seconds=30),
        price_micros=60 * USD,
        billing_increment="minute",
    )
    ce.bill("i-minute", date(2026, 12, 3), "10.50")
    # 30 s at $36/h with gpubot's minimum set to 1 s; AWS bills its minute.
    released(
        db,
        "short",
        "i-short",
        d3 + timedelta(hours=12),
        d3 + timedelta(hours=12, seconds=30),
        price_micros=36 * USD,
        min_charge_s=1,
    )
    ce.bill("i-short", date(2026, 12, 3), "0.60")
    # 10 h at $10/h that AWS billed at a savings-plan rate.
    released(db, "cheap", "i-cheap", d1, d1 + timedelta(hours=10), price_micros=10 * USD)
    ce.bill("i-cheap", date(2026, 12, 1), "70.00")
    # Billed by AWS, never registered.
    ce.bill("i-stranger", date(2026, 12, 3), "7.50")
    # Before AWS's 14 days: not compared, never flagged.
    released(db, "old", "i-old", datetime(2026, 11, 2), datetime(2026, 11, 3), price_micros=USD)
    ledger.accrue(db, NOW, ZoneInfo("UTC"))


def reads(ce: CostExplorerStandIn) -> int:
    """How many times the bills were read: each read asks for the previous month and this one
    (the first page of each carries no token)."""
    return sum(
        1
        for _, _, body in ce.calls
        if "NextPageToken" not in body and body["TimePeriod"]["Start"] == "2026-12-01"
    )


def causes(report: bills.BillsReport) -> dict[str, str | None]:
    (aws,) = [p for p in report.platforms if p.provider == "aws"]
    return {line.name or line.provider_instance_id: line.cause for line in aws.lines}


def run(rt: Runtime, text: str) -> Reply:
    spec, args = parse(text, REGISTRY)
    return spec.handler(rt, ADMIN, args)


def flags(db: Database) -> list[OutboxMessage]:
    with db.session() as session:
        return list(
            session.exec(select(OutboxMessage).where(OutboxMessage.key.startswith("bills:")))
        )


def test_bills_match_some_instances_and_flag_each_other_with_its_cause(
    db: Database, ce: CostExplorerStandIn
) -> None:
    fleet(db, ce)
    clock = Clock(NOW)
    rt = runtime(db, clock, ce)

    assert bills.fetch_due(rt, NOW) == 1
    report = bills.bills_report(rt, "2026-12", NOW + timedelta(minutes=12))

    assert causes(report) == {
        "match": None,
        "late": bills.START,
        "disk": bills.STORAGE,
        "minute": bills.INCREMENT,
        "short": bills.MINIMUM,
        "cheap": bills.DISCOUNT,
        "i-stranger": bills.UNREGISTERED,
    }
    (aws,) = report.platforms
    assert aws.fetched_at == NOW
    assert aws.error is None
    late = next(line for line in aws.lines if line.name == "late")
    assert (late.bot_total_micros, late.platform_total_micros, late.difference_micros) == (
        5 * USD,
        6 * USD,
        USD,
    )
    assert report.unreadable == ("manual",)


def test_the_report_is_one_query_and_asks_no_platform(
    db: Database, ce: CostExplorerStandIn
) -> None:
    fleet(db, ce)
    rt = runtime(db, Clock(NOW), ce)
    bills.fetch_due(rt, NOW)
    calls = len(ce.calls)
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        bills.bills_report(rt, "2026-12", NOW)
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 1
    assert len(ce.calls) == calls


def test_each_flag_is_posted_once_across_ticks_and_a_restart(
    db: Database, ce: CostExplorerStandIn, aws_endpoint: str
) -> None:
    fleet(db, ce)
    clock = Clock(NOW)
    rt = runtime(db, clock, ce, ec2=aws_endpoint, tick_interval_s=30)
    notifier = rt.notifier
    assert isinstance(notifier, Notifier)

    report = tick.tick(rt, NOW)
    assert "bills" not in report.errors
    posted = notifier.flags()
    assert len(posted) == 6
    assert any("i-stranger" in text and "never registered" in text for text in posted)
    assert any("*short*" in text and "minimum charge" in text for text in posted)

    # An hour and a slot later the bills are read again: the same differences, no new post.
    later = clock.set(NOW + timedelta(hours=1, minutes=5))
    tick.tick(rt, later)
    assert reads(ce) == 2
    # A new process (a restart) over the same store reads them once more: still none.
    again = clock.set(NOW + timedelta(hours=2, minutes=10))
    restarted = runtime(db, clock, ce, ec2=aws_endpoint, tick_interval_s=30)
    tick.tick(restarted, again)
    assert reads(ce) == 3
    assert len(notifier.flags()) == 6
    assert isinstance(restarted.notifier, Notifier)
    assert restarted.notifier.flags() == []
    assert len(flags(db)) == 6


def test_ticks_between_slots_and_within_the_hour_ask_nothing(
    db: Database, ce: CostExplorerStandIn
) -> None:
    rt = runtime(db, Clock(NOW), ce, tick_interval_s=30)
    assert bills.bills_tick(rt, NOW) == 1
    assert bills.bills_tick(rt, NOW + timedelta(seconds=30)) == 0  # same 5-minute slot
    assert bills.bills_tick(rt, NOW + timedelta(minutes=5)) == 0  # read under an hour ago
    assert bills.bills_tick(rt, NOW + timedelta(minutes=60)) == 1
    assert reads(ce) == 2


def test_reading_happens_on_the_platform_pool(db: Database, ce: CostExplorerStandIn) -> None:
    work = PlatformWork()
    rt = runtime(db, Clock(NOW), ce)
    rt.platform_work = work
    try:
        assert bills.fetch_due(rt, NOW) == 1
        assert work.wait_idle(10)
    finally:
        work.shutdown()
    with db.session() as session:
        row = session.get(BillFetch, "aws")
        assert row is not None
        assert row.fetched_at == NOW


def test_a_platform_that_fails_keeps_its_last_bills_and_says_how_old(
    db: Database, ce: CostExplorerStandIn
) -> None:
    fleet(db, ce)
    clock = Clock(NOW)
    rt = runtime(db, clock, ce)
    bills.fetch_due(rt, NOW)
    ce.refuse_next("LimitExceededException", "Rate exceeded", times=5)
    later = clock.set(NOW + timedelta(hours=3))
    assert bills.fetch_due(rt, later) == 1

    reply = run(rt, "bills 2026-12")
    body = "\n".join(b.get("text", {}).get("text", "") for b in reply.blocks if "text" in b)
    assert "the last read failed" in body
    assert "LimitExceededException" in body
    assert "fetched 3h ago" in body
    assert "*late*" in body  # the bills read before are still shown
    with db.session() as session:
        assert len(session.exec(select(PlatformBill)).all()) == 7
        row = session.get(BillFetch, "aws")
        assert row is not None
        assert row.due_at == later + timedelta(seconds=bills.RETRY_AFTER_S)


def test_an_account_without_resource_level_data_is_told_plainly(
    db: Database, ce: CostExplorerStandIn
) -> None:
    ce.not_opted_in()
    rt = runtime(db, Clock(NOW), ce)
    bills.fetch_due(rt, NOW)
    reply = run(rt, "bills")
    text = str(reply.blocks)
    assert "not read yet" in text
    assert "has not opted in to resource-level cost data" in text
    assert "Cost Explorer preferences" in text
    assert "manual publishes no per-instance bill gpubot can read." in text


def test_bills_through_the_registry_show_age_money_and_causes(
    db: Database, ce: CostExplorerStandIn
) -> None:
    fleet(db, ce)
    clock = Clock(NOW)
    rt = runtime(db, clock, ce)
    bills.fetch_due(rt, NOW)
    clock.set(NOW + timedelta(minutes=12))
    reply = run(rt, "bills")
    text = "\n".join(str(b) for b in reply.blocks)
    assert "fetched 12m ago" in text
    assert "*late* (`i-late`): gpubot $5.00, platform $6.00, difference +$1.00" in text
    assert "likely cause: the start time" in text
    assert "`i-stranger` (never registered)" in text
    assert "6 differences past one cent or 1 % are flagged" in reply.text
    # November: only what AWS's 14 days cover, and nothing of it flagged.
    november = run(rt, "bills 2026-11")
    assert "i-old" not in str(november.blocks)


def test_outbox_rows_are_keyed_by_platform_instance_and_month(
    db: Database, ce: CostExplorerStandIn
) -> None:
    fleet(db, ce)
    rt = runtime(db, Clock(NOW), ce)
    bills.fetch_due(rt, NOW)
    with db.session() as session:
        assert outbox.find(session, "bills:aws:i-late:2026-12") is not None
        assert outbox.find(session, "bills:aws:i-match:2026-12") is None


def test_bills_through_the_real_bolt_app_with_a_signed_request(
    sqlite_db: Database, ce: CostExplorerStandIn, aws_endpoint: str, tmp_path: Path
) -> None:
    fleet(sqlite_db, ce)
    clock = Clock(NOW)
    with start_slack_bot(sqlite_db, tmp_path, clock=clock, aws_endpoint_url=aws_endpoint) as bot:
        bot.rt.providers.add(
            AwsProvider(region="us-east-1", endpoint_url=aws_endpoint, cost_explorer_url=ce.url)
        )
        assert bills.fetch_due(bot.rt, NOW) == 1
        assert bot.rt.platform_work is not None  # read on AWS's pool, off the command path
        assert bot.rt.platform_work.wait_idle(10)
        clock.set(NOW + timedelta(minutes=12))
        assert bot.command("bills") == 200
        (reply,) = bot.replies(1)
    assert reply.payload["response_type"] == "ephemeral"
    assert not check_blocks(reply.payload["blocks"])
    text = str(reply.payload["blocks"])
    assert "Platform bills against gpubot, December 2026 (UTC)" in text
    assert "*AWS*: fetched 12m ago" in text
    assert "likely cause: the start time" in text
    assert "manual publishes no per-instance bill gpubot can read." in text


# --- RunPod: the v2 pod billing history, compute and storage apart ----------------------------


def runpod_fleet(db: Database, cloud: RunpodStandIn) -> None:
    """Pods run on the stand-in (which bills them from what they ran) and registered in gpubot
    with the right rules, a wrong storage price, or a wrong increment; one never registered."""
    d2 = datetime(2026, 12, 2)
    cloud.now = d2 + timedelta(hours=8)
    same = cloud.add(name="same", cost=0.69, disk_gb=500, volume_gb=None)
    disk = cloud.add(name="disk", cost=0.69, disk_gb=500, volume_gb=None)
    hourly = cloud.add(name="hourly", cost=0.69, disk_gb=500, volume_gb=None)
    cloud.advance(90 * 60)
    cloud.terminate_outside(hourly)
    stranger = cloud.add(name="stranger", cost=2.00, disk_gb=10, volume_gb=None)
    cloud.advance(10 * 3600 + 30 * 60)  # to Dec 2 20:00
    for pid in (same, disk, stranger):
        cloud.terminate_outside(pid)
    started, ended = d2 + timedelta(hours=8), d2 + timedelta(hours=20)
    rules = {"price_micros": 690_000, "disk_gb": 500.0, "storage_micros_per_gb_month": 100_000}
    released(db, "same", same, started, ended, provider="runpod", **rules)
    # gpubot was told the disk is free: RunPod bills its $0.10/GB-month while running.
    released(
        db,
        "disk",
        disk,
        started,
        ended,
        provider="runpod",
        **{**rules, "storage_micros_per_gb_month": 0},
    )
    # gpubot was told RunPod bills started hours: 1h30m billed as 2 h; RunPod bills seconds.
    released(
        db,
        "hourly",
        hourly,
        started,
        started + timedelta(minutes=90),
        provider="runpod",
        billing_increment="hour",
        **rules,
    )
    cloud.now = NOW
    ledger.accrue(db, NOW, ZoneInfo("UTC"))


def test_runpod_bills_compare_compute_and_storage_apart(
    db: Database, runpod_cloud: RunpodStandIn, ce: CostExplorerStandIn
) -> None:
    runpod_fleet(db, runpod_cloud)
    settings = Settings(runpod_api_url=runpod_cloud.url, runpod_api_key=runpod_cloud.api_key)
    runpod = ProviderRegistry.from_settings(settings).get("runpod")
    rt = make_runtime(db, Clock(NOW), providers=[runpod], notifier=Notifier())

    assert bills.fetch_due(rt, NOW) == 1
    report = bills.bills_report(rt, "2026-12", NOW)
    (platform,) = report.platforms
    assert platform.provider == "runpod"
    assert platform.error is None
    found = {line.name or "stranger": line for line in platform.lines}
    assert {name: line.cause for name, line in found.items()} == {
        "same": None,
        "disk": bills.STORAGE,
        "hourly": bills.INCREMENT,
        "stranger": bills.UNREGISTERED,
    }
    disk = found["disk"]
    assert disk.platform_compute_micros == disk.bot_compute_micros == 8_280_000
    assert disk.bot_storage_micros == 0
    assert disk.platform_storage_micros is not None
    assert disk.platform_storage_micros > 800_000  # 500 GB for 12 h at $0.10/GB-month
    # Each flagged pod is posted once, in the ops channel.
    rt_flags = flags(db)
    assert sorted(row.key for row in rt_flags) == [
        f"bills:runpod:{found[name].provider_instance_id}:2026-12"
        for name in sorted(
            ("disk", "hourly", "stranger"), key=lambda n: found[n].provider_instance_id
        )
    ]
    reply = run(rt, "bills")
    assert "*disk*" in str(reply.blocks)
    assert "(compute $8.28, storage $0.8" in str(reply.blocks)


def test_the_clock_costs_no_query_between_slots_and_two_when_nothing_is_due(
    db: Database, ce: CostExplorerStandIn
) -> None:
    fleet(db, ce)
    rt = runtime(db, Clock(NOW), ce, tick_interval_s=30)
    bills.fetch_due(rt, NOW)
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        assert bills.bills_tick(rt, NOW + timedelta(seconds=30)) == 0
        assert statements == []
        assert bills.bills_tick(rt, NOW + timedelta(minutes=5)) == 0
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 2
