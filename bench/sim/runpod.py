"""RunPod as the team-month rents from it: RunPod's REST v2 stand-in on loopback
(tests/fixtures/platforms/runpod.py: every request body checked against RunPod's v2 OpenAPI
document, billing per second in day buckets at ``GET /v2/billing/pods``), reached by the bot's
own client (bot.providers.runpod.RunpodProvider over bot.providers.http.JsonApi), so that the
month goes through the HTTP layer and its translation of every answer into the bot's errors.

The world's dice arm the stand-in before each call the bot makes, in the bot's one thread, and
disarm it after; the stand-in's clock is the month's:

- an outage: every request answers 503 (``outage``);
- ``platform_error``: the call's first request answers 500 (``fail_next``);
- ``platform_catch_all_404``: the call meets a proxy's HTML 404 page (``catch_all``);
- ``platform_429``: a 429, half the time RunPod's own (Retry-After and RateLimit headers), half
  the time in plain text without them (``rate_limit``, ``plain_429``);
- ``platform_operation_lock``: the pod is locked for the call, so the DELETE answers 409;
- ``platform_lost_answer``: the DELETE is done and the connection drops before its answer
  (``lose_answers``).

RunPod does not say when a pod ended: once terminated it is gone, and a GET answers 404 with
RunPod's own problem document. So the bot's meter stops when RunPod first tells it a pod is
gone, and where that is after the pod's end (a pod ended in RunPod's console, a DELETE whose
answer was lost) the bot's figures run ahead of RunPod's bill by that stretch. That is the
documented rule the promise allows for (:meth:`RunpodCloud.owed_micros`): the bot's meter may
run past the pod's end only to a moment at which RunPod answered the bot that the pod was gone
(:attr:`RunpodCloud.told_gone`), and `/gpu bills` shows the difference beside RunPod's bill.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from bench.sim.world import Machine, SimClock, World, box_name
from bot.errors import ProviderBusy, ProviderError, ProviderNotFound
from bot.providers.base import (
    InstanceTypeInfo,
    LaunchRequest,
    PlatformCharge,
    ProviderInstance,
    ReleaseOutcome,
)
from bot.providers.http import JsonApi
from bot.providers.runpod import RunpodProvider, is_not_found_document
from tests.fixtures.platforms.runpod import RunpodStandIn, schema_errors

PLATFORM = "runpod"
#: After a pod's end, how long the moments RunPod told the bot it was gone are kept (each list
#: and each look at it); a meter that runs on past them is the bot's.
TOLD_WINDOW = timedelta(hours=6)
#: Each pod's container disk and volume, GB: while it runs RunPod bills both at $0.10 per
#: GB-month of 730 h, per second; 657 GB of them come to exactly 25 micro-USD a second, so
#: that RunPod's rounding to the micro-unit and the bot's meet without a rule for it.
CONTAINER_GB, VOLUME_GB = 57, 600
DISK_GB = CONTAINER_GB + VOLUME_GB
DISK_MICROS_PER_GB_MONTH = 100_000
DISK_PER_S = 25
#: The answers checked against RunPod's OpenAPI document: the first of each kind every hour.
CHECK_EVERY = timedelta(hours=1)

T = TypeVar("T")


@dataclass
class Checked:
    """RunPod's answers as the month checked them against the v2 document."""

    answers: int = 0
    problems: list[str] = field(default_factory=list)
    last: dict[str, datetime] = field(default_factory=dict)


