"""The team of the team-month simulation: people with habits who rent machines on the stand-in
platform and register them with deadlines, answer (or ignore) the bot's warnings, run jobs
with ``--gpus``, retries and ``--release-when-done`` and cancel the ones that hang; an admin
who sets budgets and caps; people who switch language, and try what is not theirs."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlmodel import col, select

from bench.sim.agents import FATES, SIM_FLAG, SimFleet
from bench.sim.front import SlackFront
from bench.sim.platforms import Platforms
from bench.sim.processes import Killed
from bench.sim.world import World, box_name
from bot.blocks import deadlines as deadline_blocks
from bot.errors import GpubotError, NotAuthorized
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import answers, deadlines, lifecycle, policies, releases
from bot.services.jobs import runs
from bot.services.money import budgets
from bot.services.speaking import people
from bot.store.models import Instance, Job, Person, Prompt, Release

ADMIN = "UADMIN"
#: Where people type their commands.
TEAM_CHANNEL = "CTEAM"
HABITS = ("extender", "silent", "double_clicker", "early_releaser", "late_clicker")
#: Prices per hour in whole micro-units per second (x 3600), as a rate card might list them.
PRICES_PER_S = (550, 275, 1_000, 2_200, 125)
#: GPUs per machine.
GPU_COUNTS = (1, 2, 4, 8)
#: Budgets the admin sets for a person, per month, in micro-units (tight to generous).
BUDGETS_MICROS = (5_000_000, 50_000_000, 500_000_000)
#: ``--gpus`` as people write it (None: not given); ``7`` is refused on smaller machines.
GPU_REQUESTS = (None, None, "auto", "any:1", "0", "any:2", "all", "none", "7")
#: A job's fate (agents.FATES) by weight, and how long one attempt runs, in seconds.
FATE_WEIGHTS = (70, 12, 10, 8)
RUN_S = (120, 600, 1_800, 3_600, 4 * 3_600)
#: The share of answers, jobs and attempts on what is not theirs that people send through
#: Slack (signed requests to the Bolt app) rather than through the services directly.
VIA_SLACK = 0.5
#: A job running this long is suspected of hanging; its owner may cancel it.
HUNG_AFTER = timedelta(hours=2)


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
    #: Jobs people asked for, and how the bot answered (``taken``, ``refused``, ...).
    jobs_asked: Counter[str] = field(default_factory=Counter)
    #: The Bolt app of the process Slack's requests reach now (None: none is served).
    front: SlackFront | None = None


def make_team(rng: random.Random, people: int) -> Team:
    return Team(people={f"UP{n:03d}": rng.choice(HABITS) for n in range(people)})


def rent(
    rt: Runtime,
    team: Team,
    cloud: Platforms,
    fleet: SimFleet,
    rng: random.Random,
    now: datetime,
    world: World,
) -> None:
    """A person rents a machine in a platform's console and registers it with a deadline, with
    the price and disks the platform reports for it."""
    owner = rng.choice(sorted(team.people))
    number = len(team.rentals)
    price_per_s = rng.choice(PRICES_PER_S)
    gpu_count = rng.choice(GPU_COUNTS)
    platform = cloud.pick(rng)
    provider_id = platform.open(price_per_s, 30_000 + number, now).provider_id
    host, port = platform.ssh_address(provider_id, 30_000 + number)
    registered = platform.registration(price_per_s)
    billing = platform.capabilities.billing
    name = box_name(provider_id)
    deadline = now + timedelta(minutes=rng.choice((45, 90, 180, 360, 720)))
    with rt.db.session() as session:
        if session.get(Person, owner) is None:
            session.add(Person(slack_id=owner))
            session.flush()
        inst = Instance(
            name=name,
            owner_id=owner,
            state="active",
            host=host,
            port=port,
            ssh_user="root",
            price_micros=registered.price_micros_per_hour,
            currency=platform.currency,
            gpu_model="H100",
            gpu_count=gpu_count,
            provider=platform.name,
            provider_instance_id=provider_id,
            billing_increment=billing.increment,
            min_charge_s=billing.min_charge_s,
            billing_from=billing.billing_from,
            disk_gb=registered.disk_gb,
            storage_micros_per_gb_month=registered.storage_micros_per_gb_month,
            created_at=now,
            # As `/gpu register` stores it: the machine answered SSH when it was registered.
            ssh_ready_at=now,
            deadline_at=deadline,
        )
        session.add(inst)
        session.flush()
        assert inst.id is not None
        team.rentals.append(Rental(inst.id, owner, team.people[owner], provider_id))
    fleet.add_host(name, provider_id, gpu_count)
    world.log(
        now,
        f"[{box_name(provider_id)}] rented on {platform.name} by {owner} at "
        f"{price_per_s * 3600} per hour, "
        f"deadline {deadline:%m-%d %H:%M}",
    )


def live(rt: Runtime, team: Team) -> list[tuple[Rental, Instance]]:
    """The rentals whose instance is active now, with the instance as stored."""
    with rt.db.session() as session:
        rows = session.exec(
            select(Instance).where(Instance.state == "active").order_by(col(Instance.id))
        ).all()
        by_id = {row.id: row for row in rows}
        for row in rows:
            session.expunge(row)
    return [(r, by_id[r.instance_id]) for r in team.rentals if r.instance_id in by_id]


def admin_acts(
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
            running = live(rt, team)
            if not running:
                continue
            rental, inst = rng.choice(running)
            lived = now - inst.created_at
            lifetime = lived + timedelta(hours=rng.choice((2, 4, 8)))
            policies.set_lifetime_cap(rt, admin, inst.name, lifetime)
            rental.capped = True
            team.actions["lifetime_cap"] += 1
            world.log(now, f"[{box_name(rental.provider_id)}] the admin caps it at {lifetime}")
        except GpubotError as exc:
            world.log(now, f"the admin was refused: {type(exc).__name__}")


def switch_language(
    rt: Runtime, team: Team, rng: random.Random, now: datetime, world: World
) -> None:
    """Someone switches the language the bot speaks to them in (`/gpu lang`)."""
    person = rng.choice(sorted(team.people))
    language = rng.choice(("zh", "en", "中文"))
    people.set_language(rt, Caller(person), language)
    team.actions["language_switch"] += 1
    world.log(now, f"{person} switches to {language}")


def not_theirs(rt: Runtime, team: Team, rng: random.Random, now: datetime, world: World) -> None:
    """Someone tries to extend, or release, a running instance that is not theirs (by its
    name, or with the button of a warning posted to its owner): the bot must refuse with
    NotAuthorized and change nothing."""
    running = live(rt, team)
    if not running:
        return
    rental, inst = rng.choice(running)
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
    front = team.front if rng.random() < VIA_SLACK else None
    if front is not None:
        _not_theirs_in_slack(front, stranger.user_id, inst.name, how, prompt_id)
        after = _snapshot(rt, inst.id)
        world.log(now, f"[{inst.name}] {stranger.user_id} tries to {how} it through Slack")
        if after != before:
            team.unauthorised.append(
                f"{inst.name}: {stranger.user_id} could {how} it through Slack, it is "
                f"{rental.owner}'s: {before} -> {after}"
            )
        return
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


def _not_theirs_in_slack(
    front: SlackFront, stranger: str, name: str, how: str, prompt_id: int | None
) -> None:
    """The stranger's attempt as Slack sends it: `/gpu extend`, `/gpu release`, or a click of
    the owner's warning's buttons (a forged "confirm release" among them)."""
    if how == "extend":
        front.command(stranger, f"extend {name} 2h", TEAM_CHANNEL)
    elif how == "release":
        front.command(stranger, f"release {name}", TEAM_CHANNEL)
    elif prompt_id is not None:
        front.click(stranger, deadline_blocks.EXTEND_1H, str(prompt_id), TEAM_CHANNEL)
        front.click(stranger, deadline_blocks.RELEASE_CONFIRM, str(prompt_id), TEAM_CHANNEL)


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
            select(Prompt.id)
            .where(
                Prompt.instance_id == instance_id,
                Prompt.kind == deadlines.KIND_WARNING,
                col(Prompt.resolved_at).is_(None),
            )
            .order_by(col(Prompt.id))
        ).first()


def people_act(
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
            select(Prompt.id, Prompt.recipient, Prompt.instance_id)
            .where(
                Prompt.kind == deadlines.KIND_WARNING,
                col(Prompt.resolved_at).is_(None),
                col(Prompt.first_attempt_at).is_not(None),
            )
            .order_by(col(Prompt.id))
        ).all()
    habits = {r.instance_id: r for r in team.rentals}
    for prompt_id, recipient, instance_id in open_warnings:
        if prompt_id is None or prompt_id in answered:
            continue
        rental = habits.get(instance_id)
        if rental is None or recipient != rental.owner:
            continue
        answered.add(prompt_id)
        _answer(rt, team, rental, prompt_id, rng, world, now)


def _answer(
    rt: Runtime,
    team: Team,
    rental: Rental,
    prompt_id: int,
    rng: random.Random,
    world: World,
    now: datetime,
) -> None:
    """The owner answers a warning by habit: through the bot's services, or (a share of
    them, :data:`VIA_SLACK`) by clicking its buttons or typing `/gpu extend` as Slack sends
    them to the Bolt app; a double clicker's two clicks are two signed requests."""
    caller = Caller(rental.owner)
    habit = rental.habit
    front = team.front if rng.random() < VIA_SLACK else None
    how = "through Slack" if front is not None else "directly"
    world.log(
        now,
        f"[{box_name(rental.provider_id)}] {rental.owner} ({habit}) reads warning "
        f"{prompt_id} and answers {how}",
    )
    if front is not None:
        before = _deadline_of(rt, rental.instance_id)
        _answer_in_slack(front, rental, prompt_id, rng)
        if _deadline_of(rt, rental.instance_id) != before:
            rental.exempt = True
        return
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


