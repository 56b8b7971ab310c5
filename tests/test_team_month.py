"""The team-month simulation (bench/team_month.py): the same seed gives the same report, a
build broken on purpose (a warning skipped, a post doubled, a charge dropped) is caught by the
invariant that guards it, every kind of fault fires in a day, the closed month's digest is
checked when a run crosses a month's end, and what the simulation found stays reproduced."""

from __future__ import annotations

import importlib.util
import sys
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from bot.services import costs, ledger, releases, spend
from bot.store.db import Database
from bot.store.models import Instance, Person

ROOT = Path(__file__).resolve().parents[1]


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("team_month", ROOT / "bench" / "team_month.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["team_month"] = module
    spec.loader.exec_module(module)
    return module


HARNESS = _harness()


def _month(
    *extra: str, seed: int = 11, days: float = 0.5, people: int = 4, instances: int = 6
) -> dict[str, Any]:
    args = HARNESS.parse_args(
        [
            *("--seed", str(seed), "--days", str(days)),
            *("--people", str(people), "--instances", str(instances)),
            *extra,
        ]
    )
    report, _trace, _logged = HARNESS.run(args)
    return dict(report)


@pytest.fixture(scope="module")
def clean() -> dict[str, Any]:
    return _month()


def test_a_clean_run_keeps_every_promise(clean: dict[str, Any]) -> None:
    assert clean["violations"] == []
    assert clean["instances"] >= 6
    assert clean["bot_month_micros"] == clean["platform_month_micros"] > 0
    assert sum(clean["faults"].values()) > 0


def test_the_same_seed_gives_the_same_report(clean: dict[str, Any]) -> None:
    again = _month()
    assert {k: v for k, v in again.items() if k != "wall_s"} == {
        k: v for k, v in clean.items() if k != "wall_s"
    }


@pytest.mark.parametrize(
    ("broken", "figure"),
    [
        ("double_post", "doubled_messages"),
        ("drop_charge", "digest_vs_platform_micros"),
        ("skip_warning", "unwarned_releases"),
    ],
)
def test_a_build_broken_on_purpose_is_caught(broken: str, figure: str) -> None:
    report = _month("--break", broken)
    assert report[figure] > 0
    assert report["violations"]


def test_every_fault_kind_fires_in_a_day() -> None:
    report = _month(seed=5, days=1.0, people=6, instances=10)
    missing = [kind for kind in HARNESS.FAULT_KINDS if report["faults"].get(kind, 0) == 0]
    assert missing == []


def test_the_admin_and_strangers_act_and_nobody_acts_on_what_is_not_theirs(
    clean: dict[str, Any],
) -> None:
    actions = clean["actions"]
    assert actions.get("budget_set", 0) + actions.get("lifetime_cap", 0) >= 2
    assert sum(n for kind, n in actions.items() if kind.startswith("not_theirs_")) > 0
    assert clean["unauthorised_changes"] == 0


def test_a_run_across_a_month_end_checks_the_closed_months_digest() -> None:
    report = _month("--start", "2027-03-31", seed=3, days=1.0)
    assert report["closed_months"] == 1
    assert report["start"] == "2027-03-31"
    assert set(report["spend_micros_by_month"]) == {"2027-03", "2027-04"}
    assert report["closed_digest_vs_platform_micros"] == 0
    assert report["digests_missing"] == 0
    assert report["status_vs_platform_micros"] == 0
    assert report["per_owner_vs_platform_micros"] == 0


def test_a_machine_ended_behind_the_bots_back_is_not_charged_past_its_end(
    tmp_path: Path,
) -> None:
    db = Database(f"sqlite:///{tmp_path}/gpubot.db")
    db.migrate()
    tz = ZoneInfo("UTC")
    start = datetime(2027, 3, 1, 18, 0)
    try:
        with db.session() as session:
            session.add(Person(slack_id="UP001"))
            session.flush()
            inst = Instance(
                name="box19",
                owner_id="UP001",
                state="active",
                host="127.0.0.1",
                port=30_019,
                ssh_user="root",
                price_micros=2_200 * 3600,
                gpu_model="H100",
                gpu_count=1,
                provider="simcloud",
                provider_instance_id="sim-00019",
                billing_increment="second",
                min_charge_s=0,
                billing_from="created",
                created_at=start,
                deadline_at=start + timedelta(hours=6),
            )
            session.add(inst)
            session.flush()
            assert inst.id is not None
            instance_id = inst.id
        # The hour 18:00-19:00 is charged while the store believes the machine runs ...
        ledger.accrue(db, start + timedelta(hours=1), tz)
        # ... and the platform then says it ended at 18:55 (reconciliation stops the meter).
        with db.session() as session:
            releases.mark_instance_released(
                session,
                instance_id,
                now=start + timedelta(hours=1, minutes=5),
                mode="terminate",
                at=start + timedelta(minutes=55),
            )
        now = start + timedelta(hours=1, minutes=5)
        ledger.accrue(db, now, tz)
        with db.session() as session:
            released = session.get(Instance, instance_id)
            assert released is not None
            shown = costs.since_registered_micros(released, now)
        billed = 55 * 60 * 2_200
        assert shown == billed
        assert spend.month_total_micros(db, "2027-03", tz=tz, now=now) == billed
    finally:
        db.dispose()
