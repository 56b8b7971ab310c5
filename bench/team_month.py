"""A team's month, simulated: the real store, the real clock's ``tick(now)`` and the real
services, with stand-ins only at the outside edges (Slack's Web API, the platform's API, the
agents' status), all misbehaving on a seeded schedule; the product's promise is checked at the
end as figures and a list of violations.

    python bench/team_month.py --seed 7 --days 3 [--people 10 --instances 40
        --store sqlite|postgresql --start 2027-03-30] [--break skip_warning|double_post|drop_charge]

What it drives: each instance is a machine on the stand-in platform ``simcloud`` (billed per
second, from its start until the platform itself ends it), registered to one person with a
deadline; people behave by habit (some extend at each warning, some click twice, some never
answer, some release early); an admin sets monthly budgets and lifetime caps; people switch
language now and then, and try to extend or release machines that are not theirs; the clock
advances one tick interval at a time and calls ``tick(now)``, so warnings, releases, retries,
reconciliation, the ledger and the outbox run as they do in the bot. Faults: Slack outages,
answers lost after the post landed, 429s; platform 5xx answers, lost answers after the
platform acted, catch-all HTML 404s (unknown outcomes), operation locks (a 409 while the
platform is busy with the machine), instances ended on the platform behind the bot's back; bot
restarts (a new runtime on the same store: every in-memory state is lost); the clock jumping (a
host suspended for an hour: what the machines bill meanwhile is excused); SSH hosts that hang
or drop; GPUs that go idle, overheat or disappear from the agent's answer. Each kind of fault
(``FAULT_KINDS``) is also scheduled once at a seeded moment of the first day, so that every
kind fires in any run of a day or more.

Invariants, each a figure in the last line's JSON object:
- ``paid_past_warning_micros``: what the platform billed past an instance's last deadline plus
  the bot's notice window (the time a release may take: ``notice_s``) while the platform took
  calls, for instances nobody exempted.
- ``unwarned_releases``: deadline releases with no warning posted before, where Slack was up.
- ``doubled_messages``: messages the bot posted on its own twice (same key, same recipient).
- ``digest_vs_platform_micros``: |the month's total as the bot reports it (spend) - what the
  platform billed| summed over the month's instances. Prices are whole micro-units per second,
  so no rounding rule separates the two.
- ``double_registrations``: machines with two live registrations.
- ``status_vs_platform_micros``: per instance, |what `/gpu status` shows it cost since it was
  registered - what the platform billed for its machine|, plus per month, |the month's total as
  `/gpu spend` reports it - what the platform billed in that month|.
- ``per_owner_vs_platform_micros``: per person, |their instances' spend summed over the run's
  months - the platform's bill for their machines|.
- ``closed_digest_vs_platform_micros``: for each month that closed during the run, |the
  digest's total - the platform's bill for the month|; and the digest must have been posted
  (``digests_missing``) when Slack was up for an hour after it was due.
- ``unauthorised_changes``: attempts by someone other than the owner (or an admin) to extend
  or release an instance that were not refused with NotAuthorized, or that changed it.
- ``paid_past_warning_micros`` counts an admin's lifetime cap even on instances their owners
  extended: nobody but an admin may extend past it.

The JSON line holds ``seed``, ``days``, ``start``, ``people``, ``instances``, ``jobs`` (0: jobs
are not simulated yet), ``faults`` (counts by kind), ``actions`` (what the admin and the people
did besides answering warnings), ``violations``, the figures above and ``wall_s``;
the same seed gives the same line but ``wall_s``. Exit status 0 only without violations.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402
from sqlmodel import col, select  # noqa: E402

from bot import billing  # noqa: E402
from bot.blocks import render, render_files  # noqa: E402
from bot.errors import (  # noqa: E402
    FleetError,
    GpubotError,
    NotAuthorized,
    ProviderError,
    ProviderNotFound,
    ProviderRateLimited,
    ProviderUnknownOutcome,
    SlackError,
    Unreachable,
)
from bot.fleet.base import Target  # noqa: E402
from bot.notify import MessageRef  # noqa: E402
from bot.providers.base import (  # noqa: E402
    InstanceTypeInfo,
    LaunchRequest,
    ProviderCapabilities,
    ProviderInstance,
    ReleaseOutcome,
    no_launch,
)
from bot.providers.manual import ManualProvider  # noqa: E402
from bot.providers.registry import ProviderRegistry  # noqa: E402
from bot.runtime import Runtime  # noqa: E402
from bot.services import (  # noqa: E402
    answers,
    budgets,
    costs,
    deadlines,
    digest,
    ledger,
    lifecycle,
    people,
    prompts,
    releases,
    spend,
)
from bot.services.access import Caller  # noqa: E402
from bot.services.tick import tick  # noqa: E402
from bot.settings import Settings  # noqa: E402
from bot.store.db import Database  # noqa: E402
from bot.store.models import Instance, OutboxMessage, Person, Prompt, Release  # noqa: E402
from tests.agents.factories import make_status  # noqa: E402

PLATFORM = "simcloud"
#: The run's first moment by default (naive UTC, the first of a month); ``--start`` moves it.
START = datetime(2027, 3, 1, 0, 0, 0)
ADMIN = "UADMIN"
OPS = "COPS"
#: The clock's step by default, in seconds (GPUBOT_TICK_INTERVAL_S; the bot's default is 60).
TICK_S = 300
HABITS = ("extender", "silent", "double_clicker", "early_releaser", "late_clicker")
#: Prices per hour in whole micro-units per second (x 3600), as a rate card might list them.
PRICES_PER_S = (550, 275, 1_000, 2_200, 125)
#: Test-only switches that break the build on purpose (the harness must catch each).
BREAKS = ("skip_warning", "double_post", "drop_charge")
#: Every kind of fault the world injects; each is also scheduled once in the first day.
FAULT_KINDS = (
    "slack_outage",
    "slack_429",
    "slack_lost_answer",
    "platform_outage",
    "platform_error",
    "platform_catch_all_404",
    "platform_429",
    "platform_lost_answer",
    "platform_operation_lock",
    "ended_on_platform",
    "ssh_hang",
    "ssh_drop",
    "gpu_idle",
    "gpu_overheat",
    "gpu_gone",
    "process_kill",
    "clock_jump",
)
#: Budgets the admin sets for a person, per month, in micro-units (tight to generous).
BUDGETS_MICROS = (5_000_000, 50_000_000, 500_000_000)


# --- the world -----------------------------------------------------------------------------


@dataclass
class World:
    """What the outside edges are doing now, and what they did."""

    rng: random.Random
    faults: Counter[str] = field(default_factory=Counter)
    slack_down_until: datetime | None = None
    platform_down_until: datetime | None = None
    #: (start, end) of each platform outage, to excuse what it kept billing.
    platform_outages: list[tuple[datetime, datetime]] = field(default_factory=list)
    slack_outages: list[tuple[datetime, datetime]] = field(default_factory=list)
    #: (start, end) of each time the bot's host was suspended (the clock jumped over it).
    suspensions: list[tuple[datetime, datetime]] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    #: Kinds whose scheduled moment came: each fires at its next chance, whatever the dice.
    due: set[str] = field(default_factory=set)

    def fires(self, kind: str, probability: float) -> bool:
        """Whether a fault of ``kind`` happens at this chance (counted when it does)."""
        if kind in self.due:
            self.due.discard(kind)
        elif self.rng.random() >= probability:
            return False
        self.faults[kind] += 1
        return True

    def log(self, now: datetime, what: str) -> None:
        self.trace.append(f"{now:%m-%d %H:%M} {what}")

    def slack_up(self, now: datetime) -> bool:
        return self.slack_down_until is None or now >= self.slack_down_until

    def platform_up(self, now: datetime) -> bool:
        return self.platform_down_until is None or now >= self.platform_down_until


@dataclass
class Posted:
    channel: str
    text: str
    key: str | None
    ts: str


class SimSlack:
    """Slack's Web API as the bot's notifier sees it: outages (unreachable), 429s, and posts
    that land although the answer was lost (outcome unknown)."""

    def __init__(self, world: World, clock: SimClock, *, double_post: bool = False) -> None:
        self.world = world
        self.clock = clock
        self.posts: list[Posted] = []
        self.double_post = double_post
        self._ts = 0

    def post(
        self,
        channel: str,
        text: str,
        blocks: Sequence[dict[str, Any]] = (),
        *,
        thread_ts: str | None = None,
        key: str | None = None,
    ) -> MessageRef:
        now = self.clock()
        if not self.world.slack_up(now):
            raise SlackError("Slack is unreachable", error="unreachable")
        if self.world.fires("slack_429", 0.02):
            raise SlackError("ratelimited", error="ratelimited")
        ref = self._land(channel, text, key)
        if self.double_post and key is not None:
            self._land(channel, text, key)
        if self.world.fires("slack_lost_answer", 0.02):
            raise SlackError("timed out", error="timeout", outcome_unknown=True)
        return ref

    def find(self, channel: str, key: str, *, since: datetime) -> MessageRef | None:
        if not self.world.slack_up(self.clock()):
            raise SlackError("Slack is unreachable", error="unreachable")
        for posted in self.posts:
            if posted.channel == channel and posted.key == key:
                return MessageRef(channel=channel, ts=posted.ts)
        return None

    def update(self, ref: MessageRef, text: str, blocks: Sequence[dict[str, Any]] = ()) -> None:
        if not self.world.slack_up(self.clock()):
            raise SlackError("Slack is unreachable", error="unreachable")

    def upload_file(self, channel: str, filename: str, content: bytes, **_: Any) -> None:
        if not self.world.slack_up(self.clock()):
            raise SlackError("Slack is unreachable", error="unreachable")

    def _land(self, channel: str, text: str, key: str | None) -> MessageRef:
        self._ts += 1
        ts = f"{self._ts}.000100"
        self.posts.append(Posted(channel, text, key, ts))
        return MessageRef(channel=channel, ts=ts)


@dataclass
class Machine:
    """One machine as the platform keeps it: billed per second while not ended."""

    provider_id: str
    price_per_s: int
    started_at: datetime
    ended_at: datetime | None = None
    ended_by: str = ""


class SimCloud:
    """The platform: instances billed per second from start to end, an API that answers 5xx,
    loses answers after acting, serves a proxy's catch-all 404 and rate limits, and machines
    ended behind the bot's back."""

    name = PLATFORM
    capabilities = ProviderCapabilities(
        can_stop=False,
        storage_bills_when_stopped=False,
        billing_increment="second",
        min_charge_s=0,
        can_launch=False,
    )

    def __init__(self, world: World, clock: SimClock) -> None:
        self.world = world
        self.clock = clock
        self.machines: dict[str, Machine] = {}

    def bill_micros(self, machine: Machine, until: datetime) -> int:
        end = min(machine.ended_at or until, until)
        return max(0, int((end - machine.started_at).total_seconds())) * machine.price_per_s

    def list_instances(self) -> list[ProviderInstance]:
        self._answering("list")
        return [self._record(m) for m in self.machines.values()]

    def get(self, provider_id: str) -> ProviderInstance:
        self._answering("get")
        machine = self.machines.get(provider_id)
        if machine is None:
            raise ProviderNotFound(f"{provider_id} not found")
        return self._record(machine)

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        now = self.clock()
        self._answering("release")
        machine = self.machines.get(provider_id)
        if machine is None:
            raise ProviderNotFound(f"{provider_id} not found")
        if machine.ended_at is None and self.world.fires("platform_operation_lock", 0.02):
            self.world.log(now, f"[{_box(provider_id)}] the platform is busy with it (409)")
            raise ProviderError(
                "release: 409 another operation is in progress on this instance", retryable=True
            )
        if machine.ended_at is None:
            machine.ended_at = now
            machine.ended_by = "bot"
            self.world.log(now, f"[{_box(provider_id)}] ended on the platform by the bot")
        if self.world.fires("platform_lost_answer", 0.05):
            self.world.log(now, f"[{_box(provider_id)}] the release's answer was lost")
            raise ProviderUnknownOutcome("timed out after sending", status=None)
        return ReleaseOutcome(provider_id, mode, confirmed=True, state="terminated")

    def price(self, instance_type: str) -> int | None:
        return None

    def instance_types(self) -> list[InstanceTypeInfo]:
        return []

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        raise no_launch(self.name)

    def _answering(self, call: str) -> None:
        now = self.clock()
        if not self.world.platform_up(now):
            raise ProviderError(f"{call}: 503 Service Unavailable", retryable=True)
        if self.world.fires("platform_error", 0.03):
            raise ProviderError(f"{call}: 500 Internal Server Error", retryable=True)
        if self.world.fires("platform_catch_all_404", 0.02):
            raise ProviderUnknownOutcome(
                f"{call}: a 404 page that is not the platform's", status=404
            )
        if self.world.fires("platform_429", 0.01):
            raise ProviderRateLimited(f"{call}: 429 Too Many Requests")

    def _record(self, machine: Machine) -> ProviderInstance:
        ended = machine.ended_at
        return ProviderInstance(
            provider_id=machine.provider_id,
            state="terminated" if ended else "running",
            raw_state="terminated" if ended else "running",
            ended_at=ended,
        )