def _answer_in_slack(front: SlackFront, rental: Rental, prompt_id: int, rng: random.Random) -> None:
    owner, habit, value = rental.owner, rental.habit, str(prompt_id)
    if habit == "extender" and rng.random() < 0.8:
        front.click(owner, deadline_blocks.EXTEND_1H, value, owner)
    elif habit == "double_clicker":
        front.click(owner, deadline_blocks.EXTEND_1H, value, owner)
        front.click(owner, deadline_blocks.EXTEND_1H, value, owner)
        front.sent["double_click"] += 1
    elif habit == "early_releaser":
        front.click(owner, deadline_blocks.RELEASE_NOW, value, owner)
        front.click(owner, deadline_blocks.RELEASE_CONFIRM, value, owner)
    elif habit == "late_clicker" and rng.random() < 0.5:
        front.command(owner, f"extend {box_name(rental.provider_id)} 30m", TEAM_CHANNEL)


def _deadline_of(rt: Runtime, instance_id: int) -> datetime | None:
    with rt.db.session() as session:
        inst = session.get(Instance, instance_id)
        return None if inst is None else inst.deadline_at


# --- jobs -----------------------------------------------------------------------------------


def jobs_this_step(rng: random.Random, per_step: float) -> int:
    """How many jobs people ask for in one step, ``per_step`` on average."""
    whole = int(per_step)
    return whole + (1 if rng.random() < per_step - whole else 0)


