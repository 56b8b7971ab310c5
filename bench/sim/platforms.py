"""The platforms the team-month rents from, each a stand-in of the platform's API on loopback
reached by the bot's own client for it (bot.providers.*, over bot.providers.http.JsonApi), so
that the month goes through the HTTP layer and its translation of every answer into the bot's
errors: RunPod (bench/sim/runpod.py) and Vast.ai (bench/sim/vast.py).

The world's dice arm a platform's stand-in before each call the bot makes to it, in the bot's
one thread, and disarm it after; each stand-in's clock is the month's:

- an outage: every request answers 503 (``outage``);
- ``platform_error``: the call's first request answers 500 (``fail_next``);
- ``platform_catch_all_404``: the call meets a proxy's HTML 404 page (``catch_all``);
- ``platform_429``: a 429, as the platform sends its own (see each platform's ``rate_limit``);
- ``platform_operation_lock``: where the platform locks a machine mid-transition (RunPod), the
  machine is locked for the call;
- ``platform_lost_answer``: the DELETE is done and the connection drops before its answer
  (``lose_answers``).

Neither platform says when a machine ended: once terminated it is gone, and a look at it
answers the platform's own "not found". So the bot's meter stops when the platform first tells
it a machine is gone, and where that is after the machine's end (one ended in the platform's
console, a DELETE whose answer was lost) the bot's figures run ahead of the platform's bill by
that stretch. That is the documented rule the promise allows for
(:meth:`PlatformCloud.owed_micros`): the bot's meter may run past a machine's end only to a
moment at which the platform answered the bot that it was gone (``told_gone``), and `/gpu
bills` shows the difference beside the platform's bill.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from bench.sim.world import Machine, SimClock, World, box_name
from bot.errors import ProviderBusy, ProviderError, ProviderNotFound
from bot.providers.base import (
    InstanceTypeInfo,
    LaunchRequest,
    PlatformCharge,
    ProviderCapabilities,
    ProviderInstance,
    ReleaseOutcome,
)
from tests.fixtures.platforms.base import StandIn

#: After a machine's end, how long the moments its platform told the bot it was gone are kept
#: (each list and each look at it); a meter that runs on past them is the bot's.
TOLD_WINDOW = timedelta(hours=6)
#: The answers checked against a platform's published document: the first of each kind an hour.
CHECK_EVERY = timedelta(hours=1)

T = TypeVar("T")


@dataclass
class Checked:
    """A platform's answers as the month checked them against its published document."""

    answers: int = 0
    problems: list[str] = field(default_factory=list)
    last: dict[str, datetime] = field(default_factory=dict)


@dataclass(frozen=True)
class Registration:
    """What an instance of a platform is registered with: its compute price in micro-units an
    hour and its disk (GB, and micro-units per GB-month of 730 h), as the platform reports
    them."""

    price_micros_per_hour: int
    disk_gb: float
    storage_micros_per_gb_month: int


@dataclass
class Shared:
    """What the platforms of a month keep together, by machine id (ids differ by platform)."""

    machines: dict[str, Machine] = field(default_factory=dict)
    #: (when, busy) of each call about a machine that its platform failed (busy: a 409, the
    #: platform up), for the back-off rule's excuse.
    failed_calls: dict[str, list[tuple[datetime, bool]]] = field(
        default_factory=lambda: defaultdict(list)
    )