class SimFleet:
    """The agents' answers: a status with a busy GPU, or a host that hangs or drops the
    connection, a GPU gone idle, one slowed down by heat, or one missing from the answer."""

    closed = False

    def __init__(self, world: World) -> None:
        self.world = world

    def fan_out(self, targets: Sequence[Target], fn: object, **_: Any) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        world = self.world
        for target in targets:
            if world.fires("ssh_hang", 0.02):
                answers[target.name] = FleetError("no answer", instance=target.name)
            elif world.fires("ssh_drop", 0.005):
                answers[target.name] = Unreachable("connection reset", instance=target.name)
            elif world.fires("gpu_idle", 0.01):
                answers[target.name] = make_status(n=1, util_gpu_pct=0)
            elif world.fires("gpu_overheat", 0.005):
                answers[target.name] = make_status(
                    n=1,
                    util_gpu_pct=85,
                    temp_c=94,
                    clock_event_reasons=("hw_thermal_slowdown",),
                )
            elif world.fires("gpu_gone", 0.003):
                answers[target.name] = make_status(gpus=[])
            else:
                answers[target.name] = make_status(n=1, util_gpu_pct=85, clock_event_reasons=())
        return answers

    def forget(self, name: str) -> None:
        return None


class SimClock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


# --- the team ------------------------------------------------------------------------------


