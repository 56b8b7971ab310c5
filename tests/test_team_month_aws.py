"""AWS EC2 in the team-month (bench/sim/aws.py): a month renting from EC2 (moto behind a
fault-injecting proxy) keeps every promise to the micro-unit, each AWS fault reaches the bot's
client as an HTTP answer, a machine terminated behind the bot's back is told on a look, and the
month's record bills by EC2's rule (per second, 60 seconds at least per start)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

import pytest

from bench.sim.aws import MIN_CHARGE_S, AwsCloud, Ec2Record, run_micros
from bench.sim.platforms import Platforms
from bench.sim.world import SimClock, World
from tests.test_team_month import HARNESS

START = datetime(2027, 3, 1, 12, 0)


def _month(*extra: str, seed: int = 5) -> dict[str, Any]:
    args = HARNESS.parse_args(
        [
            *("--seed", str(seed), "--days", "0.25", "--jobs", "10"),
            *("--people", "4", "--instances", "6", "--platforms", "aws"),
            *extra,
        ]
    )
    report, _trace, _logged = HARNESS.run(args)
    return dict(report)


@pytest.mark.integration
def test_a_month_on_aws_keeps_every_promise() -> None:
    report = _month()
    assert report["violations"] == []
    assert report["bot_month_micros"] > 0
    assert report["bot_month_micros"] == (
        report["platform_month_micros"] + report["told_late_micros"] - report["unrounded_micros"]
    )
    statuses = report["aws"]["answers_by_status"]
    # Every fault kind reached the bot's client as an HTTP answer (or a dropped one).
    assert statuses["200"] > 0
    assert {"404", "500", "503"} <= set(statuses)
    assert statuses["lost"] >= 1


def test_run_micros_bills_a_minute_at_least_then_by_the_second() -> None:
    assert run_micros(START, START, 10) == 0
    assert run_micros(START, START + timedelta(seconds=1), 10) == MIN_CHARGE_S * 10
    assert run_micros(START, START + timedelta(seconds=60), 10) == 600
    assert run_micros(START, START + timedelta(seconds=61), 10) == 610
    assert run_micros(START, START + timedelta(hours=1), 10) == 36_000


def test_the_record_bills_each_start_its_minimum_and_splits_days() -> None:
    record = Ec2Record()
    record.launch("i-1", 10, START)
    record.stop("i-1", START + timedelta(seconds=20))
    record.start("i-1", START + timedelta(hours=1))
    record.terminate("i-1", START + timedelta(hours=1, seconds=90))
    record.terminate("i-1", START + timedelta(hours=2))  # once terminated, it stays so
    assert record.billed_micros("i-1", START + timedelta(days=1)) == (60 + 90) * 10
    assert record.ended_at("i-1") == START + timedelta(hours=1, seconds=90)
    night = Ec2Record()
    night.launch("i-2", 10, datetime(2027, 3, 1, 23, 59, 30))
    night.terminate("i-2", datetime(2027, 3, 2, 0, 1))
    days = night.daily_micros(datetime(2027, 3, 3).date())
    # The minute is billed from the first second; the rest by the second, day by day.
    assert days == {
        ("i-2", datetime(2027, 3, 1).date()): 600,
        ("i-2", datetime(2027, 3, 2).date()): 300,
    }


@pytest.mark.integration
def test_a_machine_terminated_behind_the_bots_back_is_told_on_a_look() -> None:
    clock = SimClock(START)
    world = World(rng=random.Random(1), calm=True)
    with Platforms(world, clock, [AwsCloud]) as platforms:
        [platform] = platforms.all
        machine = platform.open(550, 30_001, START)
        assert platform.get(machine.provider_id).state == "running"
        ended = START + timedelta(minutes=54, seconds=30)
        platforms.end_outside(machine.provider_id, ended)
        clock.now = told = START + timedelta(hours=1)
        seen = platform.get(machine.provider_id)
        assert seen.is_gone
        # AWS says when, on the month's clock: the bot's meter stops there.
        assert seen.ended_at == ended
        assert seen.launched_at == START
        assert platform.told_gone[machine.provider_id] == {told}
        assert platforms.bill_micros(machine, told) == (54 * 60 + 30) * 550
        assert platforms.settle({machine.provider_id: ended}, told) == []
        assert platforms.unseen_end_micros(told) == 0
