"""The team-month renting from Compshare (bench/sim/compshare.py): a short month through the
bot's own Compshare client keeps every promise, its money meeting Compshare's hourly bill in
yuan by the documented rules (an end told late, an hour not yet rounded)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_team_month import HARNESS


@pytest.fixture(scope="module")
def month() -> dict[str, Any]:
    args = HARNESS.parse_args(
        [
            *("--seed", "11", "--days", "0.25", "--jobs", "20"),
            *("--people", "4", "--instances", "6", "--platforms", "compshare"),
        ]
    )
    report, _trace, _logged = HARNESS.run(args)
    return dict(report)


def test_a_compshare_month_keeps_every_promise(month: dict[str, Any]) -> None:
    assert month["violations"] == []
    assert month["currency"] == "CNY"  # the deployment counts in yuan, as Compshare bills
    assert month["platform_month_micros"] > 0
    assert month["bot_month_micros"] == (
        month["platform_month_micros"] + month["told_late_micros"] - month["unrounded_micros"]
    )
    # Every call went through the bot's Compshare client to the stand-in, over HTTP.
    assert month["compshare"]["answers_by_status"]["200"] > 0
    assert set(month) >= {"compshare"}
    assert "runpod" not in month


def test_platforms_billing_in_other_currencies_are_refused_together(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        HARNESS.parse_args(["--platforms", "runpod,compshare"])
    said = capsys.readouterr().err
    assert "compshare in CNY; runpod in USD" in said
    assert "run them in separate months" in said
