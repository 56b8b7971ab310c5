"""Compshare (优云智算, UCloud's GPU platform) in the team-month: its stand-in
(tests/fixtures/platforms/compshare.py: signed form POSTs with an ``Action``, answers with a
``RetCode``, billing Postpay by the hour on its own clock) and the bot's Compshare client
(bot.providers.compshare, hourly as ``GPUBOT_COMPSHARE_BILLING`` is by default). Prices are in
CNY: the bot counts yuan for these machines and dollars for the others, and the promise
compares each currency with the bills in it (bench/sim/promise.py).

What Compshare does its own way:

- A release takes two steps: a stop (``StopCompShareInstance``; its compute bill ends there),
  then, once the instance is Stopped, a terminate; the bot's client looks for Stopped after
  its stop and terminates in the same call, or leaves it to a later call where the terminate
  is refused or its answer lost. The machine's end is the stop; the bot is told it is gone
  when the terminate is answered, or when a look no longer finds it.
- It bills by the hour, each hour in full as it begins, so the rule for an end told late is
  hourly too (:meth:`CompshareCloud.owed_micros`): the bot may count the hours of compute that
  begin before the moment the platform told it that the machine was gone.
- The month's zone bills nothing for a stopped instance (Postpay "支持关机不收费"): its
  machines are registered without a disk, and the stand-in lists no
  ``PostPayPowerOffBillingResource`` (the stand-in bills one where it lists one; see its tests).
- Its throttling is RetCode 153 over HTTP 200; its operation lock answers
  ``InstanceOperationInProgress``; a lost answer is a Stop or Terminate POST done and dropped.

See bench/sim/platforms.py for what every platform of the month shares.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bench.sim.platforms import PlatformCloud, Registration
from bench.sim.world import Machine
from bot.providers.compshare import CompshareApi, CompshareProvider
from bot.providers.http import JsonApi
from tests.fixtures.platforms.base import StandIn
from tests.fixtures.platforms.compshare import (
    COMPSHARE_PRIVATE_KEY,
    COMPSHARE_PUBLIC_KEY,
    COMPSHARE_REGION,
    CompshareStandIn,
)

#: Where the month's Compshare instances are numbered from (RunPod's from 1, Vast's from 1001).
ID_FROM = 5000
#: What the bot's Compshare client is built with (GPUBOT_COMPSHARE_BILLING's default, the
#: increment of ``CompshareProvider.capabilities``).
INCREMENT = "hour"
#: The actions whose answer a lost answer drops: the two steps of a release.
RELEASE_ACTIONS = ("/StopCompShareInstance", "/TerminateCompShareInstance")


class MonthStandIn(CompshareStandIn):
    """Compshare's stand-in, its ids numbered from ``ID_FROM`` (``uhost-005001`` is
    ``box5001``, apart from the other platforms' boxes)."""

    def next_id(self) -> str:
        return str(ID_FROM + int(super().next_id()))


class CompshareCloud(PlatformCloud):
    """Compshare: GPU instances through UCloud's signed API, billed in CNY by the hour."""

    name = "compshare"
    capabilities = CompshareProvider.capabilities
    currency = "CNY"
    disk_per_s = 0
    locks = True

    standin: MonthStandIn

    def _standin(self) -> StandIn:
        standin = MonthStandIn()
        standin.powered_off_billing = []
        return standin

    def _client(self) -> Any:
        api = CompshareApi(
            JsonApi(self.name, self.standin.url, headers={}),
            public_key=COMPSHARE_PUBLIC_KEY,
            private_key=COMPSHARE_PRIVATE_KEY,
            region=COMPSHARE_REGION,
        )
        # The month's clock stands still during a call and the stand-in's instance moves on at
        # each look, so the bot's looks after a Stop need no real pause between them.
        return CompshareProvider(api, billing_increment=INCREMENT, pause=_no_pause)

    def _add(self, price_per_s: int, port: int) -> str:
        uid = self.standin.add(price=price_per_s * 3600 / 1_000_000)
        item = self.standin.instances[uid]
        item["SshLoginCommand"] = f"ssh -p {port} root@127.0.0.1"
        item.pop("DiskSet", None)
        return uid

    def registration(self, price_per_s: int) -> Registration:
        return Registration(price_per_s * 3600, 0.0, 0)

    def billed_micros(self, provider_id: str, start: datetime, until: datetime) -> int:
        return round(self.standin.bill(provider_id, start, until) * 1_000_000)

    def _ended_at(self, provider_id: str) -> datetime | None:
        if provider_id not in self.standin.gone:
            return None
        running = [s for s in self.standin.history[provider_id] if s[2] == "running"]
        return running[-1][1] if running else None

    def _lock(self, provider_id: str, locked: bool) -> None:
        self.standin.lock_instance(provider_id, locked)

    def _lose_release_answer(self, mode: str) -> None:
        del mode
        for action in RELEASE_ACTIONS:  # the Stop or the Terminate, whichever is sent
            self.standin.lose_answers(1, method="POST", path=action)

    def _rate_limit(self) -> None:
        self.standin.retcode_next(153, "Request too frequently")

    def owed_micros(self, machine: Machine, until: datetime) -> int:
        """The bill, plus, where the platform told the bot only later that the machine was
        gone, the hours of compute that begin from its end to the moment the bot's meter
        stopped (the bot's meter is one hourly session to there)."""
        billed = self.bill_micros(machine, until)
        told = self.meter_end.get(machine.provider_id)
        if machine.ended_at is None or told is None:
            return billed
        hourly = machine.price_per_s * 3600
        return billed + hourly * (
            _hours(machine.started_at, min(told, until))
            - _hours(machine.started_at, min(machine.ended_at, until))
        )

    def unrounded_micros(
        self, machine: Machine, until: datetime, meter_end: datetime | None
    ) -> int:
        """Where the bot's meter still ran at ``until``: its session is charged by the second
        so far (whole micro-yuan: prices are whole micro-yuan a second), the hour that began
        is rounded when it ends."""
        if meter_end is not None and meter_end <= until:
            return 0
        metered_s = max(0, int((until - machine.started_at).total_seconds()))
        return self.owed_micros(machine, until) - metered_s * machine.price_per_s


def _no_pause(seconds: float) -> None:
    del seconds


def _hours(start: datetime, end: datetime) -> int:
    """The hours that begin in [start, end)."""
    seconds = (end - start).total_seconds()
    return 0 if seconds <= 0 else -(-int(seconds) // 3600)
