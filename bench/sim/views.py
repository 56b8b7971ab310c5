"""What people read, against the ledger and the platform: each person's Home (this month's
spend) and `/gpu bills` (the platform's published bills beside the bot's charges), checked to
the micro-unit at the end of a simulated month."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from bench.sim.platforms import Platforms
from bench.sim.team import Team
from bench.sim.world import World
from bot.runtime import Runtime
from bot.services import home
from bot.services.money import bills, ledger, spend


def views_agree(
    rt: Runtime, team: Team, cloud: Platforms, world: World, now: datetime
) -> dict[str, Any]:
    """``home_vs_spend_micros``: per person, |Home's month so far - their instances' total in
    `/gpu spend` for the month|; ``home_vs_platform_micros``: per person, |Home's month so far
    - what the platform billed their machines in the month up to ``now``|;
    ``bills_vs_platform_micros``: per machine in `/gpu bills` for the month, |the bot's side -
    the platform's published bill| plus |the published bill - what the platform billed|. The
    documented rule for a difference: `/gpu bills` covers whole UTC days (the platform
    publishes to the start of today), and the bot's side is cut where the bill is. The platform
    is read here without faults (``world.calm``)."""
    violations: list[str] = []
    tz = rt.settings.tz()
    month = ledger.month_of(now, tz)
    lo, hi = ledger.month_bounds(month, tz)
    report = spend.spend_report(
        rt.db,
        month,
        by="user",
        tz=tz,
        now=now,
        idle_threshold_pct=rt.settings.idle_threshold_pct,
        currency=rt.settings.currency,
    )
    spent: Counter[str] = Counter()
    for item in report.instances:
        spent[item.owner_id] += item.total_micros
    billed: Counter[str] = Counter()
    for rental in team.rentals:
        machine = cloud.machines[rental.provider_id]
        billed[rental.owner] += cloud.owed_micros(machine, min(hi, now)) - cloud.owed_micros(
            machine, lo
        )
    home_spend = home_platform = 0
    for person in sorted(team.people):
        shown = home.month_spent_micros(rt, person, now, tz)
        if shown != spent[person]:
            home_spend += abs(shown - spent[person])
            violations.append(
                f"{person}: Home says {shown} micro-units this month, /gpu spend {spent[person]}"
            )
        if shown != billed[person]:
            home_platform += abs(shown - billed[person])
            violations.append(
                f"{person}: Home says {shown} micro-units this month, the platform billed "
                f"{billed[person]}"
            )
    world.calm = True
    try:
        for platform in cloud.all:
            if platform.capabilities.publishes_bills:  # Lambda publishes none
                bills.fetch_bills(rt, platform.name, platform, now)
    finally:
        world.calm = False
    bills_gap, lines = _bills_gap(rt, cloud, now, violations)
    return {
        "violations": violations,
        "home_vs_spend_micros": home_spend,
        "home_vs_platform_micros": home_platform,
        "bills_vs_platform_micros": bills_gap,
        "bill_lines": lines,
    }


def _bills_gap(
    rt: Runtime, cloud: Platforms, now: datetime, violations: list[str]
) -> tuple[int, int]:
    """`/gpu bills` of the UTC month of ``now``: the gap summed over its lines, and how many."""
    month = f"{now:%Y-%m}"
    report = bills.bills_report(rt, month, now)
    gap = lines = 0
    for platform in report.platforms:
        if platform.provider not in cloud.by_name:
            continue
        if platform.fetched_at is None or platform.covered_to is None:
            violations.append(f"/gpu bills {month}: the platform's bills were never read")
            continue
        start = datetime(now.year, now.month, 1)
        end = platform.covered_to
        for line in platform.lines:
            lines += 1
            machine = cloud.machines.get(line.provider_instance_id)
            truth = owed = 0
            if machine is not None and end > start:
                truth = cloud.bill_micros(machine, end) - cloud.bill_micros(machine, start)
                owed = cloud.owed_micros(machine, end) - cloud.owed_micros(machine, start)
            said = line.bot_total_micros or 0
            published = line.platform_total_micros or 0
            # The documented rule: the bot's side runs ahead of the bill by what RunPod told
            # it only later (bench/sim/platforms.py); the published bill is the platform's own.
            if said - published != owed - truth or published != truth:
                gap += abs((said - published) - (owed - truth)) + abs(published - truth)
                violations.append(
                    f"{line.name or line.provider_instance_id}: /gpu bills {month} shows the "
                    f"bot's {said} and the platform's {published} micro-units, the platform "
                    f"billed {truth} to {end:%m-%d %H:%M}"
                )
    return gap, lines