@dataclass
class Rental:
    instance_id: int
    owner: str
    habit: str
    provider_id: str
    exempt: bool = False
    #: An admin set a lifetime cap on it (nobody but an admin may extend past it).
    capped: bool = False


@dataclass
class Team:
    people: dict[str, str]  # Slack id -> habit
    rentals: list[Rental] = field(default_factory=list)
    #: What the admin and the people did besides answering warnings, by kind.
    actions: Counter[str] = field(default_factory=Counter)
    #: Attempts on someone else's instance that were not refused or that changed it.
    unauthorised: list[str] = field(default_factory=list)


class ErrorCount(logging.Handler):
    """Counts what the bot logged as an error (each one is a finding to look at)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.messages: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages[record.getMessage()[:160]] += 1


def run(args: argparse.Namespace) -> tuple[dict[str, Any], list[str], Counter[str]]:
    """Simulate ``args.days`` days and return the report's JSON object."""
    started = time.perf_counter()
    errors = ErrorCount()
    root = logging.getLogger()
    root.handlers = [errors]
    root.setLevel(logging.WARNING)
    rng = random.Random(args.seed)
    world = World(rng=random.Random(rng.random()))
    start = args.start
    clock = SimClock(start)
    plan = _fault_plan(rng, args.days, args.tick_s)
    breaks = frozenset(args.breaks or ())
    with _store(args.store) as db, _broken(breaks):
        slack = SimSlack(world, clock, double_post="double_post" in breaks)
        cloud = SimCloud(world, clock)
        fleet = SimFleet(world)
        rt = _runtime(db, clock, slack, cloud, fleet, args.tick_s)
        team = _team(rng, args.people)
        for _ in range(args.instances):
            _rent(rt, team, cloud, rng, clock.now, world)
        _admin_acts(rt, team, rng, clock.now, world, count=2)
        end = start + timedelta(days=args.days)
        answered: set[int] = set()
        step = 0
        while clock.now < end:
            world.due.update(plan.get(step, ()))
            step += 1
            _faults(world, clock)
            _behind_the_back(world, cloud, clock.now)
            if world.fires("process_kill", 0.0005):
                world.log(clock.now, "bot process killed and restarted")
                _close(rt)
                rt = _runtime(db, clock, slack, cloud, fleet, args.tick_s)
            if rng.random() < 0.004 and len(team.rentals) < args.instances * 3:
                _rent(rt, team, cloud, rng, clock.now, world)
            if rng.random() < 0.003:
                _admin_acts(rt, team, rng, clock.now, world, count=1)
            if rng.random() < 0.003:
                _switch_language(rt, team, rng, clock.now, world)
            if step == 2 or rng.random() < 0.01:
                _not_theirs(rt, team, rng, clock.now, world)
            _people_act(rt, team, rng, clock.now, answered, world)
            try:
                tick(rt, clock.now)
            except GpubotError as exc:
                world.log(clock.now, f"tick failed: {exc}")
            clock.now += timedelta(seconds=args.tick_s)
        _close(rt)
        figures = _invariants(
            db, rt.settings, team, cloud, slack, world, start, clock.now, args.tick_s
        )
    report = {
        "seed": args.seed,
        "days": args.days,
        "start": f"{start:%Y-%m-%d}",
        "people": args.people,
        "instances": len(team.rentals),
        "jobs": 0,
        "store": args.store,
        "faults": dict(sorted(world.faults.items())),
        "actions": dict(sorted(team.actions.items())),
        **figures,
        "errors_logged": sum(errors.messages.values()),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    return report, world.trace, errors.messages


def _runtime(
    db: Database, clock: SimClock, slack: SimSlack, cloud: SimCloud, fleet: Any, tick_s: int
) -> Runtime:
    settings = Settings(
        admins=frozenset({ADMIN}),
        channel=OPS,
        tick_interval_s=tick_s,
        poll_interval_s=300,
        instance_networks=("public", "127.0.0.0/8"),
    )
    return Runtime(
        settings=settings,
        db=db,
        fleet=fleet,
        providers=ProviderRegistry([ManualProvider(), cloud]),
        notifier=slack,
        clock=clock,
        executor=ThreadPoolExecutor(max_workers=1),
        render=render,
        render_files=render_files,
    )


def _close(rt: Runtime) -> None:
    executor = rt.executor
    if isinstance(executor, ThreadPoolExecutor):
        executor.shutdown(wait=True)


@contextmanager
def _store(kind: str) -> Iterator[Database]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="team-month-") as tmp:
            db = Database(f"sqlite:///{tmp}/gpubot.db")
            db.migrate()
            try:
                yield db
            finally:
                db.dispose()
        return
    name = f"team_month_{uuid.uuid4().hex[:12]}"
    admin = create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        db = Database(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}")
        db.migrate()
        try:
            yield db
        finally:
            db.dispose()
    finally:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _team(rng: random.Random, people: int) -> Team:
    return Team(people={f"UP{n:03d}": rng.choice(HABITS) for n in range(people)})


