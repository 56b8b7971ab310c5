"""AWS EC2 in the team-month: moto in server mode (tests/fixtures/platforms/aws.py) behind a
fault-injecting proxy (tests/fixtures/platforms/ec2_proxy.py), Cost Explorer's stand-in
(tests/fixtures/platforms/cost_explorer.py), and the bot's own client for both
(bot.providers.aws, boto3).

The rules the month keeps for AWS:

- moto's clock is the wall clock, the month's is simulated, so the month keeps its own record
  of each instance's runs (:class:`Ec2Record`: a launch or start to a stop or terminate, on the
  month's clock) and bills from it by EC2's On-Demand rule: per second, at least 60 seconds per
  start (:func:`run_micros`); the bill to a moment counts a run's minute from its first second.
- The proxy passes every request on to moto, records on the month's clock each run, stop, start
  and terminate moto answered 200 (or did before the answer was lost), and puts the record's
  times in the answers: an instance's ``launchTime`` is its last start, and the
  ``reason`` of a stopped or terminated one ("User initiated (... UTC)") is when it stopped
  or was terminated. The bot reads that time (``ProviderInstance.ended_at``) and stops its
  meter there; it bills from the registration's ``created_at`` (``billing_from`` "created"),
  never from ``launchTime``. A person launches an instance in the console (moto, directly; a
  ``g5.xlarge`` of the first Amazon image) and registers it at the month's price, with its
  ``created_at`` and ``ssh_ready_at`` at the launch, at the address EC2 describes (public, else
  private), port 22.
- moto has no prices: each instance's price is the month's, kept in the record.
- EBS volumes bill apart from the instance (Cost Explorer's "Amazon Elastic Block Store"), so a
  machine is registered without a disk and the record bills compute only.
- The dice arm the proxy per call (see bench/sim/platforms.py): 503 ``Unavailable`` through an
  outage, 500 ``InternalError`` (EC2's XML error document), a proxy's HTML 404 page, throttling
  as EC2 answers it (503 ``RequestLimitExceeded``), and a ``TerminateInstances`` (or
  ``StopInstances``) done on moto whose connection drops before the answer. The bot's client
  retries once itself (botocore's standard mode, two attempts: a single 500, 503, throttle or
  lost answer is met again), so a fault reaches the bot's own handling only when both attempts
  fail; botocore's pauses between attempts take no real time here (``retry_pauses`` counts
  them). Calls for bills arm Cost Explorer's stand-in instead (no retries there; its
  throttling is ``LimitExceededException``). AWS locks nothing.
- A machine ended behind the bot's back is terminated in moto directly. moto, like EC2, still
  describes it as ``terminated``: that answer, to a look or in the list, is AWS telling the bot
  it is gone, and it says when (its ``reason``), so the bot's meter stops at the end itself.
- Bills: the bot's client reads Cost Explorer's ``GetCostAndUsageWithResources`` (it
  ``publishes_bills``), so `/gpu bills` is compared. The stand-in bills each instance and UTC
  day from the record, a day as soon as it has ended (the real service publishes with a lag of
  up to a day; the bot asks only for whole days before today).
- moto's ids are seeded, so the same seed gives the same month.
"""

from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import boto3
import botocore.endpoint

from bench.sim.platforms import PlatformCloud, Registration, Shared
from bench.sim.world import Machine, SimClock, World
from bot.providers.aws import AwsProvider
from bot.providers.base import PlatformCharge
from tests.fixtures.platforms.aws import MotoServer, start_moto
from tests.fixtures.platforms.base import Answer, StandIn
from tests.fixtures.platforms.cost_explorer import CostExplorerStandIn
from tests.fixtures.platforms.ec2_proxy import Ec2Call, Ec2Proxy

#: EC2 On-Demand's minimum per start, seconds (billed per second after it).
MIN_CHARGE_S = 60
REGION = "us-east-1"
#: What a person launches in the console (an instance type moto's validation accepts).
INSTANCE_TYPE = "g5.xlarge"
#: Where an instance answers SSH (EC2 reports only its address).
SSH_PORT = 22
#: moto's seed for its ids.
MOTO_SEED = 20_270_301
#: The release actions whose answer ``platform_lost_answer`` drops, by release mode.
RELEASE_PATHS = {"terminate": "/TerminateInstances", "stop": "/StopInstances"}
#: How EC2 writes when an instance was stopped or terminated (``StateTransitionReason``).
REASON = "User initiated ({at:%Y-%m-%d %H:%M:%S} UTC)"


