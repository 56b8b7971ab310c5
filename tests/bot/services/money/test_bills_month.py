"""One month (November 2026, UTC) of `/gpu bills` and the digest's section against the
platforms' bills, on SQLite and PostgreSQL: a controlled clock moves through the month in
12-hour ticks (the ledger, the digest and the bills steps of the tick), instances start and end
on the platforms' stand-ins (RunPod v2, Vast.ai, AWS: moto for EC2 and the Cost Explorer
stand-in) and are registered with gpubot, some with the platform's own rules and some with one
rule wrong (the increment, the minimum, the storage rate, the start time); one instance is
billed by AWS and never registered. The figures per instance are asserted to the micro-unit.

Run with ``-s`` to print the per-instance table (instance, provider, gpubot, platform,
difference, cause)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import boto3
import pytest
from sqlmodel import col, select, update

from bot.commands import build_registry
from bot.commands.parser import parse
from bot.providers.aws import AwsProvider
from bot.providers.names import platform_name
from bot.providers.registry import ProviderRegistry
from bot.runtime import Runtime
from bot.services import tick
from bot.services.access import Caller
from bot.services.money import bills
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import Instance, OutboxMessage
from bot.values import format_money
from tests.bot.services.support import Clock, RecordingNotifier, add_instance, make_runtime
from tests.fixtures.platforms.aws import amazon_image
from tests.fixtures.platforms.cost_explorer import CostExplorerStandIn, cost_explorer_standin
from tests.fixtures.platforms.runpod import RunpodStandIn
from tests.fixtures.platforms.vast import VastStandIn

pytestmark = pytest.mark.integration

MONTH = "2026-11"
START = datetime(2026, 11, 1)
#: The last tick: the digest of November is due at 00:15 on December 1 (UTC).
END = datetime(2026, 12, 1, 12, 0)
TICK = timedelta(hours=12)
#: The tick steps that run: the ledger accrues gpubot's charges, the digest posts, the bills
#: are read (the rest of the tick polls agents and platforms, which this month has none of).
STEPS = ("ledger", "digest", "bills")
#: Vast's price of the stand-in's machines: dph_base, and dph_total with its disk (86.4 GB at
#: $0.10/GB-month over Vast's 720-hour month: $0.012/h).
VAST_BASE_MICROS, VAST_TOTAL_MICROS = 700_000, 712_000
ADMIN = Caller(user_id="UADMIN", channel_id="CTEAM")


class Notifier(RecordingNotifier):
    """Records posts; the digest's chart is taken and dropped."""

    def upload_file(self, channel: str, filename: str, content: bytes, **kwargs: object) -> None:
        return None


@pytest.fixture
def ce(monkeypatch: pytest.MonkeyPatch) -> Iterator[CostExplorerStandIn]:
    with cost_explorer_standin(monkeypatch) as standin:
        yield standin


@dataclass(frozen=True)
class Event:
    """Something that happens on a platform (and in gpubot) at ``at``."""

    at: datetime
    what: Callable[[], None]