def _rent(
    rt: Runtime, team: Team, cloud: SimCloud, rng: random.Random, now: datetime, world: World
) -> None:
    """A person rents a machine on the platform and registers it with a deadline."""
    owner = rng.choice(sorted(team.people))
    number = len(team.rentals)
    provider_id = f"sim-{number:05d}"
    price_per_s = rng.choice(PRICES_PER_S)
    cloud.machines[provider_id] = Machine(provider_id, price_per_s, started_at=now)
    deadline = now + timedelta(minutes=rng.choice((45, 90, 180, 360, 720)))
    with rt.db.session() as session:
        if session.get(Person, owner) is None:
            session.add(Person(slack_id=owner))
            session.flush()
        inst = Instance(
            name=f"box{number}",
            owner_id=owner,
            state="active",
            host="127.0.0.1",
            port=30_000 + number,
            ssh_user="root",
            price_micros=price_per_s * 3600,
            gpu_model="H100",
            gpu_count=1,
            provider=PLATFORM,
            provider_instance_id=provider_id,
            billing_increment="second",
            min_charge_s=0,
            billing_from="created",
            created_at=now,
            deadline_at=deadline,
        )
        session.add(inst)
        session.flush()
        assert inst.id is not None
        team.rentals.append(Rental(inst.id, owner, team.people[owner], provider_id))
    world.log(
        now,
        f"[{_box(provider_id)}] rented by {owner} at {price_per_s * 3600} per hour, "
        f"deadline {deadline:%m-%d %H:%M}",
    )


def _fault_plan(rng: random.Random, days: float, tick_s: int) -> dict[int, list[str]]:
    """Each kind of fault at one seeded step of the first day (of the run, when shorter):
    the kind fires at its first chance from then on, so that every kind happens at least once
    in a run of a day or more."""
    steps = max(1, int(min(days, 1.0) * 0.8 * 86_400 / tick_s))
    plan: dict[int, list[str]] = defaultdict(list)
    for kind in FAULT_KINDS:
        plan[rng.randrange(steps)].append(kind)
    return dict(plan)


def _faults(world: World, clock: SimClock) -> None:
    now = clock.now
    rng = world.rng
    if world.slack_up(now) and world.fires("slack_outage", 0.002):
        length = timedelta(minutes=rng.choice((5, 20, 60, 180)))
        world.slack_down_until = now + length
        world.slack_outages.append((now, now + length))
        world.log(now, f"Slack down for {length}")
    if world.platform_up(now) and world.fires("platform_outage", 0.001):
        length = timedelta(minutes=rng.choice((5, 15, 45)))
        world.platform_down_until = now + length
        world.platform_outages.append((now, now + length))
        world.log(now, f"platform down for {length}")
    if world.fires("clock_jump", 0.0003):
        clock.now += timedelta(hours=1)
        world.suspensions.append((now, clock.now))
        world.log(now, "host suspended for an hour")


