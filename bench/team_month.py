"""A team's month, simulated: the real store, the real clock's ``tick(now)``, the real services
and the real Bolt app, with stand-ins only at the outside edges (Slack's Web API, the
platform's API, the agents), all misbehaving on a seeded schedule; the product's promise is
checked at the end as figures and a list of violations.

    python bench/team_month.py --seed 7 --days 3 [--people 10 --instances 40 --jobs 50
        --store sqlite|postgresql --processes 2 --start 2027-03-30[T18:00]]
        [--break skip_warning|double_post|drop_charge|drop_reply]

What it drives: each instance is a machine rented on RunPod, Vast.ai or Lambda Cloud (the
default), on AWS EC2 (``aws``: moto behind a fault-injecting proxy), or, in a month counted in
yuan, on Compshare (``--platforms``; a deployment counts one currency, so the platforms of a
month bill in one; each a stand-in of the platform's API on loopback that bills on its own
clock as the platform does: RunPod and Vast compute and disks per second, Lambda per started
minute from its health checks, EC2 per second with a minute at least per start, Compshare per
started hour, from the machine's start until the platform itself ends it, RunPod's checking
every request against its v2 OpenAPI document), registered to one person with a deadline,
and every call the bot makes to a platform goes through the bot's own client for it over HTTP
(bench/sim/platforms.py); people
behave by habit (some extend at each warning, some click twice, some never answer, some release
early); an admin sets monthly budgets and lifetime caps; people switch language now and then,
and try to extend or release machines that are not theirs; people run jobs (`/gpu run`:
``--jobs``, 500 in 30 days by default, scaled by the days; someone without a running machine
rents one first) with ``--gpus``, retries and ``--release-when-done``, on agents that answer the
job commands as ``gpu-agent`` does (bench/sim/agents.py: jobs that succeed, fail out of memory,
fail once and are retried, hang until their owner cancels them, or are lost with their host),
and the clock's job poll notices their end and replies. Half of the answers to warnings, of the
jobs and of the attempts on what is not theirs go as Slack sends them: signed slash commands and
button clicks dispatched to the real Bolt app of the process that serves Slack
(bench/sim/front.py; a double click is two signed requests); the rest call the services
directly. The clock advances one tick interval at a time and calls ``tick(now)`` in every bot
process, so warnings, releases, retries, reconciliation, the ledger, the bills and the outbox
run as they do in the bot.

Faults: Slack outages, answers lost after the post landed, posts that land up to a minute and a
half after the bot gave up on them, 429s; the platforms answering 500, 503 through an outage, a
proxy's catch-all HTML 404 page, 429s (RunPod's own, with Retry-After, and plain text without),
a 409 while RunPod has a pod locked, and dropping the connection after a DELETE was done (the
404 page and the dropped answer are unknown outcomes to the bot); machines terminated in the
platform's console behind the bot's back; bot processes killed (``process_kill``: ``kill -9``
mid-post, mid-release, or between calls; a new process on the same store takes its place, every
in-memory state lost; see bench/sim/processes.py), with two processes on the store by default on
PostgreSQL; the clock jumping (a host suspended for an hour: what the machines bill meanwhile is
excused); SSH hosts that hang or drop (a ``run`` whose answer is lost after the job was queued
among them); hosts that reboot (their jobs lost) or whose agent forgets its jobs; GPUs that go
idle, overheat or disappear from the agent's answer. Each kind of fault (``FAULT_KINDS``) is
also scheduled once at a seeded moment of the first day, so that every kind fires in any run of
a day or more.

Invariants, each a figure in the last line's JSON object:
- ``paid_past_warning_micros``: what the platform billed past an instance's last deadline plus
  the bot's notice window (the time a release may take: ``notice_s``) while the platform took
  calls, for instances nobody exempted. It counts an admin's lifetime cap even on instances
  their owners extended: nobody but an admin may extend past it.
- ``unwarned_releases``: deadline releases with no warning posted before, where Slack was up.
- ``doubled_messages``: messages the bot posted on its own twice (same key, same recipient).
- ``digest_vs_platform_micros``: |the month's total as the bot reports it (spend) - what the
  platform billed| summed over the month's instances, at the last whole hour (the ledger
  charges whole hours). Prices are whole micro-units per second, so no rounding rule
  separates the two. The documented rule for a difference, here and in every money figure
  below: neither platform says when a machine ended (a terminated one is gone), so the bot may
  meter a machine past its end to the moment its platform first told the bot it was gone, and
  no further (``told_late_micros``; a meter stopped at any other moment is a violation).
- ``double_registrations``: machines with two live registrations.
- ``status_vs_platform_micros``: per instance, |what `/gpu status` shows it cost since it was
  registered - what the platform billed for its machine|, plus per month, |the month's total as
  `/gpu spend` reports it - what the platform billed in that month|.
- ``per_owner_vs_platform_micros``: per person, |their instances' spend summed over the run's
  months - the platform's bill for their machines|.
- ``closed_digest_vs_platform_micros``: for each month that closed during the run, |the
  digest's total - the platform's bill for the month|; and the digest must have been posted
  (``digests_missing``) when Slack was up for an hour after it was due.
- ``home_vs_spend_micros`` and ``home_vs_platform_micros``: per person, |this month's spend on
  their Home - their total in `/gpu spend`|, and |the same - what the platform billed their
  machines this month| (bench/sim/views.py).
- ``bills_vs_platform_micros``: per machine on `/gpu bills` of the month, |the bot's side -
  the platform's published bill| + |the published bill - what the platform billed|; the
  documented rule for a difference: the bills cover whole UTC days, to the start of today.
- ``unauthorised_changes``: attempts by someone other than the owner (or an admin) to extend
  or release an instance that were not refused with NotAuthorized, or that changed it.
- ``jobs_without_one_reply``: jobs the bot took that ended with no completion reply although
  Slack was up for an hour after, or with two; jobs replied to before they ended; and jobs
  that ended on their host an hour before the run's end (or were forgotten by it) that the
  bot still has unfinished.
- ``store_inconsistencies``: what the store's own check (bench/sim/processes.py) found after
  each kill and at the end: two live registrations of a machine, two open releases of an
  instance, compute charges that overlap or leave a gap, unknown outbox states; at the end,
  releases, posts or job replies claimed by a lease long expired.

The JSON line holds ``seed``, ``days``, ``start``, ``people``, ``instances``, ``jobs`` (the jobs
the bot took; ``jobs_by_state``, and ``jobs_asked``: how the bot answered each ask), ``store``,
``processes``, ``faults`` (counts by kind), ``actions`` (what the admin and the people did
besides answering warnings), ``slack_requests`` (signed requests by kind and the app's HTTP
status), one object per platform (``runpod``, ``vast``: its answers by HTTP status, ``lost`` for
those dropped; how many were checked against its published document, and how many did not fit:
each one a violation), ``violations``, the figures above and ``wall_s``; the same seed gives the
same line but ``wall_s``, on PostgreSQL with two processes too: the bot's steps take the rows due
in id order (an unordered read there follows the heap, which updates and vacuum reorder), and
the processes tick one after the other, each waiting for its Slack work to end. Exit status 0
only without violations.

The parts live in bench/sim/: the world outside the bot (world.py), the platforms (platforms.py,
runpod.py, vast.py), the agents and their jobs (agents.py), the team (team.py), Slack's side of
people's requests (front.py), the bot's processes and the store's check (processes.py), and the
promise (promise.py, views.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402

from bench.sim.agents import SimFleet  # noqa: E402
from bench.sim.aws import AwsCloud  # noqa: E402
from bench.sim.compshare import CompshareCloud  # noqa: E402
from bench.sim.front import BOT_TOKEN, SlackFront  # noqa: E402
from bench.sim.lambda_cloud import LambdaCloud  # noqa: E402
from bench.sim.platforms import PlatformCloud, Platforms, currency_of  # noqa: E402
from bench.sim.processes import (  # noqa: E402
    Doom,
    Killed,
    ProcessCloud,
    ProcessSlack,
    doom,
    store_consistent,
)
from bench.sim.promise import first_trace, invariants  # noqa: E402
from bench.sim.runpod import RunpodCloud  # noqa: E402
from bench.sim.team import (  # noqa: E402
    ADMIN,
    TEAM_CHANNEL,
    Team,
    admin_acts,
    cancel_hung,
    jobs_this_step,
    live,
    make_team,
    not_theirs,
    people_act,
    rent,
    run_job,
    switch_language,
)
from bench.sim.vast import VastCloud  # noqa: E402
from bench.sim.views import views_agree  # noqa: E402
from bench.sim.world import (  # noqa: E402
    FAULT_KINDS,
    OPS,
    ErrorCount,
    SimClock,
    SimSlack,
    World,
    box_name,
)
from bot import billing  # noqa: E402
from bot.blocks import render, render_files  # noqa: E402
from bot.errors import GpubotError  # noqa: E402
from bot.executor import BotExecutor  # noqa: E402
from bot.local_slack import LocalSlack  # noqa: E402
from bot.providers.manual import ManualProvider  # noqa: E402
from bot.providers.registry import ProviderRegistry  # noqa: E402
from bot.runtime import Runtime  # noqa: E402
from bot.services.instances import deadlines  # noqa: E402
from bot.services.jobs import runs  # noqa: E402
from bot.services.speaking import prompts  # noqa: E402
from bot.services.tick import tick  # noqa: E402
from bot.settings import Settings  # noqa: E402
from bot.store.db import Database  # noqa: E402
from bot.store.models import Job  # noqa: E402

__all__ = ["FAULT_KINDS", "main", "parse_args", "run"]

#: The run's first moment by default (naive UTC, the first of a month); ``--start`` moves it.
START = datetime(2027, 3, 1, 0, 0, 0)
#: The clock's step by default, in seconds (GPUBOT_TICK_INTERVAL_S; the bot's default is 60).
TICK_S = 300
#: Jobs people run in a 30-day month by default (``--jobs`` scales with ``--days``).
JOBS_PER_MONTH = 500
#: Faults that need a running machine (or a busy host) to happen at all.
EARLY_KINDS = frozenset({"ended_on_platform", "job_host_reboot", "job_store_wiped"})
#: The platforms people rent from (bench/sim/platforms.py), by provider name.
PLATFORMS: dict[str, type[PlatformCloud]] = {
    "runpod": RunpodCloud,
    "vast": VastCloud,
    "lambda": LambdaCloud,
    "compshare": CompshareCloud,
    "aws": AwsCloud,
}
#: The platforms of a month by default: those billing in dollars.
DEFAULT_PLATFORMS = ("runpod", "vast", "lambda")
#: Test-only switches that break the build on purpose (the harness must catch each).
BREAKS = ("skip_warning", "double_post", "drop_charge", "drop_reply")


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
    steps = max(1, int(args.days * 86_400 / args.tick_s))
    jobs_per_step = args.jobs / steps
    channels = {TEAM_CHANNEL: "team", OPS: "ops"}
    sent: Counter[str] = Counter()
    local = LocalSlack(token=BOT_TOKEN, channels=channels)
    with (
        _store(args.store) as db,
        _broken(breaks),
        local,
        Platforms(world, clock, [PLATFORMS[name] for name in args.platforms]) as cloud,
    ):
        slack = SimSlack(world, clock, double_post="double_post" in breaks)
        fleet = SimFleet(world, clock, cloud)
        procs = [
            _spawn(db, clock, slack, cloud, fleet, args.tick_s, n + 1, local, sent)
            for n in range(args.processes)
        ]
        rt = procs[0].rt
        team = make_team(rng, args.people)
        for person in (*team.people, ADMIN):
            local.add_user(person, person.lower())
        for _ in range(args.instances):
            rent(rt, team, cloud, fleet, rng, clock.now, world)
        admin_acts(rt, team, rng, clock.now, world, count=2)
        end = start + timedelta(days=args.days)
        answered: set[int] = set()
        inconsistent: list[str] = []
        step = 0
        while clock.now < end:
            world.due.update(plan.get(step, ()))
            step += 1
            _faults(world, clock)
            _behind_the_back(world, cloud, clock.now)
            fleet.misbehave(clock.now)
            if world.fires("process_kill", 0.002):
                victim = procs[world.rng.randrange(len(procs))]
                where = doom(world, victim.doom)
                victim.doomed_at = step
                world.log(clock.now, f"bot process {victim.number} will be killed at its {where}")
            rt = procs[0].rt  # the process Slack's requests reach
            team.front = procs[0].front
            with suppress(Killed):
                _team_acts(
                    rt, team, (cloud, fleet), rng, world, args, jobs_per_step, answered, step
                )
            # The processes take turns at ticking first, so that each claims its share of work.
            for proc in procs[step % 2 :] + procs[: step % 2]:
                try:
                    tick(proc.rt, clock.now)
                except GpubotError as exc:
                    world.log(clock.now, f"tick failed: {exc}")
                except Killed:
                    pass
            for index, proc in enumerate(procs):
                if proc.doom.fired or (proc.doomed_at and step - proc.doomed_at > 12):
                    how = "mid-call" if proc.doom.fired else "between calls"
                    world.log(clock.now, f"bot process {proc.number} killed {how} and restarted")
                    world.faults["process_kill_" + ("mid_call" if proc.doom.fired else "idle")] += 1
                    _close(proc.rt)
                    procs[index] = _spawn(
                        db, clock, slack, cloud, fleet, args.tick_s, proc.number, local, sent
                    )
                    for problem in store_consistent(db, clock.now):
                        inconsistent.append(f"after a kill at {clock.now:%m-%d %H:%M}: {problem}")
            clock.now += timedelta(seconds=args.tick_s)
        for proc in procs:
            _close(proc.rt)
        rt = procs[0].rt
        slack.land_everything()
        inconsistent += store_consistent(db, clock.now, final=True)
        figures = invariants(
            db, rt.settings, team, cloud, fleet, slack, world, start, clock.now, args.tick_s
        )
        seen = views_agree(rt, team, cloud, world, clock.now)
        figures["violations"].extend(seen.pop("violations"))
        figures.update(seen)
        figures["violations"].extend(f"store: {problem}" for problem in inconsistent)
        figures["violations"].extend(
            f"answered outside its published document: {problem}" for problem in cloud.problems()
        )
        figures.update({platform.name: platform.report() for platform in cloud.all})
        figures["store_inconsistencies"] = len(inconsistent)
    report = {
        "seed": args.seed,
        "days": args.days,
        "start": f"{start:%Y-%m-%d}" if start.hour == 0 else f"{start:%Y-%m-%dT%H:%M}",
        "people": args.people,
        "instances": len(team.rentals),
        "jobs_asked": dict(sorted(team.jobs_asked.items())),
        "store": args.store,
        "processes": args.processes,
        "currency": cloud.currency,
        "faults": dict(sorted(world.faults.items())),
        "actions": dict(sorted(team.actions.items())),
        "slack_requests": dict(sorted(sent.items())),
        **figures,
        "errors_logged": sum(errors.messages.values()),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    return report, world.trace, errors.messages


def _team_acts(
    rt: Runtime,
    team: Team,
    edges: tuple[Platforms, SimFleet],
    rng: random.Random,
    world: World,
    args: argparse.Namespace,
    jobs_per_step: float,
    answered: set[int],
    step: int,
) -> None:
    """What the team does in one step, through the process that serves Slack."""
    now = rt.now()
    most = args.instances * max(3, math.ceil(args.days))
    if rng.random() < 0.004 and len(team.rentals) < most:
        rent(rt, team, *edges, rng, now, world)
    if rng.random() < 0.003:
        admin_acts(rt, team, rng, now, world, count=1)
    if rng.random() < 0.003:
        switch_language(rt, team, rng, now, world)
    if step == 2 or rng.random() < 0.01:
        not_theirs(rt, team, rng, now, world)
    for _ in range(jobs_this_step(rng, jobs_per_step)):
        if not live(rt, team):  # someone rents a machine to run their job on
            if len(team.rentals) >= most:
                team.jobs_asked["no_machine"] += 1
                continue
            rent(rt, team, *edges, rng, now, world)
        run_job(rt, team, rng, now, world)
    if rng.random() < 0.05:
        cancel_hung(rt, team, rng, now, world)
    people_act(rt, team, rng, now, answered, world)


@dataclass
class Proc:
    """One bot process: its runtime, whether it is doomed, and since which step."""

    number: int
    rt: Runtime
    doom: Doom
    front: SlackFront
    doomed_at: int = 0


def _spawn(
    db: Database,
    clock: SimClock,
    slack: SimSlack,
    cloud: Platforms,
    fleet: SimFleet,
    tick_s: int,
    number: int,
    local: LocalSlack,
    sent: Counter[str],
) -> Proc:
    """A bot process on the store: its own executor, its own (killable) Slack and platform,
    and its Bolt app."""
    fate = Doom()
    platforms = [ProcessCloud(platform, fate) for platform in cloud.all]
    rt = _runtime(db, clock, ProcessSlack(slack, fate), platforms, fleet, tick_s, cloud.currency)
    return Proc(number, rt, fate, SlackFront(rt, local, sent))


def _runtime(
    db: Database,
    clock: SimClock,
    slack: Any,
    platforms: Sequence[Any],
    fleet: Any,
    tick_s: int,
    currency: str,
) -> Runtime:
    settings = Settings(
        admins=frozenset({ADMIN}),
        currency=currency,
        channel=OPS,
        tick_interval_s=tick_s,
        poll_interval_s=300,
        instance_networks=("public", "127.0.0.0/8"),
    )
    return Runtime(
        settings=settings,
        db=db,
        fleet=fleet,
        providers=ProviderRegistry([ManualProvider(), *platforms]),
        notifier=slack,
        clock=clock,
        executor=BotExecutor(1),
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


def _fault_plan(rng: random.Random, days: float, tick_s: int) -> dict[int, list[str]]:
    """Each kind of fault at one seeded step of the first day (of the run, when shorter):
    the kind fires at its first chance from then on, so that every kind happens at least once
    in a run of a day or more. The kinds that need a running machine or job
    (:data:`EARLY_KINDS`) come in the first quarter of that day, while the first rentals run."""
    plan: dict[int, list[str]] = defaultdict(list)
    for kind in FAULT_KINDS:
        share = 0.25 if kind in EARLY_KINDS else 0.8
        steps = max(1, int(min(days, 1.0) * share * 86_400 / tick_s))
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


def _behind_the_back(world: World, cloud: Platforms, now: datetime) -> None:
    """Now and then the platform ends a running machine on its own (a spot reclaim, someone
    in its console): the bot must notice and stop its meter when the platform says."""
    running = sorted(m.provider_id for m in cloud.machines.values() if m.ended_at is None)
    if not running or not world.fires("ended_on_platform", 0.002):
        return
    provider_id = world.rng.choice(running)
    cloud.end_outside(provider_id, now)
    world.log(now, f"[{box_name(provider_id)}] ended on the platform behind the bot's back")


@contextmanager
def _broken(breaks: frozenset[str]) -> Iterator[None]:
    """Break the bot on purpose for this run (the harness's own test): ``skip_warning`` makes
    deadline warnings vanish while the release clock believes they went out; ``drop_charge``
    never charges the first hour of the first instance to run one; ``drop_reply`` marks every
    third job replied without queueing its reply."""
    if "drop_charge" in breaks:
        with _dropping_a_charge():
            yield
        return
    if "drop_reply" in breaks:
        with _dropping_a_reply():
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
    forgotten: list[int] = []

    def forgetful(instance: Any, *args: Any, final: bool) -> tuple[int, int]:
        billed_s, micros = totals(instance, *args, final=final)
        if not forgotten and args[-1] >= 3600:
            forgotten.append(instance.id)
        if instance.id in forgotten and args[-1] >= 3600:
            micros -= billing.hourly_cost_micros(instance)
        return billed_s, micros

    setattr(billing, "compute_totals", forgetful)  # noqa: B010
    try:
        yield
    finally:
        setattr(billing, "compute_totals", totals)  # noqa: B010


@contextmanager
def _dropping_a_reply() -> Iterator[None]:
    queue = runs._queue_reply

    def forgetful(rt: Runtime, job_id: int, now: datetime) -> int | None:
        if job_id % 3 != 1:
            return queue(rt, job_id, now)
        with rt.db.session() as session:
            job = session.get(Job, job_id)
            if job is not None:
                job.replied_at = now
        return None

    setattr(runs, "_queue_reply", forgetful)  # noqa: B010
    try:
        yield
    finally:
        setattr(runs, "_queue_reply", queue)  # noqa: B010


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--days", type=float, default=3)
    parser.add_argument("--people", type=int, default=10)
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help=f"jobs people run (default {JOBS_PER_MONTH} per 30 days, scaled by --days)",
    )
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument(
        "--platforms",
        type=_platforms,
        default=DEFAULT_PLATFORMS,
        help=(
            f"the platforms people rent from, comma-separated, one currency: "
            f"{', '.join(PLATFORMS)} (default {','.join(DEFAULT_PLATFORMS)})"
        ),
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=None,
        help="bot processes on the store (default 2 on PostgreSQL, 1 on SQLite)",
    )
    parser.add_argument(
        "--start",
        type=_day,
        default=START,
        help="the first moment, YYYY-MM-DD (UTC midnight) or YYYY-MM-DDTHH:00 (a whole UTC "
        "hour); near a month's end to cross it",
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
    if args.processes is None:
        args.processes = 2 if args.store == "postgresql" else 1
    if args.jobs is None:
        args.jobs = round(JOBS_PER_MONTH * args.days / 30)
    return args


def _platforms(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(set(names) - set(PLATFORMS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"platforms are {', '.join(PLATFORMS)}; not {', '.join(unknown) or 'none'}"
        )
    try:
        currency_of([PLATFORMS[name] for name in names])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return names


def _day(text: str) -> datetime:
    """``YYYY-MM-DD`` (UTC midnight) or ``YYYY-MM-DDTHH:00`` (a whole UTC hour)."""
    try:
        if "T" not in text:
            return datetime.combine(date.fromisoformat(text), datetime.min.time())
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not YYYY-MM-DD or YYYY-MM-DDTHH:00") from exc
    if moment.tzinfo is not None or moment.minute or moment.second or moment.microsecond:
        raise argparse.ArgumentTypeError(f"{text!r}: start at a whole UTC hour, without a zone")
    return moment


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report, trace, logged = run(args)
    print(
        f"team month: seed {args.seed}, {args.days} days, {report['instances']} instances, "
        f"{report['jobs']} jobs"
    )
    for state, count in report["jobs_by_state"].items():
        print(f"  jobs {state}: {count}")
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
        "jobs_without_one_reply",
        "home_vs_spend_micros",
        "home_vs_platform_micros",
        "bills_vs_platform_micros",
        "told_late_micros",
    ):
        print(f"  {name}: {report[name]}")
    for name in args.platforms:
        platform = report[name]
        print(f"  {name} answered: {platform['answers_by_status']}")
        if platform["answers_checked"]:
            print(
                f"  {name} answers checked against its published document: "
                f"{platform['answers_checked']}, not fitting: {platform['answer_problems']}"
            )
    for message, count in logged.most_common(10):
        print(f"  logged {count}x: {message}")
    for violation in report["violations"]:
        print(f"  VIOLATION {violation}")
    if report["violations"]:
        print("  the events that led to the first violation:")
        for line in first_trace(trace, report["violations"], args.trace):
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