class PlatformCloud(ABC):
    """One platform of the month: its stand-in, the bot's client for it, and the dice."""

    name: str
    capabilities: ProviderCapabilities
    #: The storage a machine bills while it runs, micro-units a second (see ``open``).
    disk_per_s: int
    #: Whether the platform locks a machine mid-transition (its changes then answer 409).
    locks = False
    #: What the platform bills in (ISO 4217): the month's deployment counts in it.
    currency = "USD"

    def __init__(self, world: World, clock: SimClock, shared: Shared) -> None:
        self.world = world
        self.clock = clock
        self.shared = shared
        self.standin = self._standin()
        self.standin.now = clock()
        self.standin.start()
        self.client: Any = self._client()
        #: By machine: each moment, after its end, at which the platform told the bot so.
        self.told_gone: dict[str, set[datetime]] = defaultdict(set)
        #: By machine: where the bot's meter stopped, where the platform had told it the
        #: machine was gone then (set by :meth:`settle`, read by :meth:`owed_micros`).
        self.meter_end: dict[str, datetime] = {}
        self.checked = Checked()
        #: The platform's answers to the bot by HTTP status ("lost": done, the answer dropped).
        self.statuses: Counter[str] = Counter()

    @property
    def machines(self) -> dict[str, Machine]:
        return self.shared.machines

    def close(self) -> None:
        self.standin.close()

    # --- what each platform does its own way ------------------------------------------------

    @abstractmethod
    def _standin(self) -> StandIn:
        """The platform's stand-in, not yet started."""

    @abstractmethod
    def _client(self) -> Any:
        """The bot's own client for the platform, pointed at the stand-in."""

    @abstractmethod
    def _add(self, price_per_s: int, port: int) -> str:
        """Rent a machine on the stand-in (now); returns its id."""

    @abstractmethod
    def registration(self, price_per_s: int) -> Registration:
        """What a machine rented at ``price_per_s`` is registered with."""

    @abstractmethod
    def billed_micros(self, provider_id: str, start: datetime, until: datetime) -> int:
        """What the platform billed the machine over [start, until), micro-units."""

    @abstractmethod
    def _ended_at(self, provider_id: str) -> datetime | None:
        """When the stand-in says the machine ended (None while it has not)."""

    def ssh_address(self, provider_id: str, port: int) -> tuple[str, int]:
        """Where the machine answers SSH as the platform reports it (registered there)."""
        del provider_id
        return "127.0.0.1", port

    def _lock(self, provider_id: str, locked: bool) -> None:
        """Lock the machine mid-transition (where the platform ``locks``)."""
        raise NotImplementedError(f"{self.name} locks nothing")

    def _lose_release_answer(self, mode: str) -> None:
        """Arm the release's request to be done and its answer dropped (a DELETE by default)."""
        del mode
        self.standin.lose_answers(1, method="DELETE")

    def _rate_limit(self) -> None:
        """Arm the platform's next request to answer 429, as the platform sends it."""
        self.standin.plain_429(1)

    def _check_answers(self, now: datetime) -> None:
        """Check the answers given against the platform's published document, where it has
        one (none by default: the official client's tests judge such a stand-in)."""
        del now

    # --- what happens on the platform's side ------------------------------------------------

    def open(self, price_per_s: int, port: int, now: datetime) -> Machine:
        """A machine rented in the platform's console at ``price_per_s`` micro-units of compute
        a second, with its disks, answering SSH at 127.0.0.1:``port``."""
        self.standin.now = now
        pid = self._add(price_per_s, port)
        machine = Machine(pid, price_per_s + self.disk_per_s, started_at=now, platform=self.name)
        self.machines[pid] = machine
        return machine

    def end_outside(self, provider_id: str, now: datetime) -> None:
        """The machine is terminated on the platform's side (its console, a reclaim)."""
        self.standin.now = now
        self.standin.terminate_outside(provider_id)  # type: ignore[attr-defined]
        machine = self.machines[provider_id]
        machine.ended_at, machine.ended_by = now, "platform"

    # --- the Provider protocol, through the bot's own client -------------------------------

    def list_instances(self) -> list[ProviderInstance]:
        listed: list[ProviderInstance] = self._call("list", None, self.client.list_instances)
        now = self.clock()
        held = {item.provider_id for item in listed if not item.is_gone}
        for machine in self._own():
            if machine.provider_id not in held:
                self._told(machine, now)
        return listed

    def get(self, provider_id: str) -> ProviderInstance:
        try:
            found: ProviderInstance = self._call(
                "get", provider_id, lambda: self.client.get(provider_id)
            )
        except ProviderNotFound:
            machine = self.machines.get(provider_id)
            if machine is not None:
                self._told(machine, self.clock())
            raise
        machine = self.machines.get(provider_id)
        if found.is_gone and machine is not None:
            self._told(machine, self.clock())  # a look that answers "terminated"
        return found

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        now = self.clock()
        machine = self.machines.get(provider_id)
        live = machine is not None and machine.ended_at is None
        locked = live and self.locks and self.world.fires("platform_operation_lock", 0.25)
        if locked:
            self._lock(provider_id, True)
            self.world.log(now, f"[{box_name(provider_id)}] {self.name} is busy with it (409)")
        if live and self.world.fires("platform_lost_answer", 0.05):
            self._lose_release_answer(mode)
        try:
            outcome: ReleaseOutcome = self._call(
                "release", provider_id, lambda: self.client.release(provider_id, mode)
            )
        finally:
            if locked:
                self._lock(provider_id, False)
        if outcome.confirmed and outcome.state == "terminated" and machine is not None:
            self._told(machine, now)
        return outcome

    def start(self, provider_id: str) -> ProviderInstance:
        started: ProviderInstance = self._call(
            "start", provider_id, lambda: self.client.start(provider_id)
        )
        return started

    def charges(self, start: datetime, end: datetime) -> list[PlatformCharge]:
        found: list[PlatformCharge] = self._call(
            "charges", None, lambda: self.client.charges(start, end)
        )
        return found

    def price(self, instance_type: str) -> int | None:
        price: int | None = self._call("price", None, lambda: self.client.price(instance_type))
        return price

    def instance_types(self) -> list[InstanceTypeInfo]:
        types: list[InstanceTypeInfo] = self._call("catalogue", None, self.client.instance_types)
        return types

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        made: list[ProviderInstance] = self._call(
            "launch", None, lambda: self.client.launch(request)
        )
        return made

    # --- what the platform billed, and what the bot may say ---------------------------------

    def bill_micros(self, machine: Machine, until: datetime) -> int:
        """What the platform billed the machine from its start to ``until``."""
        if until <= machine.started_at:
            return 0
        return self.billed_micros(machine.provider_id, machine.started_at, until)

    def owed_micros(self, machine: Machine, until: datetime) -> int:
        """What the bot may say the machine cost to ``until``: the platform's bill, plus, where
        the platform said only later that it was gone, its price from its end to the moment the
        bot's meter stopped, if the platform had told the bot then (the documented rule)."""
        billed = self.bill_micros(machine, until)
        told = self.meter_end.get(machine.provider_id)
        if machine.ended_at is None or told is None:
            return billed
        unseen_s = (min(told, until) - machine.ended_at).total_seconds()
        return billed + max(0, int(unseen_s)) * machine.price_per_s

    def unrounded_micros(
        self, machine: Machine, until: datetime, meter_end: datetime | None
    ) -> int:
        """What the bot's ledger has not charged yet at ``until`` of what it may say the
        machine cost (its meter stopped at ``meter_end``, None while it runs): the ledger charges
        a running session by the second and its increment's rounding when it ends. Nothing
        where the platform bills by the second."""
        del machine, until, meter_end
        return 0

    def settle(self, released_at: dict[str, datetime | None]) -> list[str]:
        """Take where the bot's meter stopped for each of the platform's machines
        (``released_at`` by id) and return what breaks the rule: a meter that stopped before
        the machine's end, or after it at a moment when the platform had not told the bot."""
        problems: list[str] = []
        for pid, at in sorted(released_at.items()):
            machine = self.machines[pid]
            if at is None or machine.ended_at is None or at == machine.ended_at:
                continue
            if at < machine.ended_at:
                problems.append(
                    f"{box_name(pid)}: the meter stopped at {at:%m-%d %H:%M}, before the "
                    f"machine ended ({machine.ended_at:%m-%d %H:%M})"
                )
            elif at in self.told_gone[pid]:
                self.meter_end[pid] = at
            else:
                problems.append(
                    f"{box_name(pid)}: the meter stopped at {at:%m-%d %H:%M}, when {self.name} "
                    f"had not told the bot that the machine (ended "
                    f"{machine.ended_at:%m-%d %H:%M}) was gone"
                )
        return problems

    def report(self) -> dict[str, Any]:
        """The platform's figures for the month's JSON line."""
        return {
            "answers_by_status": dict(sorted(self.statuses.items())),
            "answers_checked": self.checked.answers,
            "answer_problems": len(self.checked.problems),
        }

    # --- the dice, and the calls -----------------------------------------------------------

    def _own(self) -> Iterator[Machine]:
        return (m for m in self.machines.values() if m.platform == self.name)

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
                busy = isinstance(exc, ProviderBusy)
                self.shared.failed_calls[provider_id].append((now, busy))
            self.world.log(now, f"{self.name} {call}: {type(exc).__name__}")
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
            self._rate_limit()

    def _told(self, machine: Machine, now: datetime) -> None:
        if machine.ended_at is not None and now - machine.ended_at <= TOLD_WINDOW:
            self.told_gone[machine.provider_id].add(now)

    def _sync(self, now: datetime) -> None:
        """Take from the stand-in what the call did (a machine it terminated ended then), count
        its answers, and check them where the platform publishes a document."""
        standin = self.standin
        with standin.lock:
            self.statuses.update(str(status) for _, _, status in standin.answered)
            self.statuses["lost"] += standin.lost
            standin.lost = 0
            standin.requests.clear()
            standin.calls.clear()
            standin.answered.clear()
            standin.user_agents.clear()
        self._check_answers(now)
        for machine in self._own():
            if machine.ended_at is None:
                ended = self._ended_at(machine.provider_id)
                if ended is not None:
                    machine.ended_at, machine.ended_by = ended, "bot"