def _behind_the_back(world: World, cloud: SimCloud, now: datetime) -> None:
    """Now and then the platform ends a running machine on its own (a spot reclaim, someone
    in its console): the bot must notice and stop its meter when the platform says."""
    running = sorted(m.provider_id for m in cloud.machines.values() if m.ended_at is None)
    if not running or not world.fires("ended_on_platform", 0.002):
        return
    machine = cloud.machines[world.rng.choice(running)]
    machine.ended_at = now
    machine.ended_by = "platform"
    world.log(now, f"[{_box(machine.provider_id)}] ended on the platform behind the bot's back")


def _live(rt: Runtime, team: Team) -> list[tuple[Rental, Instance]]:
    """The rentals whose instance is active now, with the instance as stored."""
    with rt.db.session() as session:
        rows = session.exec(select(Instance).where(Instance.state == "active")).all()
        by_id = {row.id: row for row in rows}
        for row in rows:
            session.expunge(row)
    return [(r, by_id[r.instance_id]) for r in team.rentals if r.instance_id in by_id]


def _admin_acts(
    rt: Runtime, team: Team, rng: random.Random, now: datetime, world: World, *, count: int
) -> None:
    """The admin sets a monthly budget for a person, or caps the lifetime of a running
    instance some hours from now (past the warnings' window, so that they can go out)."""
    admin = Caller(ADMIN)
    for _ in range(count):
        try:
            if rng.random() < 0.5:
                person = rng.choice(sorted(team.people))
                limit = rng.choice(BUDGETS_MICROS)
                budgets.set_budget(rt, admin, "user", person, limit)
                team.actions["budget_set"] += 1
                world.log(now, f"the admin sets {person}'s budget to {limit}")
                continue
            live = _live(rt, team)
            if not live:
                continue
            rental, inst = rng.choice(live)
            lived = now - inst.created_at
            lifetime = lived + timedelta(hours=rng.choice((2, 4, 8)))
            deadlines.set_lifetime_cap(rt, admin, inst.name, lifetime)
            rental.capped = True
            team.actions["lifetime_cap"] += 1
            world.log(now, f"[{_box(rental.provider_id)}] the admin caps it at {lifetime}")
        except GpubotError as exc:
            world.log(now, f"the admin was refused: {type(exc).__name__}")


def _switch_language(
    rt: Runtime, team: Team, rng: random.Random, now: datetime, world: World
) -> None:
    """Someone switches the language the bot speaks to them in (`/gpu lang`)."""
    person = rng.choice(sorted(team.people))
    language = rng.choice(("zh", "en", "中文"))
    people.set_language(rt, Caller(person), language)
    team.actions["language_switch"] += 1
    world.log(now, f"{person} switches to {language}")


def _not_theirs(rt: Runtime, team: Team, rng: random.Random, now: datetime, world: World) -> None:
    """Someone tries to extend, or release, a running instance that is not theirs (by its
    name, or with the button of a warning posted to its owner): the bot must refuse with
    NotAuthorized and change nothing."""
    live = _live(rt, team)
    if not live:
        return
    rental, inst = rng.choice(live)
    others = sorted(p for p in team.people if p != rental.owner)
    if not others:
        return
    stranger = Caller(rng.choice(others))
    assert inst.id is not None
    before = _snapshot(rt, inst.id)
    how = rng.choice(("extend", "release", "answer"))
    prompt_id = _open_warning(rt, inst.id) if how == "answer" else None
    if how == "answer" and prompt_id is None:
        return
    team.actions[f"not_theirs_{how}"] += 1
    refused = ""
    try:
        if how == "extend":
            lifecycle.extend(rt, stranger, inst.name, timedelta(hours=2))
        elif how == "release":
            releases.release_now(rt, stranger, inst.id)
        elif prompt_id is not None:
            answers.extend(rt, stranger, prompt_id, timedelta(hours=2))
    except NotAuthorized:
        refused = "NotAuthorized"
    except GpubotError as exc:
        refused = type(exc).__name__
    after = _snapshot(rt, inst.id)
    world.log(
        now, f"[{inst.name}] {stranger.user_id} tries to {how} it: {refused or 'not refused'}"
    )
    if refused != "NotAuthorized":
        team.unauthorised.append(
            f"{inst.name}: {stranger.user_id} could {how} it "
            f"({refused or 'not refused'}), it is {rental.owner}'s"
        )
    elif after != before:
        team.unauthorised.append(
            f"{inst.name}: {stranger.user_id} was refused to {how} it, yet it changed: "
            f"{before} -> {after}"
        )


def _snapshot(rt: Runtime, instance_id: int) -> tuple[object, ...]:
    """What a stranger's attempt must leave as it was."""
    with rt.db.session() as session:
        inst = session.get(Instance, instance_id)
        assert inst is not None
        opened = session.exec(select(Release.id).where(Release.instance_id == instance_id)).all()
        resolved = session.exec(
            select(Prompt.id).where(
                Prompt.instance_id == instance_id, col(Prompt.resolved_at).is_not(None)
            )
        ).all()
        return (
            inst.state,
            inst.deadline_at,
            inst.lifetime_cap_at,
            len(opened),
            len(resolved),
        )


def _open_warning(rt: Runtime, instance_id: int) -> int | None:
    with rt.db.session() as session:
        return session.exec(
            select(Prompt.id).where(
                Prompt.instance_id == instance_id,
                Prompt.kind == deadlines.KIND_WARNING,
                col(Prompt.resolved_at).is_(None),
            )
        ).first()


