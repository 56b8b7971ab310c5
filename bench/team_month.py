"""A team's month, simulated: the real store, the real clock's ``tick(now)`` and the real
services, with stand-ins only at the outside edges (Slack's Web API, the platform's API, the
agents' status), all misbehaving on a seeded schedule; the product's promise is checked at the
end as figures and a list of violations.

    python bench/team_month.py --seed 7 --days 3 [--people 10 --instances 40
        --store sqlite|postgresql] [--break skip_warning|double_post|drop_charge]

What it drives: each instance is a machine on the stand-in platform ``simcloud`` (billed per
second, from its start until the platform itself ends it), registered to one person with a
deadline; people behave by habit (some extend at each warning, some click twice, some never
answer, some release early); the clock advances one tick interval at a time and calls
``tick(now)``, so warnings, releases, retries, reconciliation, the ledger and the outbox run as
they do in the bot. Faults: Slack outages, answers lost after the post landed, 429s; platform
5xx answers, lost answers after the platform acted, catch-all HTML 404s (unknown outcomes),
instances ended on the platform behind the bot's back; bot restarts (a new runtime on the same
store: every in-memory state is lost); the clock jumping (a host suspended for an hour).

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

The JSON line holds ``seed``, ``days``, ``people``, ``instances``, ``jobs`` (0: jobs are not
simulated yet), ``faults`` (counts by kind), ``violations``, the figures above and ``wall_s``;
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
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
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
    ProviderError,
    ProviderNotFound,
    ProviderRateLimited,
    ProviderUnknownOutcome,
    SlackError,
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
from bot.services import answers, deadlines, ledger, prompts, releases, spend  # noqa: E402
from bot.services.access import Caller  # noqa: E402
from bot.services.tick import tick  # noqa: E402
from bot.settings import Settings  # noqa: E402
from bot.store.db import Database  # noqa: E402
from bot.store.models import Instance, Person, Prompt, Release  # noqa: E402
from tests.agents.factories import make_status  # noqa: E402

PLATFORM = "simcloud"
START = datetime(2027, 3, 1, 0, 0, 0)  # naive UTC, the first of a month
ADMIN = "UADMIN"
OPS = "COPS"
#: The clock's step by default, in seconds (GPUBOT_TICK_INTERVAL_S; the bot's default is 60).
TICK_S = 300
HABITS = ("extender", "silent", "double_clicker", "early_releaser", "late_clicker")
#: Prices per hour in whole micro-units per second (x 3600), as a rate card might list them.
PRICES_PER_S = (550, 275, 1_000, 2_200, 125)
#: Test-only switches that break the build on purpose (the harness must catch each).
BREAKS = ("skip_warning", "double_post", "drop_charge")


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
    trace: list[str] = field(default_factory=list)

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
        roll = self.world.rng.random()
        if roll < 0.02:
            self.world.faults["slack_429"] += 1
            raise SlackError("ratelimited", error="ratelimited")
        ref = self._land(channel, text, key)
        if self.double_post and key is not None:
            self._land(channel, text, key)
        if roll > 0.98:
            self.world.faults["slack_lost_answer"] += 1
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
        if machine.ended_at is None:
            machine.ended_at = now
            machine.ended_by = "bot"
            self.world.log(now, f"[{_box(provider_id)}] ended on the platform by the bot")
        if self.world.rng.random() < 0.05:
            self.world.faults["platform_lost_answer"] += 1
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
        roll = self.world.rng.random()
        if roll < 0.03:
            self.world.faults["platform_error"] += 1
            raise ProviderError(f"{call}: 500 Internal Server Error", retryable=True)
        if roll < 0.05:
            self.world.faults["platform_catch_all_404"] += 1
            raise ProviderUnknownOutcome(
                f"{call}: a 404 page that is not the platform's", status=404
            )
        if roll < 0.06:
            self.world.faults["platform_429"] += 1
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
    """The agents' answers: a status with a busy GPU, or a host that does not answer."""

    closed = False

    def __init__(self, world: World) -> None:
        self.world = world

    def fan_out(self, targets: Sequence[Target], fn: object, **_: Any) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        for target in targets:
            if self.world.rng.random() < 0.02:
                self.world.faults["ssh_hang"] += 1
                answers[target.name] = FleetError("no answer", instance=target.name)
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