class Month:
    """The month's world: the platforms' stand-ins, gpubot's store, and who is who."""

    def __init__(
        self,
        db: Database,
        runpod: RunpodStandIn,
        vast: VastStandIn,
        ce: CostExplorerStandIn,
        ec2: Any,
    ) -> None:
        self.db, self.runpod, self.vast, self.ce, self.ec2 = db, runpod, vast, ce, ec2
        #: name -> the platform's id
        self.ids: dict[str, str] = {}
        #: name -> gpubot's instance id
        self.rows: dict[str, int] = {}
        self.events: list[Event] = []

    # --- gpubot's side ------------------------------------------------------------------------

    def register(self, name: str, provider: str, at: datetime, **fields: Any) -> None:
        self.rows[name] = add_instance(
            self.db,
            name=name,
            provider=provider,
            provider_instance_id=self.ids[name],
            created_at=at,
            **fields,
        )

    def set(self, name: str, **fields: Any) -> None:
        with self.db.session() as session:
            session.exec(
                update(Instance).where(col(Instance.id) == self.rows[name]).values(**fields)
            )

    def release(self, name: str, at: datetime) -> None:
        self.set(name, state="released", released_at=at, release_mode="terminate")

    # --- the platforms ------------------------------------------------------------------------

    def runpod_pod(self, name: str, start: datetime, end: datetime, **fields: Any) -> None:
        """A pod at $0.69/h with a 500 GB container disk (RunPod bills both by the second)."""

        def begin() -> None:
            self.runpod.now = start
            self.ids[name] = self.runpod.add(name=name, cost=0.69, disk_gb=500, volume_gb=None)
            rules = {"price_micros": 690_000, "disk_gb": 500.0}
            self.register(name, "runpod", start, **{**rules, **fields})

        def finish() -> None:
            self.runpod.now = end
            self.runpod.terminate_outside(self.ids[name])
            self.release(name, end)

        self.events += [Event(start, begin), Event(end, finish)]

    def vast_instance(self, name: str, start: datetime, end: datetime, **fields: Any) -> None:
        """A Vast instance; Vast charges dph_total by the second, disk included, in a row a
        day."""

        def begin() -> None:
            self.ids[name] = self.vast.add()
            rules = {
                "price_micros": VAST_BASE_MICROS,
                "disk_gb": 86.4,
                "storage_micros_per_gb_month": 100_000,
            }
            self.register(name, "vast", start, **{**rules, **fields})

        def finish() -> None:
            self.vast.terminate_outside(self.ids[name])
            seconds = int((end - start).total_seconds())
            micros = round(Decimal(seconds * VAST_TOTAL_MICROS) / 3600)
            day = int((datetime(start.year, start.month, start.day) - EPOCH).total_seconds())
            self.vast.charge(self.ids[name], amount=micros / 1_000_000, day=day)
            self.release(name, end)

        self.events += [Event(start, begin), Event(end, finish)]

    def ec2_instance(
        self,
        name: str,
        start: datetime,
        end: datetime,
        hourly_micros: int,
        *,
        registered: bool = True,
        **fields: Any,
    ) -> None:
        """An EC2 instance launched in moto; AWS bills it by the second with a minimum of a
        minute, in Cost Explorer's row for the day."""

        def begin() -> None:
            image = amazon_image(self.ec2)
            answer = self.ec2.run_instances(
                ImageId=image, InstanceType="g5.xlarge", MinCount=1, MaxCount=1
            )
            self.ids[name] = answer["Instances"][0]["InstanceId"]
            if registered:
                self.register(name, "aws", start, price_micros=hourly_micros, **fields)

        def finish() -> None:
            self.ec2.terminate_instances(InstanceIds=[self.ids[name]])
            seconds = max(60, int((end - start).total_seconds()))
            amount = Decimal(seconds * hourly_micros) / 3600 / 1_000_000
            self.ce.bill(self.ids[name], start.date(), str(amount))
            if registered:
                self.release(name, end)

        self.events += [Event(start, begin), Event(end, finish)]


EPOCH = datetime(1970, 1, 1)


