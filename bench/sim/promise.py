"""The product's promise, checked at the end of a simulated month: each invariant a figure
(see bench/team_month.py's docstring), each breach a violation naming what broke it."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import select

from bench.sim.agents import SimFleet
from bench.sim.platforms import Platforms
from bench.sim.team import Team
from bench.sim.world import (
    OPS,
    Machine,
    SimSlack,
    World,
    box_name,
    overlap_s,
    slack_up_for,
    slack_was_down,
)
from bot.services.instances import deadlines, releases
from bot.services.jobs import runs
from bot.services.jobs.views import FINAL_STATES
from bot.services.money import costs, digest, ledger, spend
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import Instance, Job, OutboxMessage, Prompt, Release


def invariants(
    db: Database,
    settings: Settings,
    team: Team,
    cloud: Platforms,
    fleet: SimFleet,
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
    # Where each pod's meter stopped, against the moments RunPod told the bot it was gone.
    violations.extend(
        cloud.settle(
            {r.provider_id: instances[r.instance_id].released_at for r in team.rentals}, now
        )
    )
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
        failed = cloud.failed_calls[rental.provider_id]
        limit = _after_failed_calls(limit, deadline.at, failed, tick_s)
        end = machine.ended_at or now
        if end > limit:
            excused = overlap_s(limit, end, world.platform_outages + world.suspensions)
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
        if slack_was_down(world, release.requested_at):
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
    # The ledger charges whole hours: the month's total is compared at the last hour's end.
    until = min(now.replace(minute=0, second=0, microsecond=0), month_end)
    platform_total = sum(cloud.bill_micros(m, until) for m in cloud.machines.values())
    unseen = cloud.unseen_end_micros(until)
    # An hourly platform's hour is rounded in the bot's ledger once its session ends.
    meter_end = {r.provider_id: instances[r.instance_id].released_at for r in team.rentals}
    unrounded = sum(
        cloud.by_name[m.platform].unrounded_micros(m, until, meter_end.get(m.provider_id))
        for m in cloud.machines.values()
    )
    bot_total = spend.month_total_micros(db, month, tz=tz, now=until)
    gap = abs(bot_total - platform_total - unseen + unrounded)
    if gap:
        violations.append(
            f"month {month}: the bot says {bot_total} micro-units, the platform billed "
            f"{platform_total} and told the bot of ends late by {unseen}, less {unrounded} "
            "of hours not yet rounded"
        )
    machines = Counter(
        (i.host, i.port) for i in instances.values() if i.state in ("active", "stopped")
    )
    doubles = sum(1 for n in machines.values() if n > 1)
    if doubles:
        violations.append(f"{doubles} machines with two live registrations")
    money = _money_agrees(db, settings, team, cloud, slack, world, start, now)
    violations.extend(money.pop("violations"))
    jobs = jobs_answered(db, fleet, slack, world, now)
    violations.extend(jobs.pop("violations"))
    violations.extend(team.unauthorised)
    return {
        "violations": violations,
        **money,
        **jobs,
        "unauthorised_changes": len(team.unauthorised),
        "paid_past_warning_micros": paid_past,
        "unwarned_releases": unwarned,
        "doubled_messages": doubled,
        "digest_vs_platform_micros": gap,
        "double_registrations": doubles,
        "bot_month_micros": bot_total,
        "platform_month_micros": platform_total,
        "told_late_micros": unseen,
        "unrounded_micros": unrounded,
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


def _after_failed_calls(
    limit: datetime, deadline_at: datetime, failed: Sequence[tuple[datetime, bool]], tick_s: int
) -> datetime:
    """``limit`` moved by the documented back-off (bot.services.instances.releases) after each
    call about the machine that the platform failed from its deadline on, while the limit had
    not passed: the longest wait the back-off allows after the n-th failure is its doubling step
    (``BACKOFF_BASE_S`` * 2^(n-1), at most ``BACKOFF_MAX_S``), and a busy machine's 409, where
    the wait starts over, the first step; then the tick that follows the wait, and the one in
    which the release call is made (as the notice window's limit allows two ticks). A wait
    longer than that is the bot's."""
    ticks = timedelta(seconds=2 * tick_s)
    failures = 0
    for at, busy in sorted(failed):
        if at < deadline_at:
            continue
        if at > limit:
            break
        failures += 1
        doubled = releases.BACKOFF_BASE_S * 2 ** (failures - 1)
        step_s = releases.BACKOFF_BASE_S if busy else min(doubled, releases.BACKOFF_MAX_S)
        limit = max(limit, at + timedelta(seconds=step_s) + ticks)
    return limit


def _money_agrees(
    db: Database,
    settings: Settings,
    team: Team,
    cloud: Platforms,
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
        billed = cloud.owed_micros(cloud.machines[rental.provider_id], now)
        gap = abs(shown[rental.instance_id] - billed)
        if gap:
            status_gap += gap
            violations.append(
                f"{box_name(rental.provider_id)}: status shows {shown[rental.instance_id]} "
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
                    f"{box_name(rental.provider_id)}: spend of {month} says {said} micro-units, "
                    f"the platform billed {billed}"
                )
        for item in report.instances:
            owners[item.owner_id] += item.total_micros
    owner_of = {r.provider_id: r.owner for r in team.rentals}
    platform_by_owner: Counter[str] = Counter()
    for machine in cloud.machines.values():
        platform_by_owner[owner_of[machine.provider_id]] += cloud.owed_micros(machine, now)
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
        if not posted and slack_up_for(world, due, now, timedelta(hours=1)):
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
    machines: Iterable[Machine], cloud: Platforms, lo: datetime, hi: datetime
) -> int:
    """What the bot may say ``machines`` cost in [lo, hi): the platform's bill, and what the
    platform told it only later (:meth:`Platforms.owed_micros`)."""
    return sum(cloud.owed_micros(m, hi) - cloud.owed_micros(m, lo) for m in machines)


def first_trace(trace: Sequence[str], violations: Sequence[str], limit: int) -> list[str]:
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


#: How long Slack must have been up after a job ended for its reply to be owed.
REPLY_OWED_AFTER = timedelta(hours=1)
#: How long after a job ended on its host (its host reachable) the bot must have noticed.
NOTICE_OWED_AFTER = timedelta(hours=1)


def jobs_answered(
    db: Database, fleet: SimFleet, slack: SimSlack, world: World, now: datetime
) -> dict[str, Any]:
    """Every job the bot took that ended has exactly one completion reply: none twice, none
    missing where Slack was up for :data:`REPLY_OWED_AFTER` after it ended; and a job that
    ended on its host (finished there, or forgotten by it, its host answering) at least
    :data:`NOTICE_OWED_AFTER` before the end of the run is ended in the bot too."""
    violations: list[str] = []
    with db.session() as session:
        rows = session.exec(select(Job)).all()
        names = {i.id: i.name for i in session.exec(select(Instance)).all()}
        outbox_ids = {
            key: row_id
            for key, row_id in session.exec(
                select(OutboxMessage.key, OutboxMessage.id).where(OutboxMessage.kind == "job_reply")
            ).all()
        }
    posted = Counter(p.key for p in slack.posts if p.key is not None)
    unanswered = 0
    states: Counter[str] = Counter()
    for job in rows:
        states[job.state] += 1
        name = names.get(job.instance_id, "?")
        row_id = outbox_ids.get(f"job_reply:{job.id}")
        replies = posted[f"outbox:{row_id}"] if row_id is not None else 0
        if job.state in FINAL_STATES:
            ended = job.replied_at or job.finished_at or job.submitted_at
            if replies > 1:
                unanswered += 1
                violations.append(f"{name}: job {job.id} ({job.state}) replied {replies} times")
            elif replies == 0 and slack_up_for(world, ended, now, REPLY_OWED_AFTER):
                unanswered += 1
                violations.append(
                    f"{name}: job {job.id} ({job.state}) ended at {ended:%m-%d %H:%M} "
                    "without a reply, although Slack was up"
                )
            continue
        if replies:
            unanswered += 1
            violations.append(f"{name}: job {job.id} is {job.state} but was replied to")
        late = _ended_unnoticed(fleet, name, job, now)
        if late:
            unanswered += 1
            violations.append(f"{name}: job {job.id} {late}, the bot still has it {job.state}")
    return {
        "violations": violations,
        "jobs": len(rows),
        "jobs_by_state": dict(sorted(states.items())),
        "jobs_without_one_reply": unanswered,
    }


def _ended_unnoticed(fleet: SimFleet, name: str, job: Job, now: datetime) -> str:
    """Why an unfinished row should have ended by ``now`` (empty when it need not have)."""
    host = fleet.hosts.get(name)
    if host is None:
        return ""
    machine = fleet.cloud.machines.get(host.provider_id)
    if machine is not None and machine.ended_at is not None:
        if machine.ended_at < now - NOTICE_OWED_AFTER - timedelta(hours=1):
            return f"ran on a machine that ended at {machine.ended_at:%m-%d %H:%M}"
        return ""
    if job.agent_job_id.startswith(runs.PENDING_PREFIX):
        owed = job.submitted_at + runs.SUBMIT_CONFIRM_TIMEOUT + NOTICE_OWED_AFTER
        return "was never confirmed" if owed < now else ""
    host.advance(now)
    sim = host.jobs.get(job.agent_job_id)
    if sim is None:
        wiped = host.wiped_at
        if wiped is not None and wiped < now - NOTICE_OWED_AFTER:
            return f"was forgotten by its agent at {wiped:%m-%d %H:%M}"
        return ""
    if sim.final and sim.finished_at is not None and sim.finished_at < now - NOTICE_OWED_AFTER:
        return f"ended ({sim.state}) on its host at {sim.finished_at:%m-%d %H:%M}"
    return ""
