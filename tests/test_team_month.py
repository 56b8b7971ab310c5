"""The team-month simulation (bench/team_month.py): the same seed gives the same report, and a
build broken on purpose (a warning skipped, a post doubled, a charge dropped) is caught by the
invariant that guards it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

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


def _month(*extra: str, seed: int = 11) -> dict[str, Any]:
    args = HARNESS.parse_args(
        ["--seed", str(seed), "--days", "0.5", "--people", "4", "--instances", "6", *extra]
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