def run_job(rt: Runtime, team: Team, rng: random.Random, now: datetime, world: World) -> None:
    """The owner of a running instance runs a job on it (`/gpu run`), with ``--gpus`` as
    people write it, sometimes retries and ``--release-when-done``; its fate is in its
    command (bench.sim.agents)."""
    running = live(rt, team)
    if not running:
        return
    rental, inst = rng.choice(running)
    fate = rng.choices(FATES, weights=FATE_WEIGHTS)[0]
    run_s = rng.choice(RUN_S)
    gpus = rng.choice(GPU_REQUESTS)
    retries = rng.choice((0, 0, 0, 1, 2))
    when_done = rng.random() < 0.1
    command = ["python", "train.py", f"{SIM_FLAG}{fate}:{run_s}"]
    caller = Caller(rental.owner, channel_id=TEAM_CHANNEL)
    what = f"{fate} {run_s} s, --gpus {gpus}, --retries {retries}"
    if when_done:
        what += ", --release-when-done"
    front = team.front if rng.random() < VIA_SLACK else None
    if front is not None:
        flags = f" --gpus {gpus}" if gpus is not None else ""
        flags += f" --retries {retries}" if retries else ""
        flags += " --release-when-done" if when_done else ""
        # Counted before it is sent: the process serving it may die while it takes the job.
        team.jobs_asked["through_slack"] += 1
        world.log(now, f"[{inst.name}] {rental.owner} runs a job ({what}) through Slack")
        front.command(rental.owner, f"run {inst.name}{flags} -- {' '.join(command)}", TEAM_CHANNEL)
        return
    try:
        result = runs.submit(rt, caller, inst.name, command, gpus, retries, when_done)
    except Killed:
        team.jobs_asked["killed_while_taken"] += 1
        world.log(now, f"[{inst.name}] {rental.owner} runs a job ({what}): the bot died meanwhile")
        raise
    except GpubotError as exc:
        team.jobs_asked[type(exc).__name__] += 1
        world.log(now, f"[{inst.name}] {rental.owner} runs a job ({what}): {type(exc).__name__}")
        return
    team.jobs_asked["taken"] += 1
    world.log(now, f"[{inst.name}] {rental.owner} runs job {result.job.id} ({what})")


def cancel_hung(rt: Runtime, team: Team, rng: random.Random, now: datetime, world: World) -> None:
    """Someone whose job has run past :data:`HUNG_AFTER` cancels it (`/gpu cancel`); a
    double clicker cancels it twice (the second is refused: it has finished)."""
    with rt.db.session() as session:
        rows = session.exec(
            select(Job.id, Job.requested_by, Job.instance_id).where(
                Job.state == "running", col(Job.started_at) < now - HUNG_AFTER
            )
        ).all()
    if not rows:
        return
    job_id, owner, _instance_id = rng.choice(sorted(rows, key=lambda r: r[0] or 0))
    times = 2 if team.people.get(owner) == "double_clicker" else 1
    for _ in range(times):
        try:
            runs.cancel(rt, Caller(owner, channel_id=TEAM_CHANNEL), str(job_id))
            team.actions["job_cancel"] += 1
            world.log(now, f"{owner} cancels job {job_id}")
        except GpubotError as exc:
            world.log(now, f"{owner} cancels job {job_id}: {type(exc).__name__}")
