"""RunPod in the team-month: RunPod's REST v2 stand-in (tests/fixtures/platforms/runpod.py:
every request body checked against RunPod's v2 OpenAPI document, billing per second in day
buckets at ``GET /v2/billing/pods``) and the bot's RunPod client (bot.providers.runpod). Its
answers are checked against the same document (the first of each kind every hour); a pod is
locked mid-transition for ``platform_operation_lock`` (its DELETE answers 409); its 429s are
RunPod's own (Retry-After and RateLimit headers) half the time, plain text the other half.
See bench/sim/platforms.py for what every platform of the month shares."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bench.sim.platforms import CHECK_EVERY, PlatformCloud, Registration
from bot.providers.http import JsonApi
from bot.providers.runpod import RunpodProvider, is_not_found_document
from tests.fixtures.platforms.base import StandIn
from tests.fixtures.platforms.runpod import RunpodStandIn, schema_errors

#: Each pod's container disk and volume, GB: while it runs RunPod bills both at $0.10 per
#: GB-month of 730 h, per second; 657 GB of them come to exactly 25 micro-USD a second, so
#: that RunPod's rounding to the micro-unit and the bot's meet without a rule for it.
CONTAINER_GB, VOLUME_GB = 57, 600
DISK_GB = CONTAINER_GB + VOLUME_GB
DISK_MICROS_PER_GB_MONTH = 100_000


class RunpodCloud(PlatformCloud):
    """RunPod: pods through REST v2."""

    name = "runpod"
    capabilities = RunpodProvider.capabilities
    disk_per_s = 25
    locks = True

    standin: RunpodStandIn

    def _standin(self) -> StandIn:
        return RunpodStandIn()

    def _client(self) -> Any:
        return RunpodProvider(
            JsonApi.bearer(
                self.name, self.standin.url, self.standin.api_key, not_found=is_not_found_document
            )
        )

    def _add(self, price_per_s: int, port: int) -> str:
        pid = self.standin.add(
            cost=price_per_s * 3600 / 1_000_000, disk_gb=CONTAINER_GB, volume_gb=VOLUME_GB
        )
        self.standin.move(pid, "127.0.0.1", port)
        return pid

    def registration(self, price_per_s: int) -> Registration:
        return Registration(price_per_s * 3600, float(DISK_GB), DISK_MICROS_PER_GB_MONTH)

    def billed_micros(self, provider_id: str, start: datetime, until: datetime) -> int:
        amounts = self.standin.bill(provider_id, start, until)
        return round(amounts["totalAmount"] * 1_000_000)

    def _ended_at(self, provider_id: str) -> datetime | None:
        if provider_id not in self.standin.gone:
            return None
        stretches = self.standin.history[provider_id]
        return stretches[-1][1] if stretches else None

    def _lock(self, provider_id: str, locked: bool) -> None:
        self.standin.lock_pod(provider_id, locked)

    def _rate_limit(self) -> None:
        if self.world.rng.random() < 0.5:
            self.standin.rate_limit(1)
        else:
            self.standin.plain_429(1)

    def _check_answers(self, now: datetime) -> None:
        standin = self.standin
        with standin.lock:
            answers, standin.answers = standin.answers, []
        for name, document in answers:
            last = self.checked.last.get(name)
            if last is not None and now - last < CHECK_EVERY:
                continue
            self.checked.last[name] = now
            self.checked.answers += 1
            self.checked.problems += [f"{name}: {e}" for e in schema_errors(name, document)]
