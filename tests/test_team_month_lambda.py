"""Lambda Cloud in the team-month (bench/sim/lambda_cloud.py): a month renting from Lambda keeps
every promise to the micro-unit, and Lambda's answer that an instance is terminated counts as
telling the bot it is gone, its minutes owed by the documented told-late rule."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from bench.sim.lambda_cloud import LambdaCloud
from bench.sim.platforms import Platforms
from bench.sim.world import SimClock, World
from tests.test_team_month import HARNESS


def _month(*extra: str, seed: int = 5) -> dict[str, Any]:
    args = HARNESS.parse_args(
        [
            *("--seed", str(seed), "--days", "0.5", "--jobs", "10"),
            *("--people", "4", "--instances", "6", "--platforms", "lambda"),
            *extra,
        ]
    )
    report, _trace, _logged = HARNESS.run(args)
    return dict(report)


def test_a_month_on_lambda_off_the_minute_keeps_every_promise() -> None:
    """Steps of 270 s put half the rentals, releases and ends between whole minutes."""
    report = _month("--tick-s", "270")
    assert report["violations"] == []
    assert report["bot_month_micros"] > 0
    assert report["bot_month_micros"] == (
        report["platform_month_micros"] + report["told_late_micros"]
    )
    assert report["lambda"]["answers_by_status"]["200"] > 0
    # Lambda publishes no bills: `/gpu bills` has no line of it.
    assert report["bill_lines"] == 0


def test_lambda_tells_of_an_end_on_a_look_and_the_rule_counts_its_minutes() -> None:
    start = datetime(2027, 3, 1, 12, 0)
    clock = SimClock(start)
    world = World(rng=random.Random(1), calm=True)
    with Platforms(world, clock, [LambdaCloud]) as platforms:
        [platform] = platforms.all
        machine = platform.open(550, 30_001, start)
        clock.now = start + timedelta(minutes=54, seconds=30)
        platforms.end_outside(machine.provider_id, clock.now)
        clock.now = told = start + timedelta(hours=1, seconds=10)
        assert platform.get(machine.provider_id).is_gone
        assert platform.told_gone[machine.provider_id] == {told}
        # 55 started minutes billed, at 60 x 550 micro-units each.
        assert platforms.bill_micros(machine, told) == 55 * 33_000
        assert platforms.settle({machine.provider_id: told}, told) == []
        # The bot may say what the minutes to the moment it was told would have cost: 61.
        assert platforms.owed_micros(machine, told) == 61 * 33_000
        assert platforms.unseen_end_micros(told) == 6 * 33_000


def test_a_lambda_machine_is_registered_where_lambda_says_it_answers() -> None:
    start = datetime(2027, 3, 1, 12, 0)
    with Platforms(World(rng=random.Random(1), calm=True), SimClock(start), [LambdaCloud]) as p:
        [platform] = p.all
        one = platform.open(125, 30_001, start).provider_id
        two = platform.open(125, 30_002, start).provider_id
        seen = {i.provider_id: (i.host, i.ssh_port) for i in platform.list_instances()}
        assert seen == {
            one: platform.ssh_address(one, 30_001),
            two: platform.ssh_address(two, 30_002),
        }
        assert seen[one] != seen[two]
        assert platform.registration(125).price_micros_per_hour == 450_000