def _people_act(
    rt: Runtime,
    team: Team,
    rng: random.Random,
    now: datetime,
    answered: set[int],
    world: World,
) -> None:
    """Each person answers the warnings posted to them, by habit."""
    with rt.db.session() as session:
        open_warnings = session.exec(
            select(Prompt.id, Prompt.recipient, Prompt.instance_id).where(
                Prompt.kind == deadlines.KIND_WARNING,
                col(Prompt.resolved_at).is_(None),
                col(Prompt.first_attempt_at).is_not(None),
            )
        ).all()
    habits = {r.instance_id: r for r in team.rentals}
    for prompt_id, recipient, instance_id in open_warnings:
        if prompt_id is None or prompt_id in answered:
            continue
        rental = habits.get(instance_id)
        if rental is None or recipient != rental.owner:
            continue
        answered.add(prompt_id)
        _answer(rt, rental, prompt_id, rng, world, now)


def _answer(
    rt: Runtime, rental: Rental, prompt_id: int, rng: random.Random, world: World, now: datetime
) -> None:
    caller = Caller(rental.owner)
    habit = rental.habit
    world.log(
        now, f"[{_box(rental.provider_id)}] {rental.owner} ({habit}) reads warning {prompt_id}"
    )
    try:
        if habit == "extender" and rng.random() < 0.8:
            answers.extend(rt, caller, prompt_id, timedelta(hours=1))
            rental.exempt = True
        elif habit == "double_clicker":
            answers.extend(rt, caller, prompt_id, timedelta(hours=1))
            answers.extend(rt, caller, prompt_id, timedelta(hours=1))
            world.faults["double_click"] += 1
            rental.exempt = True
        elif habit == "early_releaser":
            releases.release_now(rt, caller, rental.instance_id)
        elif habit == "late_clicker" and rng.random() < 0.5:
            answers.extend(rt, caller, prompt_id, timedelta(minutes=30))
            rental.exempt = True
    except GpubotError as exc:
        world.log(now, f"{rental.owner} answering {prompt_id}: {type(exc).__name__}")


@contextmanager
def _broken(breaks: frozenset[str]) -> Iterator[None]:
    """Break the bot on purpose for this run (the harness's own test): ``skip_warning`` makes
    deadline warnings vanish while the release clock believes they went out; ``drop_charge``
    never charges the first instance's first hour."""
    if "drop_charge" in breaks:
        with _dropping_a_charge():
            yield
        return
    if "skip_warning" not in breaks:
        yield
        return
    ensure, first_sent = prompts.ensure_prompt, deadlines._first_warning_sent

    def no_warning(session: Any, **fields: Any) -> Any:
        if fields.get("kind") == deadlines.KIND_WARNING:
            return None
        return ensure(session, **fields)

    setattr(prompts, "ensure_prompt", no_warning)  # noqa: B010
    setattr(deadlines, "_first_warning_sent", lambda *_: datetime(2000, 1, 1))  # noqa: B010
    try:
        yield
    finally:
        setattr(prompts, "ensure_prompt", ensure)  # noqa: B010
        setattr(deadlines, "_first_warning_sent", first_sent)  # noqa: B010


@contextmanager
def _dropping_a_charge() -> Iterator[None]:
    totals = billing.compute_totals

    def forgetful(instance: Any, seconds: int, *, final: bool) -> tuple[int, int]:
        billed_s, micros = totals(instance, seconds, final=final)
        if instance.id == 1 and seconds >= 3600:
            micros -= billing.metered_cost(billing.rules_for(instance), 3600)
        return billed_s, micros

    setattr(billing, "compute_totals", forgetful)  # noqa: B010
    try:
        yield
    finally:
        setattr(billing, "compute_totals", totals)  # noqa: B010


# --- the promise ---------------------------------------------------------------------------


def _invariants(
    db: Database,
    settings: Settings,
    team: Team,
    cloud: SimCloud,
    slack: SimSlack,
    world: World,
    start: datetime,
    now: datetime,
    tick_s: int,
) -> dict[str, Any]:
    violations: list[str] = []
    paid_past = 0
    unwarned = 0
    with db.session() as session:
        instances = {i.id: i for i in session.exec(select(Instance)).all()}
        released = session.exec(
            select(Release).where(Release.reason == "deadline", Release.state == "confirmed")
        ).all()
        posted_warnings = session.exec(
            select(Prompt.instance_id, Prompt.first_attempt_at).where(
                Prompt.kind == deadlines.KIND_WARNING
            )
        ).all()
    warned_at: dict[int, list[datetime]] = defaultdict(list)
    for instance_id, at in posted_warnings:
        if at is not None:
            warned_at[instance_id].append(at)
    for rental in team.rentals:
        inst = instances[rental.instance_id]
        machine = cloud.machines[rental.provider_id]
        deadline = deadlines.effective_deadline(inst)
        if deadline is None or (rental.exempt and not deadline.capped):
            continue
        limit = _release_limit(deadline.at, settings, world, tick_s)
        end = machine.ended_at or now
        if end > limit:
            excused = _overlap(limit, end, world.platform_outages + world.suspensions)
            past_s = int((end - limit).total_seconds()) - excused
            if past_s > 0:
                paid_past += past_s * machine.price_per_s
                violations.append(
                    f"{inst.name}: billed {past_s} s past its "
                    f"{'lifetime cap' if deadline.capped else 'deadline'} "
                    f"{deadline.at:%m-%d %H:%M} and the notice window"
                )
    for release in released:
        if release.instance_id is None or warned_at.get(release.instance_id):
            continue
        if _slack_was_down(world, release.requested_at):
            continue
        unwarned += 1
        name = instances[release.instance_id].name
        violations.append(f"{name}: released at its deadline without a warning")
    keyed = Counter((p.channel, p.key) for p in slack.posts if p.key is not None)
    doubled = sum(n - 1 for n in keyed.values() if n > 1)
    if doubled:
        violations.append(f"{doubled} messages posted twice")
    tz = settings.tz()
    month = ledger.month_of(start, tz)
    month_end = ledger.month_bounds(month, tz)[1]
    until = min(now, month_end)
    platform_total = sum(cloud.bill_micros(m, until) for m in cloud.machines.values())
    bot_total = spend.month_total_micros(db, month, tz=tz, now=until)
    gap = abs(bot_total - platform_total)
    if gap:
        violations.append(
            f"month {month}: the bot says {bot_total} micro-units, the platform billed "
            f"{platform_total}"
        )
    machines = Counter(
        (i.host, i.port) for i in instances.values() if i.state in ("active", "stopped")
    )
    doubles = sum(1 for n in machines.values() if n > 1)
    if doubles:
        violations.append(f"{doubles} machines with two live registrations")
    money = _money_agrees(db, settings, team, cloud, slack, world, start, now)
    violations.extend(money.pop("violations"))
    violations.extend(team.unauthorised)
    return {
        "violations": violations,
        **money,
        "unauthorised_changes": len(team.unauthorised),
        "paid_past_warning_micros": paid_past,
        "unwarned_releases": unwarned,
        "doubled_messages": doubled,
        "digest_vs_platform_micros": gap,
        "double_registrations": doubles,
        "bot_month_micros": bot_total,
        "platform_month_micros": platform_total,
    }