@dataclass
class Team:
    people: dict[str, str]  # Slack id -> habit
    rentals: list[Rental] = field(default_factory=list)


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
    clock = SimClock(START)
    breaks = frozenset(args.breaks or ())
    with _store(args.store) as db, _broken(breaks):
        slack = SimSlack(world, clock, double_post="double_post" in breaks)
        cloud = SimCloud(world, clock)
        fleet = SimFleet(world)
        rt = _runtime(db, clock, slack, cloud, fleet, args.tick_s)
        team = _team(rng, args.people)
        for _ in range(args.instances):
            _rent(rt, team, cloud, rng, clock.now, world)
        end = START + timedelta(days=args.days)
        answered: set[int] = set()
        while clock.now < end:
            _faults(world, rng, clock)
            _behind_the_back(world, rng, cloud, clock.now)
            if rng.random() < 0.0005:
                world.faults["process_kill"] += 1
                world.log(clock.now, "bot process killed and restarted")
                _close(rt)
                rt = _runtime(db, clock, slack, cloud, fleet, args.tick_s)
            if rng.random() < 0.004 and len(team.rentals) < args.instances * 3:
                _rent(rt, team, cloud, rng, clock.now, world)
            _people_act(rt, team, rng, clock.now, answered, world)
            try:
                tick(rt, clock.now)
            except GpubotError as exc:
                world.log(clock.now, f"tick failed: {exc}")
            clock.now += timedelta(seconds=args.tick_s)
        _close(rt)
        figures = _invariants(db, rt.settings, team, cloud, slack, world, clock.now, args.tick_s)
    report = {
        "seed": args.seed,
        "days": args.days,
        "people": args.people,
        "instances": len(team.rentals),
        "jobs": 0,
        "store": args.store,
        "faults": dict(sorted(world.faults.items())),
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


def _faults(world: World, rng: random.Random, clock: SimClock) -> None:
    now = clock.now
    if world.slack_up(now) and rng.random() < 0.002:
        length = timedelta(minutes=rng.choice((5, 20, 60, 180)))
        world.slack_down_until = now + length
        world.slack_outages.append((now, now + length))
        world.faults["slack_outage"] += 1
        world.log(now, f"Slack down for {length}")
    if world.platform_up(now) and rng.random() < 0.001:
        length = timedelta(minutes=rng.choice((5, 15, 45)))
        world.platform_down_until = now + length
        world.platform_outages.append((now, now + length))
        world.faults["platform_outage"] += 1
        world.log(now, f"platform down for {length}")
    if rng.random() < 0.0003:
        clock.now += timedelta(hours=1)
        world.faults["clock_jump"] += 1
        world.log(now, "host suspended for an hour")


def _behind_the_back(world: World, rng: random.Random, cloud: SimCloud, now: datetime) -> None:
    """Now and then the platform ends a running machine on its own (a spot reclaim, someone
    in its console): the bot must notice and stop its meter when the platform says."""
    if rng.random() >= 0.002:
        return
    running = sorted(m.provider_id for m in cloud.machines.values() if m.ended_at is None)
    if not running:
        return
    machine = cloud.machines[rng.choice(running)]
    machine.ended_at = now
    machine.ended_by = "platform"
    world.faults["ended_on_platform"] += 1
    world.log(now, f"[{_box(machine.provider_id)}] ended on the platform behind the bot's back")


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
    now: datetime,
    tick_s: int,
) -> dict[str, Any]:
    violations: list[str] = []
    notice = timedelta(seconds=min(o for o in settings.warning_offsets_s if o > 0))
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
        if rental.exempt or inst.deadline_at is None:
            continue
        limit = inst.deadline_at + notice + timedelta(seconds=2 * tick_s)
        end = machine.ended_at or now
        if end > limit:
            excused = _overlap(limit, end, world.platform_outages)
            past_s = int((end - limit).total_seconds()) - excused
            if past_s > 0:
                paid_past += past_s * machine.price_per_s
                violations.append(
                    f"{inst.name}: billed {past_s} s past its deadline "
                    f"{inst.deadline_at:%m-%d %H:%M} and the notice window"
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
    month = ledger.month_of(START, settings.tz())
    month_end = (
        ledger.month_start_utc(START.year, START.month + 1, settings.tz())
        if (START.month < 12)
        else ledger.month_start_utc(START.year + 1, 1, settings.tz())
    )
    until = min(now, month_end)
    platform_total = sum(cloud.bill_micros(m, until) for m in cloud.machines.values())
    bot_total = spend.month_total_micros(db, month, tz=settings.tz(), now=until)
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
    return {
        "violations": violations,
        "paid_past_warning_micros": paid_past,
        "unwarned_releases": unwarned,
        "doubled_messages": doubled,
        "digest_vs_platform_micros": gap,
        "double_registrations": doubles,
        "bot_month_micros": bot_total,
        "platform_month_micros": platform_total,
    }


def _box(provider_id: str) -> str:
    """The instance's name for the platform's id (``sim-00003`` is ``box3``)."""
    return f"box{int(provider_id.rsplit('-', 1)[1])}"


def _first_trace(trace: Sequence[str], violations: Sequence[str], limit: int) -> list[str]:
    """The events that lead to the first violation: its instance's own, and the faults of the
    world (untagged lines) before its last one."""
    first = violations[0]
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report, trace, logged = run(args)
    print(f"team month: seed {args.seed}, {args.days} days, {report['instances']} instances")
    for kind, count in report["faults"].items():
        print(f"  fault {kind}: {count}")
    for name in (
        "paid_past_warning_micros",
        "unwarned_releases",
        "doubled_messages",
        "digest_vs_platform_micros",
        "double_registrations",
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