def day(n: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
    """November ``n`` at the time given (UTC)."""
    return datetime(2026, 11, n, hour, minute, second)


def november(world: Month) -> None:
    """The month's instances: each either agrees with its platform or has one rule wrong."""
    # RunPod: compute and disk apart, by the second.
    world.runpod_pod("r-same", day(10, 8), day(10, 20), storage_micros_per_gb_month=100_000)
    # gpubot was told the container disk is free; RunPod bills it at $0.10/GB-month.
    world.runpod_pod("r-disk", day(11, 8), day(11, 20), storage_micros_per_gb_month=0)
    # gpubot was told RunPod bills started hours: 1 h 30 m charged as 2 h.
    world.runpod_pod(
        "r-hourly",
        day(12, 8),
        day(12, 9, 30),
        storage_micros_per_gb_month=100_000,
        billing_increment="hour",
    )
    # Vast: dph_total by the second, the disk not split out.
    world.vast_instance("v-same", day(14, 10), day(14, 20))
    # gpubot bills from SSH-ready (30 min after the start); Vast from the start.
    world.vast_instance("v-late", day(15, 10), day(15, 14), billing_from="ssh_ready")
    world.events.append(
        Event(day(15, 10, 30), lambda: world.set("v-late", ssh_ready_at=day(15, 10, 30)))
    )
    # gpubot was told Vast bills started hours: 2 h 20 m charged as 3 h.
    world.vast_instance("v-hourly", day(16, 10), day(16, 12, 20), billing_increment="hour")
    # AWS: Cost Explorer keeps 14 days, so the month's read on December 1 covers Nov 17-30.
    world.ec2_instance("a-same", day(20, 10), day(20, 12), 2_000_000)
    # gpubot bills from SSH-ready (20 min after the launch); AWS from the launch.
    world.ec2_instance("a-late", day(21, 10), day(21, 12), 3_000_000, billing_from="ssh_ready")
    world.events.append(
        Event(day(21, 10, 20), lambda: world.set("a-late", ssh_ready_at=day(21, 10, 20)))
    )
    # 30 s at $36/h with gpubot's minimum set to 1 s; AWS bills its minute.
    world.ec2_instance("a-short", day(22, 12), day(22, 12, 0, 30), 36_000_000, min_charge_s=1)
    # Launched on the account outside gpubot: AWS bills it, gpubot never saw it.
    world.ec2_instance("a-stranger", day(23, 8), day(23, 9), 1_500_000, registered=False)


def run_month(world: Month, rt: Runtime, clock: Clock) -> None:
    """Every 12 hours from November 1 to December 1 12:00: the month's events up to then (in
    order, each at its own time), then the tick's steps."""
    steps = [(name, step) for name, step in tick.TICK_STEPS if name in STEPS]
    events = sorted(world.events, key=lambda event: event.at)
    at = START
    while at <= END:
        while events and events[0].at <= at:
            event = events.pop(0)
            world.runpod.now = clock.set(event.at)
            event.what()
        world.runpod.now = clock.set(at)
        for _, step in steps:
            step(rt, at)
        at += TICK


@dataclass(frozen=True)
class Row:
    """One instance as the test expects it: micro-units of USD; None where a side billed
    nothing."""

    provider: str
    bot: int | None
    platform: int | None
    difference: int
    cause: str | None


def table(lines: list[bills.BillLine], ids: dict[str, str]) -> str:
    """The per-instance table, one line per instance."""
    names = {pid: name for name, pid in ids.items()}
    head = ("instance", "provider", "gpubot", "platform", "difference", "cause")
    rows = [head]
    for line in lines:
        rows.append(
            (
                line.name or f"{names.get(line.provider_instance_id, '?')} (unregistered)",
                line.provider,
                _usd(line.bot_total_micros),
                _usd(line.platform_total_micros),
                f"{line.difference_micros / 1_000_000:+.6f}",
                line.cause or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _usd(micros: int | None) -> str:
    return "-" if micros is None else f"{micros / 1_000_000:.6f}"


def test_a_month_of_bills_on_three_platforms_to_the_micro_unit(
    db: Database,
    runpod_cloud: RunpodStandIn,
    vast_cloud: VastStandIn,
    ce: CostExplorerStandIn,
    aws_endpoint: str,
) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_endpoint)
    world = Month(db, runpod_cloud, vast_cloud, ce, ec2)
    november(world)
    settings = Settings(
        runpod_api_url=runpod_cloud.url,
        runpod_api_key=runpod_cloud.api_key,
        vast_api_url=vast_cloud.url,
        vast_api_key=vast_cloud.api_key,
    )
    registry = ProviderRegistry.from_settings(settings)
    aws = AwsProvider(region="us-east-1", endpoint_url=aws_endpoint, cost_explorer_url=ce.url)
    clock = Clock(START)
    rt = make_runtime(
        db,
        clock,
        providers=[registry.get("runpod"), registry.get("vast"), aws],
        notifier=Notifier(),
    )

    run_month(world, rt, clock)

    report = bills.bills_report(rt, MONTH, END)
    lines = [line for platform in report.platforms for line in platform.lines]
    print("\n" + table(lines, world.ids))
    found = {
        line.name or "a-stranger": Row(
            line.provider,
            line.bot_total_micros,
            line.platform_total_micros,
            line.difference_micros,
            line.cause,
        )
        for line in lines
    }
    assert found == EXPECTED
    # Read by the last tick, after the digest (which used the read of 00:00: 12 h old).
    assert {p.provider: p.fetched_at for p in report.platforms} == dict.fromkeys(
        ("aws", "runpod", "vast"), END
    )
    assert report.unreadable == ("manual",)

    # Each flagged instance was queued to the ops channel once, whatever the 61 ticks did.
    with db.session() as session:
        keys = sorted(
            row.key
            for row in session.exec(
                select(OutboxMessage).where(col(OutboxMessage.key).startswith("bills:"))
            )
        )
    assert keys == sorted(
        f"bills:{row.provider}:{world.ids[name]}:{MONTH}"
        for name, row in EXPECTED.items()
        if row.cause is not None
    )

    # The digest of November, posted on December 1, carries the same figures in totals.
    notifier = rt.notifier
    assert isinstance(notifier, Notifier)
    (digest,) = [p for p in notifier.to("COPS") if p.text.startswith("GPU spend in November")]
    section = next(
        block["text"]["text"]
        for block in digest.blocks
        if "Against the platforms' bills" in block.get("text", {}).get("text", "")
    )
    print("\n" + section)
    for provider in ("aws", "runpod", "vast"):
        rows = [row for row in EXPECTED.values() if row.provider == provider]
        bot = sum(row.bot or 0 for row in rows)
        platform = sum(row.platform or 0 for row in rows)
        difference = format_money(platform - bot, "USD")
        sign = "+" if platform > bot else ""
        assert (
            f"*{platform_name(provider)}*: gpubot {format_money(bot, 'USD')}, platform "
            f"{format_money(platform, 'USD')}, difference {sign}{difference} "
            "(bills fetched 12h ago" in section
        ), section
        flagged = sum(1 for row in rows if row.cause)
        assert f"{flagged} of {len(rows)} instances flagged" in section
    ids = world.ids
    assert (
        f"the largest: `{ids['a-stranger']}` (never registered) +$1.50, likely never "
        "registered" in section
    )
    assert f"the largest: *r-disk* (`{ids['r-disk']}`) +$0.82, likely storage" in section
    assert f"the largest: *v-hourly* (`{ids['v-hourly']}`) -$0.47, likely the billing" in section
    assert "covering 2026-11-17 to 2026-11-30" in section  # AWS's 14 days
    assert "manual publishes no per-instance bill gpubot can read." in section

    # `/gpu bills 2026-11` shows the same lines.
    spec, args = parse("bills 2026-11", build_registry())
    reply = spec.handler(rt, ADMIN, args)
    assert "*a-late* (`" in str(reply.blocks)


#: What each platform billed against gpubot (see :func:`november`), in USD micro-units.
EXPECTED: dict[str, Row] = {
    # 12 h at $0.69/h = $8.28; 500 GB at $0.10/GB-month over 12 of 730 h = $0.821918 (both).
    "r-same": Row("runpod", 9_101_918, 9_101_918, 0, None),
    # gpubot charged no disk; RunPod its $0.821918.
    "r-disk": Row("runpod", 8_280_000, 9_101_918, 821_918, bills.STORAGE),
    # gpubot 2 h = $1.38, RunPod 1.5 h = $1.035; the disk for 1.5 h ($0.102740) on both.
    "r-hourly": Row("runpod", 1_482_740, 1_137_740, -345_000, bills.INCREMENT),
    # Vast: 10 h at $0.712/h = $7.12; gpubot $7.00 + 86.4 GB at $0.10/GB-month over 10 of
    # 730 h ($0.118357, rounded up per bucket): within the tolerance.
    "v-same": Row("vast", 7_118_357, 7_120_000, 1_643, None),
    # gpubot 3.5 h at $0.70 + the disk for 4 h ($0.047343); Vast 4 h at $0.712.
    "v-late": Row("vast", 2_497_343, 2_848_000, 350_657, bills.START),
    # gpubot 3 h at $0.70 + the disk for 2 h 20 m ($0.027617); Vast 2 h 20 m at $0.712.
    "v-hourly": Row("vast", 2_127_617, 1_661_333, -466_284, bills.INCREMENT),
    # AWS: 2 h at $2/h on both sides.
    "a-same": Row("aws", 4_000_000, 4_000_000, 0, None),
    # gpubot 1 h 40 m at $3/h, AWS 2 h.
    "a-late": Row("aws", 5_000_000, 6_000_000, 1_000_000, bills.START),
    # gpubot 30 s at $36/h, AWS its minute.
    "a-short": Row("aws", 300_000, 600_000, 300_000, bills.MINIMUM),
    # 1 h at $1.50/h, billed by AWS only.
    "a-stranger": Row("aws", None, 1_500_000, 1_500_000, bills.UNREGISTERED),
}