def _release_limit(
    deadline_at: datetime, settings: Settings, world: World, tick_s: int
) -> datetime:
    """The latest a machine may bill to after its deadline: the notice window and two ticks,
    moved by the documented rules when the world stood in the way. A host suspended over the
    warnings' time warns once it resumes, and releases a notice window after (never without
    warning); a platform outage over the release time leaves the release retrying on its
    doubling back-off, whose last step is at most the outage's length (at most
    ``BACKOFF_MAX_S``) after the platform answers again."""
    notice = timedelta(seconds=min(o for o in settings.warning_offsets_s if o > 0))
    first_warning = timedelta(seconds=max(settings.warning_offsets_s))
    ticks = timedelta(seconds=2 * tick_s)
    limit = deadline_at + notice + ticks
    moved = True
    while moved:
        moved = False
        for a, b in world.suspensions:
            if a <= limit and b >= deadline_at - first_warning and b + notice + ticks > limit:
                limit, moved = b + notice + ticks, True
        for a, b in world.platform_outages:
            back_off = min(b - a, timedelta(seconds=releases.BACKOFF_MAX_S))
            if a <= limit and b >= deadline_at and b + back_off + ticks > limit:
                limit, moved = b + back_off + ticks, True
    return limit


def _money_agrees(
    db: Database,
    settings: Settings,
    team: Team,
    cloud: SimCloud,
    slack: SimSlack,
    world: World,
    start: datetime,
    now: datetime,
) -> dict[str, Any]:
    """Status, spend (for the admin: every instance), each person's spend and the digest of
    each month that closed, against what the platform billed, to the micro-unit."""
    tz = settings.tz()
    violations: list[str] = []
    months = _months(start, now, tz)
    reports = {
        month: spend.spend_report(
            db,
            month,
            by="user",
            tz=tz,
            now=now,
            idle_threshold_pct=settings.idle_threshold_pct,
            currency=settings.currency,
        )
        for month in months
    }
    with db.session() as session:
        instances = {i.id: i for i in session.exec(select(Instance)).all()}
        shown = {
            rental.instance_id: costs.since_registered_micros(instances[rental.instance_id], now)
            for rental in team.rentals
        }
    status_gap = 0
    for rental in team.rentals:
        billed = cloud.bill_micros(cloud.machines[rental.provider_id], now)
        gap = abs(shown[rental.instance_id] - billed)
        if gap:
            status_gap += gap
            violations.append(
                f"{_box(rental.provider_id)}: status shows {shown[rental.instance_id]} "
                f"micro-units, the platform billed {billed}"
            )
    owners: Counter[str] = Counter()
    for month, report in reports.items():
        lo, hi = ledger.month_bounds(month, tz)
        by_instance = {item.instance_id: item.total_micros for item in report.instances}
        for rental in team.rentals:
            machine = cloud.machines[rental.provider_id]
            billed = _billed_between([machine], cloud, lo, min(hi, now))
            said = by_instance.get(rental.instance_id, 0)
            if said != billed:
                status_gap += abs(said - billed)
                violations.append(
                    f"{_box(rental.provider_id)}: spend of {month} says {said} micro-units, "
                    f"the platform billed {billed}"
                )
        for item in report.instances:
            owners[item.owner_id] += item.total_micros
    owner_of = {r.provider_id: r.owner for r in team.rentals}
    platform_by_owner: Counter[str] = Counter()
    for machine in cloud.machines.values():
        platform_by_owner[owner_of[machine.provider_id]] += cloud.bill_micros(machine, now)
    owner_gap = 0
    for owner in sorted(set(owners) | set(platform_by_owner)):
        gap = abs(owners[owner] - platform_by_owner[owner])
        if gap:
            owner_gap += gap
            violations.append(
                f"{owner}: their spend is {owners[owner]} micro-units, the platform billed "
                f"{platform_by_owner[owner]} for their machines"
            )
    digest_gap = 0
    missing = 0
    closed = [m for m in months if ledger.month_bounds(m, tz)[1] <= now]
    for month in closed:
        lo, hi = ledger.month_bounds(month, tz)
        data = digest.build_digest(
            db,
            month,
            tz=tz,
            now=now,
            idle_threshold_pct=settings.idle_threshold_pct,
            currency=settings.currency,
        )
        billed = _billed_between(cloud.machines.values(), cloud, lo, hi)
        gap = abs(data.report.total_micros - billed)
        if gap:
            digest_gap += gap
            violations.append(
                f"digest of {month}: {data.report.total_micros} micro-units, the platform "
                f"billed {billed}"
            )
        # The outbox queues the digest under its own key and posts it marked with its row.
        with db.session() as session:
            queued = session.exec(
                select(OutboxMessage.id).where(OutboxMessage.key == f"digest:{month}:{OPS}")
            ).first()
        due = digest.digest_due_at(month, tz)
        posted = queued is not None and any(p.key == f"outbox:{queued}" for p in slack.posts)
        if not posted and _slack_up_for(world, due, now, timedelta(hours=1)):
            missing += 1
            violations.append(f"digest of {month}: not posted although Slack was up")
    return {
        "violations": violations,
        "status_vs_platform_micros": status_gap,
        "per_owner_vs_platform_micros": owner_gap,
        "closed_digest_vs_platform_micros": digest_gap,
        "closed_months": len(closed),
        "digests_missing": missing,
        "spend_micros_by_month": {m: r.total_micros for m, r in reports.items()},
    }