class Platforms:
    """The month's platforms together, as the harness and the invariants read them."""

    def __init__(self, world: World, clock: SimClock, kinds: Sequence[type[PlatformCloud]]):
        self.shared = Shared()
        self.world = world
        self.all: list[PlatformCloud] = []
        try:
            for kind in kinds:
                self.all.append(kind(world, clock, self.shared))
        except BaseException:
            self.close()
            raise
        self.by_name = {platform.name: platform for platform in self.all}

    def __enter__(self) -> Platforms:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        for platform in self.all:
            platform.close()

    @property
    def machines(self) -> dict[str, Machine]:
        return self.shared.machines

    @property
    def failed_calls(self) -> dict[str, list[tuple[datetime, bool]]]:
        return self.shared.failed_calls

    @property
    def currency(self) -> str:
        """The one currency the platforms bill in (:func:`currency_of`)."""
        return currency_of(self.all)

    def pick(self, rng: random.Random) -> PlatformCloud:
        """Where the next machine is rented (no dice with one platform)."""
        if len(self.all) == 1:
            return self.all[0]
        return rng.choice(self.all)

    def end_outside(self, provider_id: str, now: datetime) -> None:
        self._of(provider_id).end_outside(provider_id, now)

    def bill_micros(self, machine: Machine, until: datetime) -> int:
        return self.by_name[machine.platform].bill_micros(machine, until)

    def owed_micros(self, machine: Machine, until: datetime) -> int:
        return self.by_name[machine.platform].owed_micros(machine, until)

    def unseen_end_micros(self, until: datetime) -> int:
        """How far the bot's figures run ahead of the platforms' bills by the documented
        rule."""
        return sum(
            self.owed_micros(m, until) - self.bill_micros(m, until) for m in self.machines.values()
        )

    def settle(self, released_at: dict[str, datetime | None], now: datetime) -> list[str]:
        """:meth:`PlatformCloud.settle` for each platform's machines, the clocks at ``now``."""
        problems: list[str] = []
        for platform in self.all:
            platform.standin.now = now
            own = {
                pid: at
                for pid, at in released_at.items()
                if self.machines[pid].platform == platform.name
            }
            problems += platform.settle(own)
        return problems

    def problems(self) -> list[str]:
        """Every answer that did not fit its platform's published document."""
        return [f"{p.name}: {problem}" for p in self.all for problem in p.checked.problems]

    def _of(self, provider_id: str) -> PlatformCloud:
        return self.by_name[self.machines[provider_id].platform]


def currency_of(platforms: Sequence[PlatformCloud | type[PlatformCloud]]) -> str:
    """The currency ``platforms`` all bill in; ValueError where they bill in several, since a
    deployment counts one currency (GPUBOT_CURRENCY) and takes no instance priced in another."""
    by_currency: dict[str, list[str]] = defaultdict(list)
    for platform in platforms:
        by_currency[platform.currency].append(platform.name)
    if len(by_currency) == 1:
        return next(iter(by_currency))
    said = "; ".join(f"{', '.join(names)} in {code}" for code, names in sorted(by_currency.items()))
    raise ValueError(
        f"the platforms bill in different currencies ({said}), and a deployment counts one "
        "(GPUBOT_CURRENCY): run them in separate months"
    )
