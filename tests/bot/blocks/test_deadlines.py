"""Deadline renderers: what the owner reads before a release."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from bot.blocks import RENDERERS, parts, render
from bot.blocks import answers as answer_blocks
from bot.blocks import deadlines as blocks
from bot.blocks import releases as release_blocks
from bot.blocks.instances import RELEASE_DONE, STOP_DONE
from bot.blocks.kit import BUTTON_TEXT_MAX, SECTION_TEXT_MAX
from bot.notify import Notice
from bot.services.instances import answers, deadlines, reconcile, releases, rent
from bot.services.instances.answers import ReleaseConfirmAsk
from bot.services.instances.deadlines import DeadlineWarning, IdlePrompt
from bot.services.instances.releases import ReleaseEscalation
from bot.services.instances.views import InstanceBrief
from tests.bot.blocks.slack_limits import check_message

NOW = datetime(2026, 3, 3, 12, 0)
PRICED = InstanceBrief(
    name="box", owner_id="UOWNER", provider="aws", price_micros_per_hour=2_100_000
)
UNPRICED = InstanceBrief(
    name="local", owner_id="UOWNER", provider="manual", price_micros_per_hour=0
)


def _warning(
    inst: InstanceBrief, deadline_at: datetime, late: datetime | None, **kwargs: object
) -> DeadlineWarning:
    return DeadlineWarning(
        inst,
        prompt_id=1,
        deadline_at=deadline_at,
        release_at=late or deadline_at,
        now=NOW,
        tz_name="UTC",
        **kwargs,  # type: ignore[arg-type]
    )


def _text(inst: InstanceBrief, deadline_at: datetime, late: datetime | None) -> str:
    text, _ = blocks.deadline_warning(_warning(inst, deadline_at, late))
    return text


def test_warning_says_when_and_what_it_costs() -> None:
    text, rendered = render(
        DeadlineWarning(
            PRICED,
            prompt_id=7,
            deadline_at=NOW + timedelta(minutes=30),
            release_at=NOW + timedelta(minutes=30),
            now=NOW,
            tz_name="UTC",
        )
    )
    assert "*box* will be released in *30m* (at Tue 03 Mar 12:30 UTC). It costs $2.10/h." in text
    labels = [e["text"]["text"] for b in rendered if b["type"] == "actions" for e in b["elements"]]
    assert labels == ["Extend 1h", "Extend 4h", "Release now"]
    values = {e["value"] for b in rendered if b["type"] == "actions" for e in b["elements"]}
    assert values == {"7"}


def test_a_deadline_that_passed_while_down_gets_a_grace() -> None:
    text = _text(PRICED, NOW - timedelta(hours=1), NOW + timedelta(minutes=10))
    assert "in *10m* (at Tue 03 Mar 12:10 UTC)" in text
    assert "passed while the bot could not warn you" in text


def test_a_deadline_too_close_for_notice_does_not_claim_it_passed() -> None:
    text = _text(PRICED, NOW + timedelta(minutes=4), NOW + timedelta(minutes=10))
    assert "passed" not in text
    assert "Its deadline (Tue 03 Mar 12:04 UTC) left too little notice" in text
    assert "in *10m* (at Tue 03 Mar 12:10 UTC)" in text


def test_no_price_is_said_plainly_not_as_zero() -> None:
    assert "$0.00" not in _text(UNPRICED, NOW + timedelta(minutes=30), None)
    assert "no price recorded" in _text(UNPRICED, NOW + timedelta(minutes=30), None)
    idle, _ = render(
        IdlePrompt(
            UNPRICED,
            prompt_id=2,
            idle_since=NOW - timedelta(minutes=45),
            now=NOW,
            release_at=None,
            tz_name="UTC",
        )
    )
    assert "costing money (no price recorded)" in idle
    escalation, _ = render(ReleaseEscalation(UNPRICED, attempts=3, last_error=None, manual=True))
    assert "$0.00" not in escalation
    assert parts.per_hour(PRICED) == "$2.10/h"


def test_wait_for_jobs_names_the_time_and_the_condition() -> None:
    text, _ = blocks.deadline_warning(
        _warning(PRICED, NOW + timedelta(minutes=10), None, policy="wait-for-jobs")
    )
    assert (
        "*box* will be released in *10m* (at Tue 03 Mar 12:10 UTC), or once its jobs finish if "
        "they still run then. It costs $2.10/h." in text
    )


def test_times_show_their_date_in_the_notices_zone() -> None:
    text = blocks.deadline_warning(
        DeadlineWarning(
            PRICED,
            prompt_id=1,
            deadline_at=NOW + timedelta(minutes=30),
            release_at=NOW + timedelta(minutes=30),
            now=NOW,
            tz_name="Europe/Berlin",
        )
    )[0]
    assert "(at Tue 03 Mar 13:30 CET)" in text


def test_long_names_are_cut_with_an_ellipsis_within_slacks_limits() -> None:
    huge = InstanceBrief(
        name="x" * 5000, owner_id="UOWNER", provider="aws", price_micros_per_hour=1
    )
    text, rendered = answer_blocks.release_confirm(ReleaseConfirmAsk(huge, prompt_id=3))
    [section] = [b for b in rendered if b["type"] == "section"]
    assert len(section["text"]["text"]) == SECTION_TEXT_MAX
    assert section["text"]["text"].endswith("…")
    assert all(
        len(e["text"]["text"]) <= BUTTON_TEXT_MAX
        for b in rendered
        if b["type"] == "actions"
        for e in b["elements"]
    )
    assert text.endswith("…")


def test_every_notice_of_the_area_has_a_renderer() -> None:
    modules = (answers, deadlines, reconcile, releases, rent)
    notices = {
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, Notice)
        and value.__module__ == module.__name__
    }
    assert notices <= set(RENDERERS)


def test_a_button_value_too_long_for_slack_is_refused() -> None:
    with pytest.raises(ValueError, match="button value"):
        answer_blocks.release_confirm(ReleaseConfirmAsk(PRICED, prompt_id=10**2001))


def _labels(rendered: tuple[dict[str, object], ...]) -> list[str]:
    return [
        e["text"]["text"]  # type: ignore[index]
        for b in rendered
        if b["type"] == "actions"
        for e in b["elements"]  # type: ignore[attr-defined]
    ]


def test_a_warning_offers_only_the_extends_the_recipient_may_use() -> None:
    cap = NOW + timedelta(minutes=30)
    text, rendered = render(_warning(PRICED, cap, None, capped=True, cap_at=cap, extend_s=()))
    assert _labels(rendered) == ["Release now"]
    assert "The lifetime cap set by an admin ends it at Tue 03 Mar 12:30 UTC" in text
    text, rendered = render(_warning(PRICED, cap, None, cap_at=cap, extend_s=(3600,)))
    assert _labels(rendered) == ["Extend 1h", "Release now"]
    assert "it can be extended only up to then" in text


def test_a_stop_policy_warning_says_stop_then_when_it_is_released() -> None:
    at = NOW + timedelta(minutes=30)
    text, _ = render(
        _warning(PRICED, at, None, action="stop", final_release_at=at + timedelta(hours=24))
    )
    assert "*box* will be stopped in *30m* (at Tue 03 Mar 12:30 UTC); its disk is kept" in text
    assert "released (disk and all) at Wed 04 Mar 12:30 UTC unless someone starts it" in text


def test_a_click_on_a_release_awaiting_confirmation_says_so() -> None:
    text, _ = render(answers.ReleasePending(PRICED, by_owner=True))
    assert "release requested; waiting for you to confirm it is released on the platform" in text
    text, _ = render(answers.ReleasePending(PRICED, by_owner=False))
    assert "waiting for <@UOWNER> to confirm" in text


def test_an_admins_release_names_the_admin() -> None:
    text, _ = render(
        releases.ReleasedNotice(
            PRICED, mode="terminate", reason="user", storage_bills=False, requested_by="UADMIN"
        )
    )
    assert "(released by <@UADMIN> (an admin))" in text
    text, _ = render(releases.ManualReleaseRequest(PRICED, 1, reason="user", requested_by="UOWNER"))
    assert "(requested by its owner)" in text


# --- confirm dialogs ----------------------------------------------------------------------------

#: The buttons that release an instance, record it released or stopped, or keep it billing.
CONFIRMED = {
    blocks.EXTEND_1H,
    blocks.EXTEND_4H,
    blocks.RELEASE_NOW,
    blocks.IDLE_KEEP,
    blocks.IDLE_RELEASE,
    RELEASE_DONE,
    STOP_DONE,
}


def _prompts(inst: InstanceBrief) -> list[tuple[str, tuple[dict[str, Any], ...]]]:
    """Every message of the module that carries buttons."""
    return [
        blocks.deadline_warning(_warning(inst, NOW + timedelta(minutes=30), None)),
        blocks.deadline_warning(_warning(inst, NOW + timedelta(minutes=30), None, stopped=True)),
        blocks.idle_prompt(IdlePrompt(inst, 2, NOW - timedelta(hours=1), NOW, None, "UTC")),
        blocks.jobs_done_prompt(deadlines.JobsDonePrompt(inst, 3, NOW, "UTC")),
        release_blocks.manual_release_request(
            releases.ManualReleaseRequest(inst, 4, reason="deadline")
        ),
        release_blocks.manual_release_reminder(
            releases.ManualReleaseReminder(inst, 4, asked_at=NOW, now=NOW + timedelta(hours=1))
        ),
        answer_blocks.release_confirm(ReleaseConfirmAsk(inst, prompt_id=5)),
    ]


def _elements(rendered: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [e for b in rendered if b["type"] == "actions" for e in b["elements"]]


@pytest.mark.parametrize("inst", [PRICED, UNPRICED, replace(PRICED, name="g" * 400)])
def test_every_button_that_releases_or_bills_asks_first_within_slacks_limits(
    inst: InstanceBrief,
) -> None:
    seen = set()
    for message in _prompts(inst):
        check_message(message)
        for element in _elements(message[1]):
            seen.add(element["action_id"])
            confirm = element.get("confirm")
            if element["action_id"] not in CONFIRMED:
                assert confirm is None, element["action_id"]
                continue
            assert confirm is not None, element["action_id"]
            assert inst.name[:10] in confirm["title"]["text"]
            assert inst.name[:10] in confirm["text"]["text"]
            assert confirm["deny"]["text"] == "Cancel"
    assert seen == {*CONFIRMED, blocks.RELEASE_CONFIRM}


def _confirm_of(message: tuple[str, tuple[dict[str, Any], ...]], action_id: str) -> str:
    [element] = [e for e in _elements(message[1]) if e["action_id"] == action_id]
    dialog = element["confirm"]
    return f"{dialog['title']['text']} | {dialog['text']['text']} | {dialog['confirm']['text']}"


def test_extend_confirms_name_the_new_deadline_and_what_it_costs() -> None:
    warning = blocks.deadline_warning(_warning(PRICED, NOW + timedelta(minutes=30), None))
    assert _confirm_of(warning, blocks.EXTEND_1H) == (
        "Extend box by 1h? | *box* keeps running until Tue 03 Mar 13:30 UTC (1h more). That "
        "costs about $2.10 more. | Yes, extend"
    )
    assert "until Tue 03 Mar 16:30 UTC (4h more). That costs about $8.40 more." in _confirm_of(
        warning, blocks.EXTEND_4H
    )
    late = blocks.deadline_warning(
        _warning(UNPRICED, NOW - timedelta(hours=1), NOW + timedelta(minutes=10))
    )
    assert "until Tue 03 Mar 13:00 UTC (1h more). It keeps billing on its platform" in (
        _confirm_of(late, blocks.EXTEND_1H)
    )
    stopped = replace(PRICED, storage_micros_per_hour=100_000)
    cold = blocks.deadline_warning(
        _warning(stopped, NOW + timedelta(minutes=30), None, stopped=True)
    )
    assert "stays stopped, its disk kept" in _confirm_of(cold, blocks.EXTEND_4H)
    assert "about $0.40 more" in _confirm_of(cold, blocks.EXTEND_4H)


def test_release_keep_and_done_confirms_say_what_follows() -> None:
    warning = blocks.deadline_warning(_warning(PRICED, NOW + timedelta(minutes=30), None))
    assert _confirm_of(warning, blocks.RELEASE_NOW) == (
        "Release box now? | *box* stops billing and its disks are deleted: anything not saved "
        "off it is lost. | Yes, release it"
    )
    idle = blocks.idle_prompt(IdlePrompt(PRICED, 2, NOW - timedelta(hours=1), NOW, None, "UTC"))
    assert "keeps running and costing $2.10/h" in _confirm_of(idle, blocks.IDLE_KEEP)
    assert "disks are deleted" in _confirm_of(idle, blocks.IDLE_RELEASE)
    ask = release_blocks.manual_release_request(
        releases.ManualReleaseRequest(PRICED, 4, reason="idle")
    )
    assert "Is box released?" in _confirm_of(ask, RELEASE_DONE)
    assert "bills unseen" in _confirm_of(ask, RELEASE_DONE)
    assert "counts only its disk" in _confirm_of(ask, STOP_DONE)


def test_a_hostile_name_stays_text_in_a_confirm() -> None:
    hostile = replace(PRICED, name="<!channel>")
    message = blocks.idle_prompt(IdlePrompt(hostile, 2, NOW, NOW, None, "UTC"))
    for element in _elements(message[1]):
        assert "<!channel>" not in element["confirm"]["text"]["text"]
