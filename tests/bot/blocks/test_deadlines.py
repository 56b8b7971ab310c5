"""Deadline renderers: what the owner reads before a release."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from bot.blocks import deadlines as blocks
from bot.services.views import InstanceBrief

UTC_ZONE = ZoneInfo("UTC")
NOW = datetime(2026, 3, 3, 12, 0)
PRICED = InstanceBrief(
    name="box", owner_id="UOWNER", provider="aws", price_micros_per_hour=2_100_000
)
UNPRICED = InstanceBrief(
    name="local", owner_id="UOWNER", provider="manual", price_micros_per_hour=0
)


def _warning(inst: InstanceBrief, deadline_at: datetime, late: datetime | None) -> str:
    text, _ = blocks.deadline_warning(
        inst, deadline_at=deadline_at, now=NOW, tz=UTC_ZONE, prompt_id=1, late_release_at=late
    )
    return text


def test_warning_says_when_and_what_it_costs() -> None:
    text, rendered = blocks.deadline_warning(
        PRICED, deadline_at=NOW + timedelta(minutes=30), now=NOW, tz=UTC_ZONE, prompt_id=7
    )
    assert "*box* will be released in *30m* (at Tue 12:30 UTC). It costs $2.10/h." in text
    labels = [e["text"]["text"] for b in rendered if b["type"] == "actions" for e in b["elements"]]
    assert labels == ["Extend 1h", "Extend 4h", "Release now"]


def test_a_deadline_that_passed_while_down_gets_a_grace() -> None:
    text = _warning(PRICED, NOW - timedelta(hours=1), NOW + timedelta(minutes=10))
    assert "in *10m* (at Tue 12:10 UTC)" in text
    assert "passed while the bot could not warn you" in text


def test_a_deadline_too_close_for_notice_does_not_claim_it_passed() -> None:
    text = _warning(PRICED, NOW + timedelta(minutes=4), NOW + timedelta(minutes=10))
    assert "passed" not in text
    assert "Its deadline (Tue 12:04 UTC) left too little notice" in text
    assert "in *10m* (at Tue 12:10 UTC)" in text


def test_no_price_is_said_plainly_not_as_zero() -> None:
    assert "$0.00" not in _warning(UNPRICED, NOW + timedelta(minutes=30), None)
    assert "no price recorded" in _warning(UNPRICED, NOW + timedelta(minutes=30), None)
    idle, _ = blocks.idle_prompt(
        UNPRICED, idle_for=timedelta(minutes=45), prompt_id=2, release_at=None, tz=UTC_ZONE
    )
    assert "costing money (no price recorded)" in idle
    escalation, _ = blocks.release_escalation(UNPRICED, attempts=3, last_error=None, manual=True)
    assert "$0.00" not in escalation
    assert blocks.per_hour(PRICED) == "$2.10/h"


def test_wait_for_jobs_names_the_time_and_the_condition() -> None:
    text, _ = blocks.deadline_warning(
        PRICED,
        deadline_at=NOW + timedelta(minutes=10),
        now=NOW,
        tz=UTC_ZONE,
        prompt_id=3,
        policy="wait-for-jobs",
    )
    assert (
        "*box* will be released in *10m* (at Tue 12:10 UTC), or once its jobs finish if they "
        "still run then. It costs $2.10/h." in text
    )