@dataclass(frozen=True)
class Run:
    """One run of an instance on the month's clock: from a launch or start to a stop or a
    terminate (``ended_at`` None while it runs)."""

    started_at: datetime
    ended_at: datetime | None = None


def run_micros(started_at: datetime, until: datetime, price_per_s: int) -> int:
    """EC2's bill for a run from ``started_at`` to ``until`` at ``price_per_s`` micro-units a
    second: whole seconds, at least :data:`MIN_CHARGE_S` once the run has begun; 0 before."""
    seconds = int((until - started_at).total_seconds())
    if seconds <= 0:
        return 0
    return max(MIN_CHARGE_S, seconds) * price_per_s


@dataclass
class Ec2Record:
    """Each instance's runs and price (micro-units a second) on the month's clock."""

    prices: dict[str, int] = field(default_factory=dict)
    runs: dict[str, list[Run]] = field(default_factory=dict)
    #: When each terminated instance was terminated.
    terminated: dict[str, datetime] = field(default_factory=dict)

    def launch(self, instance_id: str, price_per_s: int, at: datetime) -> None:
        self.prices[instance_id] = price_per_s
        self.runs[instance_id] = [Run(at)]

    def start(self, instance_id: str, at: datetime) -> None:
        """A stopped instance starts a new run (nothing for a running or terminated one)."""
        runs = self.runs.get(instance_id)
        if runs and runs[-1].ended_at is not None and instance_id not in self.terminated:
            runs.append(Run(at))

    def stop(self, instance_id: str, at: datetime) -> None:
        """The running run ends (nothing where none runs)."""
        runs = self.runs.get(instance_id)
        if runs and runs[-1].ended_at is None:
            runs[-1] = replace(runs[-1], ended_at=at)

    def terminate(self, instance_id: str, at: datetime) -> None:
        """The instance ends for good (once: a second terminate changes nothing)."""
        if instance_id in self.runs and instance_id not in self.terminated:
            self.stop(instance_id, at)
            self.terminated[instance_id] = at

    def ended_at(self, instance_id: str) -> datetime | None:
        """When a terminated instance's compute ended (its last run's end); None otherwise."""
        if instance_id not in self.terminated:
            return None
        return self.runs[instance_id][-1].ended_at

    def reason_at(self, instance_id: str) -> datetime | None:
        """When EC2 says the instance was terminated or stopped; None while it runs."""
        if instance_id in self.terminated:
            return self.terminated[instance_id]
        runs = self.runs.get(instance_id)
        return runs[-1].ended_at if runs else None

    def billed_micros(self, instance_id: str, until: datetime) -> int:
        """What EC2 billed the instance from its launch to ``until``, micro-units."""
        price = self.prices.get(instance_id, 0)
        total = 0
        for run in self.runs.get(instance_id, []):
            end = until if run.ended_at is None else min(until, run.ended_at)
            total += run_micros(run.started_at, end, price)
        return total

    def between(self, instance_id: str, start: datetime, until: datetime) -> int:
        """What EC2 billed the instance over [start, until), micro-units."""
        if until <= start:
            return 0
        return self.billed_micros(instance_id, until) - self.billed_micros(instance_id, start)

    def daily_micros(self, before: date) -> dict[tuple[str, date], int]:
        """What each instance was billed each UTC day before ``before`` (days billed 0 left
        out), micro-units."""
        found: dict[tuple[str, date], int] = {}
        for instance_id, runs in self.runs.items():
            if not runs:
                continue
            day = runs[0].started_at.date()
            while day < before:
                start = datetime.combine(day, datetime.min.time())
                amount = self.between(instance_id, start, start + timedelta(days=1))
                if amount:
                    found[(instance_id, day)] = amount
                day += timedelta(days=1)
        return found