def _months(start: datetime, now: datetime, tz: Any) -> list[str]:
    """The months (``YYYY-MM`` in ``tz``) from ``start``'s to ``now``'s."""
    months = [ledger.month_of(start, tz)]
    last = ledger.month_of(now, tz)
    while months[-1] < last:
        months.append(ledger.next_month(months[-1]))
    return months


def _billed_between(
    machines: Iterable[Machine], cloud: SimCloud, lo: datetime, hi: datetime
) -> int:
    """What the platform billed for ``machines``' seconds in [lo, hi)."""
    return sum(cloud.bill_micros(m, hi) - cloud.bill_micros(m, lo) for m in machines)


def _slack_up_for(world: World, due: datetime, now: datetime, span: timedelta) -> bool:
    """Whether Slack was up for ``span`` without a break between ``due`` and ``now``."""
    moments = sorted([due] + [b for a, b in world.slack_outages if due <= b <= now])
    for at in moments:
        if at + span > now:
            return False
        if not any(a <= at < b or at < a < at + span for a, b in world.slack_outages):
            return True
    return False


def _box(provider_id: str) -> str:
    """The instance's name for the platform's id (``sim-00003`` is ``box3``)."""
    return f"box{int(provider_id.rsplit('-', 1)[1])}"


def _first_trace(trace: Sequence[str], violations: Sequence[str], limit: int) -> list[str]:
    """The events that lead to the first violation that names an instance (else the first):
    its instance's own, and the faults of the world (untagged lines) before its last one."""
    named = [v for v in violations if v.startswith("box")]
    first = (named or list(violations))[0]
    name = first.split(":", 1)[0]
    own = [i for i, line in enumerate(trace) if f"[{name}]" in line]
    if not own:
        return list(trace[-limit:])
    lines = [line for line in trace[: own[-1] + 1] if f"[{name}]" in line or "[" not in line]
    return lines[-limit:]


def _overlap(start: datetime, end: datetime, spans: Sequence[tuple[datetime, datetime]]) -> int:
    total = 0
    for a, b in spans:
        lo, hi = max(a, start), min(b, end)
        if hi > lo:
            total += int((hi - lo).total_seconds())
    return total


def _slack_was_down(world: World, at: datetime | None) -> bool:
    if at is None:
        return False
    window = timedelta(hours=1)
    return any(a - window <= at <= b + window for a, b in world.slack_outages)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--days", type=float, default=3)
    parser.add_argument("--people", type=int, default=10)
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument(
        "--start",
        type=_day,
        default=START,
        help="the first day, YYYY-MM-DD (UTC midnight); near a month's end to cross it",
    )
    parser.add_argument("--tick-s", type=int, default=TICK_S, help="the clock's step, seconds")
    parser.add_argument("--break", dest="breaks", action="append", choices=BREAKS)
    parser.add_argument("--trace", type=int, default=30, help="trace lines shown on failure")
    parser.add_argument(
        "--quick", action="store_true", help="half a day, 4 people, 6 instances (make bench)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.days, args.people, args.instances = 0.5, 4, 6
    return args


def _day(text: str) -> datetime:
    return datetime.combine(date.fromisoformat(text), datetime.min.time())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report, trace, logged = run(args)
    print(f"team month: seed {args.seed}, {args.days} days, {report['instances']} instances")
    for kind, count in report["faults"].items():
        print(f"  fault {kind}: {count}")
    for kind, count in report["actions"].items():
        print(f"  action {kind}: {count}")
    for name in (
        "paid_past_warning_micros",
        "unwarned_releases",
        "doubled_messages",
        "digest_vs_platform_micros",
        "double_registrations",
        "status_vs_platform_micros",
        "per_owner_vs_platform_micros",
        "closed_digest_vs_platform_micros",
        "digests_missing",
        "unauthorised_changes",
    ):
        print(f"  {name}: {report[name]}")
    for message, count in logged.most_common(10):
        print(f"  logged {count}x: {message}")
    for violation in report["violations"]:
        print(f"  VIOLATION {violation}")
    if report["violations"]:
        print("  the events that led to the first violation:")
        for line in _first_trace(trace, report["violations"], args.trace):
            print(f"    {line}")
    # For bench/run_all.py's table: the violations found, against none allowed.
    summary = {
        "bench": "team_month",
        "figure": "violations",
        "ratio": float(len(report["violations"])),
        "goal": 0.0,
        "met": not report["violations"],
    }
    print(json.dumps({**report, **summary}, sort_keys=True))
    return 0 if not report["violations"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