class RunpodCloud:
    """The month's platform: the RunPod stand-in, the bot's RunPod client, and the dice."""

    name = PLATFORM
    capabilities = RunpodProvider.capabilities

    def __init__(self, world: World, clock: SimClock) -> None:
        self.world = world
        self.clock = clock
        self.standin = RunpodStandIn()
        self.standin.now = clock()
        self.standin.start()
        self.client = RunpodProvider(
            JsonApi.bearer(
                PLATFORM, self.standin.url, self.standin.api_key, not_found=is_not_found_document
            )
        )
        self.machines: dict[str, Machine] = {}
        #: By machine: (when, busy) of each call about it that the platform failed (busy: a
        #: 409, the platform up), for the back-off rule's excuse.
        self.failed_calls: dict[str, list[tuple[datetime, bool]]] = defaultdict(list)
        #: By machine: each moment, after its end, at which RunPod told the bot it was gone.
        self.told_gone: dict[str, set[datetime]] = defaultdict(set)
        #: By machine: where the bot's meter stopped, where RunPod had told it the pod was gone
        #: then (set by :meth:`settle`, read by :meth:`owed_micros`).
        self.meter_end: dict[str, datetime] = {}
        self.checked = Checked()
        #: RunPod's answers to the bot by HTTP status ("lost": done, the answer dropped).
        self.statuses: Counter[str] = Counter()

    def __enter__(self) -> RunpodCloud:
        return self

    def __exit__(self, *_: object) -> None:
        self.standin.close()

    # --- what happens on RunPod's side ----------------------------------------------------

    def open(self, price_per_s: int, port: int, now: datetime) -> Machine:
        """A pod rented in RunPod's console at ``price_per_s`` micro-USD of compute a second,
        with its disks (:data:`CONTAINER_GB` and :data:`VOLUME_GB`), answering SSH at
        127.0.0.1:``port``. The machine bills compute and disks together."""
        self.standin.now = now
        pid = self.standin.add(
            cost=price_per_s * 3600 / 1_000_000, disk_gb=CONTAINER_GB, volume_gb=VOLUME_GB
        )
        self.standin.move(pid, "127.0.0.1", port)
        machine = Machine(pid, price_per_s + DISK_PER_S, started_at=now)
        self.machines[pid] = machine
        return machine

    def end_outside(self, provider_id: str, now: datetime) -> None:
        """The pod is terminated on RunPod's side (its console, a reclaimed machine)."""
        self.standin.now = now
        self.standin.terminate_outside(provider_id)
        machine = self.machines[provider_id]
        machine.ended_at, machine.ended_by = now, "platform"

    # --- the Provider protocol, through the bot's own client ------------------------------

    def list_instances(self) -> list[ProviderInstance]:
        listed = self._call("list", None, self.client.list_instances)
        now = self.clock()
        held = {pod.provider_id for pod in listed}
        for machine in self.machines.values():
            if machine.provider_id not in held:
                self._told(machine, now)
        return listed

    def get(self, provider_id: str) -> ProviderInstance:
        try:
            return self._call("get", provider_id, lambda: self.client.get(provider_id))
        except ProviderNotFound:
            machine = self.machines.get(provider_id)
            if machine is not None:
                self._told(machine, self.clock())
            raise

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        now = self.clock()
        machine = self.machines.get(provider_id)
        locked = machine is not None and machine.ended_at is None
        if locked and self.world.fires("platform_operation_lock", 0.02):
            self.world.log(now, f"[{box_name(provider_id)}] RunPod is busy with it (409)")
            self.standin.lock_pod(provider_id)
        if locked and self.world.fires("platform_lost_answer", 0.05):
            self.standin.lose_answers(1, method="DELETE")
        try:
            outcome = self._call(
                "release", provider_id, lambda: self.client.release(provider_id, mode)
            )
        finally:
            self.standin.lock_pod(provider_id, False)
        if outcome.confirmed and outcome.state == "terminated" and machine is not None:
            self._told(machine, now)
        return outcome

    def start(self, provider_id: str) -> ProviderInstance:
        return self._call("start", provider_id, lambda: self.client.start(provider_id))

    def charges(self, start: datetime, end: datetime) -> list[PlatformCharge]:
        return self._call("charges", None, lambda: self.client.charges(start, end))

    def price(self, instance_type: str) -> int | None:
        return self._call("price", None, lambda: self.client.price(instance_type))

    def instance_types(self) -> list[InstanceTypeInfo]:
        return self._call("catalogue", None, self.client.instance_types)

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        return self._call("launch", None, lambda: self.client.launch(request))

    # --- what RunPod billed, and what the bot may say ----------------------------------------

    def bill_micros(self, machine: Machine, until: datetime) -> int:
        """What RunPod billed the pod from its start to ``until``, in USD micro-units (its own
        per-second bill, at most to the stand-in's clock)."""
        if until <= machine.started_at:
            return 0
        amounts = self.standin.bill(machine.provider_id, machine.started_at, until)
        return round(amounts["totalAmount"] * 1_000_000)

    def owed_micros(self, machine: Machine, until: datetime) -> int:
        """What the bot may say the pod cost to ``until``: RunPod's bill, plus, where RunPod
        said only later that the pod was gone, the pod's price from its end to the moment the
        bot's meter stopped, if RunPod had told the bot then (the documented rule above)."""
        billed = self.bill_micros(machine, until)
        told = self.meter_end.get(machine.provider_id)
        if machine.ended_at is None or told is None:
            return billed
        unseen_s = (min(told, until) - machine.ended_at).total_seconds()
        return billed + max(0, int(unseen_s)) * machine.price_per_s

    def settle(self, released_at: dict[str, datetime | None], now: datetime) -> list[str]:
        """Take where the bot's meter stopped for each pod (``released_at`` by pod id) and
        return what breaks the rule: a meter that stopped before the pod's end, or after it at a
        moment when RunPod had not told the bot the pod was gone."""
        self.standin.now = now
        problems: list[str] = []
        for pid, at in sorted(released_at.items()):
            machine = self.machines[pid]
            if at is None or machine.ended_at is None or at == machine.ended_at:
                continue
            if at < machine.ended_at:
                problems.append(
                    f"{box_name(pid)}: the meter stopped at {at:%m-%d %H:%M}, before the pod "
                    f"ended ({machine.ended_at:%m-%d %H:%M})"
                )
            elif at in self.told_gone[pid]:
                self.meter_end[pid] = at
            else:
                problems.append(
                    f"{box_name(pid)}: the meter stopped at {at:%m-%d %H:%M}, when RunPod had "
                    f"not told the bot that the pod (ended {machine.ended_at:%m-%d %H:%M}) was gone"
                )
        return problems

    def unseen_end_micros(self, until: datetime) -> int:
        """How far the bot's figures run ahead of RunPod's bill by the documented rule."""
        return sum(
            self.owed_micros(m, until) - self.bill_micros(m, until) for m in self.machines.values()
        )

    # --- the dice, and the calls -------------------------------------------------------------

    def _call(self, call: str, provider_id: str | None, send: Callable[[], T]) -> T:
        """Make one call of the bot's client with the faults the dice give armed on the
        stand-in, and disarm them after; a failure about one machine is recorded against it."""
        now = self.clock()
        self.standin.now = now
        self._arm(now)
        try:
            return send()
        except ProviderNotFound:
            raise
        except ProviderError as exc:
            if provider_id is not None:
                self.failed_calls[provider_id].append((now, isinstance(exc, ProviderBusy)))
            self.world.log(now, f"RunPod {call}: {type(exc).__name__}")
            raise
        finally:
            self.standin.disarm()
            self._sync(now)

    def _arm(self, now: datetime) -> None:
        standin = self.standin
        if not self.world.platform_up(now):
            standin.outage(503)
            return
        standin.outage(None)
        if self.world.fires("platform_error", 0.03):
            standin.fail_next(500)
        elif self.world.fires("platform_catch_all_404", 0.02):
            standin.catch_all()
        elif self.world.fires("platform_429", 0.01):
            if self.world.rng.random() < 0.5:
                standin.rate_limit(1)
            else:
                standin.plain_429(1)

    def _told(self, machine: Machine, now: datetime) -> None:
        if machine.ended_at is not None and now - machine.ended_at <= TOLD_WINDOW:
            self.told_gone[machine.provider_id].add(now)

    def _sync(self, now: datetime) -> None:
        """Take from the stand-in what the call did (a pod it terminated ended then), and check
        its answers against RunPod's document (the first of each kind every hour)."""
        standin = self.standin
        with standin.lock:
            answers, standin.answers = standin.answers, []
            self.statuses.update(str(status) for _, _, status in standin.answered)
            self.statuses["lost"] += standin.lost
            standin.lost = 0
            standin.requests.clear()
            standin.calls.clear()
            standin.answered.clear()
            standin.user_agents.clear()
        for name, document in answers:
            last = self.checked.last.get(name)
            if last is not None and now - last < CHECK_EVERY:
                continue
            self.checked.last[name] = now
            self.checked.answers += 1
            self.checked.problems += [f"{name}: {e}" for e in schema_errors(name, document)]
        for pid in standin.gone:
            machine = self.machines.get(pid)
            if machine is not None and machine.ended_at is None:
                stretches = standin.history[pid]
                machine.ended_at = stretches[-1][1] if stretches else now
                machine.ended_by = "bot"