class MonthEc2(Ec2Proxy):
    """The proxy in front of moto that records what moto did on the month's clock (``now``)
    and answers with the record's times."""

    def __init__(self, upstream: str, record: Ec2Record) -> None:
        super().__init__(upstream)
        self.record = record

    def passed(self, call: Ec2Call, status: int, body: bytes) -> bytes:
        if status == 200:
            change = {
                "TerminateInstances": self.record.terminate,
                "StopInstances": self.record.stop,
                "StartInstances": self.record.start,
            }.get(call.action)
            for instance_id in call.instance_ids() if change else ():
                assert change is not None
                change(instance_id, self.now)
        return self._on_month_clock(body)

    def _on_month_clock(self, body: bytes) -> bytes:
        """``body`` with each recorded instance's ``launchTime`` and ``reason`` on the month's
        clock (as it came where it is no XML of EC2's)."""
        try:
            root = ET.fromstring(body)
        except ET.ParseError:
            return body
        namespace = root.tag[1:].partition("}")[0] if root.tag.startswith("{") else ""
        ns = f"{{{namespace}}}" if namespace else ""
        changed = False
        for item in root.iter(f"{ns}item"):
            instance_id = item.findtext(f"{ns}instanceId")
            runs = self.record.runs.get(instance_id or "")
            if not runs:
                continue
            launched = item.find(f"{ns}launchTime")
            if launched is not None:
                launched.text = f"{runs[-1].started_at:%Y-%m-%dT%H:%M:%S}.000Z"
                changed = True
            reason = item.find(f"{ns}reason")
            at = self.record.reason_at(instance_id or "")
            if reason is not None and reason.text and at is not None:
                reason.text = REASON.format(at=at)
                changed = True
        if not changed:
            return body
        try:
            out: bytes = ET.tostring(
                root, encoding="utf-8", xml_declaration=True, default_namespace=namespace or None
            )
        except ValueError:
            return body
        return out


class MonthCostExplorer(CostExplorerStandIn):
    """Cost Explorer billing each instance and UTC day from the record, every day before the
    one its clock (``now``) is in; faults it was armed with end with the call."""

    def __init__(self, record: Ec2Record) -> None:
        super().__init__()
        self.record = record

    def route(self, method: str, path: str, body: Any) -> Answer:
        with_costs = self.record.daily_micros(self.now.date())
        self.costs = {key: Decimal(micros).scaleb(-6) for key, micros in with_costs.items()}
        return super().route(method, path, body)

    def disarm(self) -> None:
        super().disarm()
        with self.lock:
            self.refusals.clear()


