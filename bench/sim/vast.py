"""Vast.ai in the team-month: Vast's REST stand-in (tests/fixtures/platforms/vast.py: instances
paged by ``next_token`` as the official client reads them, ``{"instances": null}`` for one it
does not have, and, with ``bills_runs``, a charge row per instance and UTC day of what it ran
at ``GET /api/v0/charges/``) and the bot's Vast client (bot.providers.vast), whose waits (a
plain 429, the pause before a confirming look) take no time here. Vast locks nothing, so
``platform_operation_lock`` does not happen to it; its 429s are plain text, without a
Retry-After. See bench/sim/platforms.py for what every platform of the month shares."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bench.sim.platforms import PlatformCloud, Registration
from bot.providers.http import JsonApi
from bot.providers.vast import VastProvider, is_not_found
from tests.fixtures.platforms.base import StandIn
from tests.fixtures.platforms.vast import VastStandIn

#: Each instance's disk, GB, and its price in USD per GB-month as Vast counts a month (720 h):
#: 0.072 USD an hour, exactly 20 micro-USD a second, which the bot takes as 105,120 micro-USD
#: per GB-month of its 730 h, so that the two meet without a rounding rule.
DISK_GB = 500.0
STORAGE_USD_PER_GB_MONTH = 0.10368
DISK_MICROS_PER_GB_MONTH = 105_120


class VastCloud(PlatformCloud):
    """Vast.ai: instances through its REST API."""

    name = "vast"
    capabilities = VastProvider.capabilities
    disk_per_s = 20

    standin: VastStandIn

    def _standin(self) -> StandIn:
        standin = VastStandIn()
        standin.bills_runs = True
        return standin

    def _client(self) -> Any:
        api = JsonApi.bearer(
            self.name, self.standin.url, self.standin.api_key, not_found=is_not_found
        )
        return VastProvider(api, sleep=lambda _s: None)

    def _add(self, price_per_s: int, port: int) -> str:
        return self.standin.add(
            dph_base=price_per_s * 3600 / 1_000_000,
            disk_space=DISK_GB,
            storage_cost=STORAGE_USD_PER_GB_MONTH,
            ssh_port=port,
        )

    def registration(self, price_per_s: int) -> Registration:
        return Registration(price_per_s * 3600, DISK_GB, DISK_MICROS_PER_GB_MONTH)

    def billed_micros(self, provider_id: str, start: datetime, until: datetime) -> int:
        return round(self.standin.bill(provider_id, start, until) * 1_000_000)

    def _ended_at(self, provider_id: str) -> datetime | None:
        if provider_id not in self.standin.gone:
            return None
        stretches = self.standin.history[provider_id]
        return stretches[-1][1] if stretches else None
