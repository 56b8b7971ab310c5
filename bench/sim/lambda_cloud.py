"""Lambda Cloud in the team-month: Lambda's REST stand-in (tests/fixtures/platforms/lambda_cloud.py:
on-demand instances billed per started minute from passing their health checks until they are
terminated, on the month's clock) and the bot's Lambda client (bot.providers.lambda_cloud).

Lambda differs from the other platforms of the month in five ways:

- it reports an instance's address only, where it answers SSH on port 22, so a machine is
  registered there (each at one of loopback's addresses);
- its price includes the instance's local storage, so nothing bills for disks (``disk_per_s``
  is 0, and a machine is registered without a disk);
- it ends a machine by ``POST /instance-operations/terminate``, not a DELETE: that is the
  answer ``platform_lost_answer`` drops;
- a terminated instance leaves the list but still answers a look with status "terminated":
  that answer, too, is Lambda telling the bot the machine is gone;
- it bills whole minutes, so the documented told-late rule (``owed_micros``) counts the minutes
  the machine would have billed had it run to the moment the bot was told, not seconds; and at
  the month's last whole hour a machine the bot still meters has a started minute that Lambda's
  bill to then counts and the bot's ledger rounds only when the session ends
  (``unrounded_micros``).

Lambda publishes no bill API, so `/gpu bills` has no line of it; the bot's other figures are
checked against what the stand-in billed. It locks nothing; its 429s are its own JSON error
half the time, plain text the other half. See bench/sim/platforms.py for what every platform of
the month shares."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from bench.sim.platforms import PlatformCloud, Registration
from bench.sim.world import Machine
from bot.providers.http import JsonApi
from bot.providers.lambda_cloud import CENTS_TO_MICROS, LambdaProvider, is_not_found_document
from tests.fixtures.platforms.base import StandIn
from tests.fixtures.platforms.lambda_cloud import BILLED_S, LambdaStandIn

#: Where every Lambda instance answers SSH (Lambda reports only its address).
SSH_PORT = 22
#: Where Lambda ends instances (the request whose answer ``platform_lost_answer`` drops).
TERMINATE_PATH = "/instance-operations/terminate"


class LambdaCloud(PlatformCloud):
    """Lambda Cloud: on-demand instances through its REST API."""

    name = "lambda"
    capabilities = LambdaProvider.capabilities
    disk_per_s = 0

    standin: LambdaStandIn

    def _standin(self) -> StandIn:
        return LambdaStandIn()

    def _client(self) -> Any:
        return LambdaProvider(
            JsonApi.bearer(
                self.name,
                self.standin.url + "/api/v1",
                self.standin.api_key,
                not_found=is_not_found_document,
            )
        )

    def _add(self, price_per_s: int, port: int) -> str:
        # Lambda reports an instance's address, where it answers SSH on port 22: one of
        # loopback's own for each (``port`` tells them apart).
        address = f"127.1.{port // 256 % 256}.{port % 256}"
        return self.standin.add(price_cents_per_hour=cents_per_hour(price_per_s), ip=address)

    def ssh_address(self, provider_id: str, port: int) -> tuple[str, int]:
        del port
        return str(self.standin.instances[provider_id]["ip"]), SSH_PORT

    def registration(self, price_per_s: int) -> Registration:
        return Registration(cents_per_hour(price_per_s) * CENTS_TO_MICROS, 0.0, 0)

    def billed_micros(self, provider_id: str, start: datetime, until: datetime) -> int:
        return round(self.standin.bill(provider_id, start, until) * 1_000_000)

    def _ended_at(self, provider_id: str) -> datetime | None:
        run = self.standin.runs.get(provider_id)
        return run[1] if run is not None else None

    def _rate_limit(self) -> None:
        if self.world.rng.random() < 0.5:
            self.standin.fail_next(429)
        else:
            self.standin.plain_429(1)

    def _lose_release_answer(self, mode: str) -> None:
        del mode
        self.standin.lose_answers(1, method="POST", path=TERMINATE_PATH)

    def owed_micros(self, machine: Machine, until: datetime) -> int:
        """The platform's bill, plus, where Lambda told the bot only later that the machine was
        gone, what its minutes would have cost from its end to the moment the bot's meter
        stopped (Lambda's minutes counted from the run's start, as the bot counts them)."""
        billed = self.bill_micros(machine, until)
        told = self.meter_end.get(machine.provider_id)
        if machine.ended_at is None or told is None or until <= machine.ended_at:
            return billed
        metered = minutes_micros(machine, min(told, until))
        return billed + metered - minutes_micros(machine, machine.ended_at)

    def unrounded_micros(
        self, machine: Machine, until: datetime, meter_end: datetime | None
    ) -> int:
        """The started minute the bot's ledger has not charged yet at ``until`` where its meter
        still ran then (it charges a running session by the second and rounds the session to
        the minute when it ends), where the platform's bill to ``until`` counts it in full."""
        if meter_end is not None and meter_end <= until:
            return 0
        seconds = int((until - machine.started_at).total_seconds())
        return minutes_micros(machine, until) - max(0, seconds) * machine.price_per_s


def cents_per_hour(price_per_s: int) -> int:
    """The whole cents an hour Lambda lists for ``price_per_s`` micro-units a second. Raises
    ValueError for a price Lambda could not list."""
    cents, rest = divmod(price_per_s * 3600, CENTS_TO_MICROS)
    if rest:
        raise ValueError(f"{price_per_s} micro-units a second is no whole cents an hour")
    return cents


def minutes_micros(machine: Machine, until: datetime) -> int:
    """What a run from the machine's start to ``until`` costs by Lambda's rule: each started
    minute at the machine's price."""
    seconds = (until - machine.started_at).total_seconds()
    minutes = math.ceil(seconds / BILLED_S) if seconds > 0 else 0
    return minutes * BILLED_S * machine.price_per_s