class _Pauses:
    """The ``time`` module as botocore's endpoint sees it here: its retry pauses are counted,
    and take no time."""

    def __init__(self) -> None:
        self.count = 0

    def sleep(self, seconds: float) -> None:
        del seconds
        self.count += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class AwsCloud(PlatformCloud):
    """AWS: EC2 instances through boto3, bills through Cost Explorer."""

    name = "aws"
    capabilities = AwsProvider.capabilities
    disk_per_s = 0
    #: How far back the bills reach (Cost Explorer's resource-level data), days.
    bill_history_days = AwsProvider.bill_history_days

    standin: Ec2Proxy

    def __init__(self, world: World, clock: SimClock, shared: Shared) -> None:
        # The month's account: fake credentials, for moto and the stand-in.
        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        os.environ.pop("AWS_SESSION_TOKEN", None)
        os.environ.pop("AWS_PROFILE", None)
        self.record = Ec2Record()
        self.addresses: dict[str, str] = {}
        self.pauses = _Pauses()
        self.moto: MotoServer = start_moto()
        self.ce = MonthCostExplorer(self.record)
        try:
            self.moto.seed(MOTO_SEED)
            self.ce.start()
            #: The console: a person's own hands on EC2 (moto, directly).
            self.console: Any = boto3.client("ec2", region_name=REGION, endpoint_url=self.moto.url)
            images = self.console.describe_images(Owners=["amazon"])["Images"]
            self.image = str(sorted(i["ImageId"] for i in images)[0])
            super().__init__(world, clock, shared)
        except BaseException:
            self.ce.close()
            self.moto.close()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.ce.close()
            self.moto.close()

    def _standin(self) -> StandIn:
        return MonthEc2(self.moto.url, self.record)

    def _client(self) -> Any:
        return AwsProvider(
            region=REGION, endpoint_url=self.standin.url, cost_explorer_url=self.ce.url
        )

    def _add(self, price_per_s: int, port: int) -> str:
        del port
        answer = self.console.run_instances(
            ImageId=self.image, InstanceType=INSTANCE_TYPE, MinCount=1, MaxCount=1
        )
        item = answer["Instances"][0]
        instance_id = str(item["InstanceId"])
        self.record.launch(instance_id, price_per_s, self.standin.now)
        seen = self.console.describe_instances(InstanceIds=[instance_id])
        found = seen["Reservations"][0]["Instances"][0]
        address = found.get("PublicIpAddress") or found.get("PrivateIpAddress")
        self.addresses[instance_id] = str(address or item.get("PrivateIpAddress"))
        return instance_id

    def ssh_address(self, provider_id: str, port: int) -> tuple[str, int]:
        del port
        return self.addresses[provider_id], SSH_PORT

    def registration(self, price_per_s: int) -> Registration:
        return Registration(price_per_s * 3600, 0.0, 0)

    def billed_micros(self, provider_id: str, start: datetime, until: datetime) -> int:
        return self.record.between(provider_id, start, until)

    def _ended_at(self, provider_id: str) -> datetime | None:
        return self.record.ended_at(provider_id)

    def end_outside(self, provider_id: str, now: datetime) -> None:
        self.standin.now = now
        self.console.terminate_instances(InstanceIds=[provider_id])
        self.record.terminate(provider_id, now)
        machine = self.machines[provider_id]
        machine.ended_at, machine.ended_by = now, "platform"

    def _rate_limit(self) -> None:
        if isinstance(self.standin, Ec2Proxy):
            self.standin.throttle(1)
        else:
            self.ce.refuse_next("LimitExceededException", "Rate exceeded")

    def _lose_release_answer(self, mode: str) -> None:
        self.standin.lose_answers(1, method="POST", path=RELEASE_PATHS.get(mode, mode))

    def charges(self, start: datetime, end: datetime) -> list[PlatformCharge]:
        with self._aimed_at(self.ce):
            return super().charges(start, end)

    def _call(self, call: str, provider_id: str | None, send: Any) -> Any:
        with self._no_pauses():
            return super()._call(call, provider_id, send)

    def owed_micros(self, machine: Machine, until: datetime) -> int:
        """The record's bill, plus, where AWS told the bot only later that the machine was
        gone, what its last run would have cost by EC2's rule had it run to that moment."""
        billed = self.bill_micros(machine, until)
        told = self.meter_end.get(machine.provider_id)
        runs = self.record.runs.get(machine.provider_id)
        if machine.ended_at is None or told is None or until <= machine.ended_at or not runs:
            return billed
        price, began = machine.price_per_s, runs[-1].started_at
        more = run_micros(began, min(told, until), price) - run_micros(
            began, machine.ended_at, price
        )
        return billed + max(0, more)

    def unrounded_micros(
        self, machine: Machine, until: datetime, meter_end: datetime | None
    ) -> int:
        """The part of the minimum that EC2's bill to ``until`` counts and the bot's ledger
        has not charged yet, where its meter still ran then (it charges a running session by
        the second and the minimum when the session ends)."""
        if meter_end is not None and meter_end <= until:
            return 0
        seconds = int((until - machine.started_at).total_seconds())
        if seconds <= 0:
            return 0
        return run_micros(machine.started_at, until, machine.price_per_s) - (
            seconds * machine.price_per_s
        )

    def report(self) -> dict[str, Any]:
        return {**super().report(), "retry_pauses": self.pauses.count}

    @contextmanager
    def _aimed_at(self, standin: StandIn) -> Iterator[None]:
        """The dice arm ``standin`` (Cost Explorer's) for the calls made meanwhile."""
        proxy = self.standin
        self.standin = standin  # type: ignore[assignment]
        try:
            yield
        finally:
            self.standin = proxy

    @contextmanager
    def _no_pauses(self) -> Iterator[None]:
        """botocore's retry pauses are counted and take no time meanwhile."""
        real = vars(botocore.endpoint)["time"]
        if real is self.pauses:
            yield
            return
        setattr(botocore.endpoint, "time", self.pauses)  # noqa: B010
        try:
            yield
        finally:
            setattr(botocore.endpoint, "time", real)  # noqa: B010
