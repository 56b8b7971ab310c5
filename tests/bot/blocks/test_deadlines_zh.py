"""Deadline, release, reconcile, answer and rent renderers in Simplified Chinese: every message
of bot.blocks.deadlines, .releases, .reconcile, .answers and .rent, their buttons and confirm
dialogs read as Chinese, keep their names and numbers, and stay within Slack's limits."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from bot.blocks import answers as answer_blocks
from bot.blocks import deadlines as blocks
from bot.blocks import reconcile as reconcile_blocks
from bot.blocks import releases as release_blocks
from bot.blocks import rent as rent_blocks
from bot.blocks.kit import Message
from bot.i18n import speaking
from bot.services.instances import answers, policies, reconcile, releases, rent
from bot.services.instances import deadlines as rules
from bot.services.instances.views import InstanceBrief
from tests.bot.blocks.slack_limits import all_text, check_message
from tests.bot.blocks.test_deadlines import NOW, PRICED, UNPRICED
from tests.chinese import assert_chinese

COLD = InstanceBrief(
    name="cold1",
    owner_id="UOWNER",
    provider="aws",
    price_micros_per_hour=2_100_000,
    storage_micros_per_hour=50_000,
)
SOON = NOW + timedelta(minutes=30)


def _warning(inst: InstanceBrief, **kwargs: Any) -> rules.DeadlineWarning:
    return rules.DeadlineWarning(inst, 1, SOON, SOON, NOW, "UTC", **kwargs)


def _released(**kwargs: Any) -> releases.ReleasedNotice:
    values: dict[str, Any] = {"mode": "terminate", "reason": "deadline", "storage_bills": False}
    return releases.ReleasedNotice(COLD, **(values | kwargs))


#: Each message of the module (by the function that renders it, with a variant), and what must
#: stay in it whatever the language: names, mentions, commands, numbers.
CASES: dict[str, tuple[Callable[[], Message], tuple[str, ...]]] = {
    "deadline_warning": (lambda: blocks.deadline_warning(_warning(PRICED)), ("*box*", "30 分钟")),
    "deadline_warning/jobs": (
        lambda: blocks.deadline_warning(_warning(PRICED, policy="wait-for-jobs")),
        ("*box*",),
    ),
    "deadline_warning/late": (
        lambda: blocks.deadline_warning(
            rules.DeadlineWarning(PRICED, 1, NOW - timedelta(hours=1), SOON, NOW, "UTC")
        ),
        ("*box*",),
    ),
    "deadline_warning/too-close": (
        lambda: blocks.deadline_warning(
            rules.DeadlineWarning(PRICED, 1, NOW + timedelta(minutes=4), SOON, NOW, "UTC")
        ),
        ("*box*",),
    ),
    "deadline_warning/stop": (
        lambda: blocks.deadline_warning(
            _warning(UNPRICED, action="stop", final_release_at=SOON + timedelta(days=1))
        ),
        ("*local*",),
    ),
    "deadline_warning/stopped": (
        lambda: blocks.deadline_warning(_warning(COLD, stopped=True)),
        ("*cold1*", "`/gpu release cold1`"),
    ),
    "deadline_warning/capped": (
        lambda: blocks.deadline_warning(_warning(PRICED, cap_at=SOON, extend_s=(3600,))),
        ("*box*",),
    ),
    "deadline_warning/cap-reached": (
        lambda: blocks.deadline_warning(_warning(PRICED, cap_at=SOON, extend_s=())),
        ("*box*",),
    ),
    "idle_prompt": (
        lambda: blocks.idle_prompt(
            rules.IdlePrompt(UNPRICED, 2, NOW - timedelta(minutes=45), NOW, SOON, "UTC")
        ),
        ("*local*", "45 分钟"),
    ),
    "jobs_done_prompt": (
        lambda: blocks.jobs_done_prompt(rules.JobsDonePrompt(PRICED, 3, SOON, "UTC")),
        ("*box*",),
    ),
    "decided/extended": (
        lambda: release_blocks.decided(
            releases.Decided(PRICED, releases.EXTENDED, "UOWNER", NOW, "UTC", extended_s=7200)
        ),
        ("*box*", "<@UOWNER>", "2 小时"),
    ),
    "decided/withdrawn": (
        lambda: release_blocks.decided(
            releases.Decided(
                PRICED, releases.RELEASE_CANCELLED, "UADMIN", NOW, "UTC", extended_s=3600
            )
        ),
        ("*box*", "<@UADMIN>", "1 小时"),
    ),
    "decided/requested": (
        lambda: release_blocks.decided(
            releases.Decided(PRICED, releases.RELEASE_REQUESTED, None, NOW, "UTC", reason="idle")
        ),
        ("*box*",),
    ),
    "decided/stop": (
        lambda: release_blocks.decided(
            releases.Decided(PRICED, releases.RELEASE_REQUESTED, None, NOW, "UTC", mode="stop")
        ),
        ("*box*",),
    ),
    "decided/confirmed": (
        lambda: release_blocks.decided(
            releases.Decided(PRICED, releases.CONFIRMED_STOPPED, "UOWNER", NOW, "UTC")
        ),
        ("*box*",),
    ),
    "superseded": (
        lambda: blocks.superseded(rules.Superseded(PRICED, SOON, "UTC", by="UADMIN")),
        ("*box*", "<@UADMIN>"),
    ),
    "superseded/none": (
        lambda: blocks.superseded(rules.Superseded(PRICED, None, "UTC")),
        ("*box*",),
    ),
    "busy_again": (lambda: blocks.busy_again(rules.BusyAgain(PRICED)), ("*box*",)),
    "new_jobs": (lambda: blocks.new_jobs(rules.NewJobs(PRICED)), ("*box*",)),
    "manual_release_request": (
        lambda: release_blocks.manual_release_request(
            releases.ManualReleaseRequest(UNPRICED, 4, "user", requested_by="UADMIN")
        ),
        ("*local*", "<@UADMIN>"),
    ),
    "manual_release_request/stop": (
        lambda: release_blocks.manual_release_request(
            releases.ManualReleaseRequest(UNPRICED, 4, "cap", mode="stop")
        ),
        ("*local*",),
    ),
    "manual_release_reminder": (
        lambda: release_blocks.manual_release_reminder(
            releases.ManualReleaseReminder(UNPRICED, 4, NOW, NOW + timedelta(hours=1))
        ),
        ("*local*", "1 小时前", "`/gpu extend local 2h`"),
    ),
    "release_escalation": (
        lambda: release_blocks.release_escalation(
            releases.ReleaseEscalation(PRICED, 3, "HTTP 503", manual=False)
        ),
        ("*box*", "<@UOWNER>", "AWS", "3", "HTTP 503"),
    ),
    "release_escalation/manual": (
        lambda: release_blocks.release_escalation(
            releases.ReleaseEscalation(UNPRICED, 3, None, manual=True)
        ),
        ("*local*", "<@UOWNER>"),
    ),
    "released_notice": (
        lambda: release_blocks.released_notice(_released(by="UOWNER")),
        ("*cold1*", "<@UOWNER>"),
    ),
    "released_notice/stop": (
        lambda: release_blocks.released_notice(
            _released(mode="stop", reason="user", storage_bills=True, release_at=SOON)
        ),
        ("*cold1*", "`/gpu extend cold1 1d`", "`/gpu release cold1`"),
    ),
    "released_unwarned": (
        lambda: blocks.released_unwarned(rules.ReleasedUnwarned(PRICED)),
        ("*box*", "<@UOWNER>"),
    ),
    "released_outside": (
        lambda: reconcile_blocks.released_outside(reconcile.ReleasedOutside(PRICED, "terminated")),
        ("*box*", "AWS"),
    ),
    "released_outside/stopped": (
        lambda: reconcile_blocks.released_outside(reconcile.ReleasedOutside(COLD, "stopped")),
        ("*cold1*",),
    ),
    "released_outside/started": (
        lambda: reconcile_blocks.released_outside(
            reconcile.ReleasedOutside(PRICED, "started", "10.0.0.2:22")
        ),
        ("*box*", "`10.0.0.2:22`"),
    ),
    "stopped_reminder": (
        lambda: blocks.stopped_reminder(
            rules.StoppedReminder(
                COLD,
                instance_id=4,
                stopped_at=NOW - timedelta(days=3),
                storage_micros=240_000,
                release_at=NOW + timedelta(days=4),
                now=NOW,
                tz_name="Asia/Shanghai",
                last=True,
                can_start=True,
            )
        ),
        ("*cold1*",),
    ),
    "released_outside/started_by": (
        lambda: reconcile_blocks.released_outside(
            reconcile.ReleasedOutside(PRICED, "started", by="UOWNER", deadline_at=NOW)
        ),
        ("*box*", "<@UOWNER>"),
    ),
    "released_outside/moved": (
        lambda: reconcile_blocks.released_outside(
            reconcile.ReleasedOutside(PRICED, "moved", "10.0.0.3:22")
        ),
        ("*box*", "`10.0.0.3:22`"),
    ),
    "policy_summary": (
        lambda: blocks.policy_summary(
            policies.PolicyView("box", SOON, SOON, "wait-for-jobs", 3600, 1800, True)
        ),
        ("*box*", "最多 1 小时", "30 分钟后"),
    ),
    "policy_summary/stop": (
        lambda: blocks.policy_summary(
            policies.PolicyView("box", None, None, "stop", 7200, None, False)
        ),
        ("*box*", "2 小时后"),
    ),
    "policy_summary/release": (
        lambda: blocks.policy_summary(
            policies.PolicyView("box", None, None, "release", 0, None, False)
        ),
        ("*box*",),
    ),
    "answered_before": (
        lambda: answer_blocks.answered_before(answers.AnsweredBefore("UOWNER", "extended_1h")),
        ("<@UOWNER>", "1 小时"),
    ),
    "answered_before/kept": (
        lambda: answer_blocks.answered_before(answers.AnsweredBefore(None, "kept")),
        (),
    ),
    "being_released": (
        lambda: answer_blocks.being_released(answers.BeingReleased("box", "awaiting_confirmation")),
        ("*box*",),
    ),
    "release_pending": (
        lambda: answer_blocks.release_pending(answers.ReleasePending(PRICED, by_owner=False)),
        ("*box*", "<@UOWNER>", "`/gpu extend box 2h`"),
    ),
    "release_pending/owner": (
        lambda: answer_blocks.release_pending(answers.ReleasePending(PRICED, by_owner=True)),
        ("*box*",),
    ),
    "extend_answered": (
        lambda: answer_blocks.extend_answered(answers.Extended(PRICED, 14400, SOON, "UTC")),
        ("*box*", "4 小时"),
    ),
    "release_confirm": (
        lambda: answer_blocks.release_confirm(answers.ReleaseConfirmAsk(PRICED, 5)),
        ("*box*",),
    ),
    "kept": (lambda: answer_blocks.kept(answers.Kept(PRICED)), ("*box*",)),
    "release_answered": (
        lambda: answer_blocks.release_answered(answers.ReleaseAnswered(PRICED, "in_progress")),
        ("*box*",),
    ),
    "release_answered/confirmed": (
        lambda: answer_blocks.release_answered(answers.ReleaseAnswered(PRICED, "confirmed")),
        ("*box*",),
    ),
    "release_answered/owner": (
        lambda: answer_blocks.release_answered(answers.ReleaseAnswered(PRICED, "awaiting_owner")),
        ("*box*",),
    ),
    "rent_started": (
        lambda: rent_blocks.rent_started(rent.RentStarted("lambda", "gpu_1x_h100", ("r-1", "r-2"))),
        ("Lambda", "gpu_1x_h100", "r-1, r-2"),
    ),
    "rent_finished": (
        lambda: rent_blocks.rent_finished(
            rent.RentFinished("lambda", ("r-1",), (("i-9", "SSH timed out"),), "UOWNER")
        ),
        ("<@UOWNER>", "*r-1*", "i-9", "SSH timed out", "`/gpu status NAME`"),
    ),
    "rent_finished/nothing": (
        lambda: rent_blocks.rent_finished(rent.RentFinished("lambda", (), (), "UOWNER")),
        ("Lambda",),
    ),
    "rent_failed": (
        lambda: rent_blocks.rent_failed(rent.RentFailed("lambda", "quota exceeded")),
        ("Lambda", "quota exceeded"),
    ),
    "rent_failed/unknown": (
        lambda: rent_blocks.rent_failed(rent.RentFailed("lambda", None)),
        ("Lambda",),
    ),
    "rent_given_back_failed": (
        lambda: rent_blocks.rent_given_back_failed(
            rent.RentGivenBackFailed("lambda", "i-7", "no SSH", "HTTP 500")
        ),
        ("Lambda", "i-7", "no SSH", "HTTP 500"),
    ),
    "rent_recovered": (
        lambda: rent_blocks.rent_recovered(
            rent.RentRecovered("lambda", "i-8", "r-3", NOW, "restart")
        ),
        ("i-8", "r-3", "/gpu rent"),
    ),
    "rent_recover_failed": (
        lambda: rent_blocks.rent_recover_failed(
            rent.RentRecoverFailed("lambda", "i-8", None, "restart", "HTTP 500")
        ),
        ("i-8", "HTTP 500"),
    ),
    "rent_launch_checked": (
        lambda: rent_blocks.rent_launch_checked(
            rent.RentLaunchChecked("lambda", "gpu_8x_a100", NOW, "gpubot-r-4")
        ),
        ("gpu_8x_a100", "gpubot-r-4"),
    ),
}

#: The modules whose messages this file reads, one for each service of the area.
MODULES = (blocks, release_blocks, reconcile_blocks, answer_blocks, rent_blocks)

#: Renderers read elsewhere or whose words are not theirs: a platform account's unregistered
#: instance (read in test_instances_zh), or a service's reason.
ELSEWHERE = {
    reconcile_blocks.unregistered_found,
    reconcile_blocks.unregistered_notice,
    answer_blocks.release_refused,
}


def test_every_renderer_of_the_modules_is_read_in_chinese() -> None:
    covered = {name.split("/")[0] for name in CASES}
    renderers = {
        name
        for module in MODULES
        for name, function in inspect.getmembers(module, inspect.isfunction)
        if function.__module__ == module.__name__
        and not name.startswith("_")
        and inspect.signature(function).return_annotation == "Message"
    }
    assert covered == renderers - {function.__name__ for function in ELSEWHERE}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_message_reads_as_chinese_with_its_names(name: str) -> None:
    render, kept = CASES[name]
    with speaking("zh"):
        message = render()
    check_message(message)
    text, body = message
    assert_chinese(text, list(body))
    assert "\u3002 " not in text, "a space after a Chinese full stop"
    shown = text + "\n" + all_text(list(body))
    for part in kept:
        assert part in text, part
        assert part in shown, part


def _confirms(message: Message) -> dict[str, dict[str, Any]]:
    return {
        element["action_id"]: element["confirm"]
        for block in message[1]
        if block["type"] == "actions"
        for element in block["elements"]
        if "confirm" in element
    }


def test_buttons_and_their_confirm_dialogs_are_chinese() -> None:
    with speaking("zh"):
        warning = blocks.deadline_warning(_warning(PRICED))
        idle = blocks.idle_prompt(rules.IdlePrompt(PRICED, 2, NOW, NOW, None, "UTC"))
        ask = release_blocks.manual_release_request(
            releases.ManualReleaseRequest(UNPRICED, 4, "user")
        )
    labels = [
        element["text"]["text"]
        for message in (warning, idle, ask)
        for block in message[1]
        if block["type"] == "actions"
        for element in block["elements"]
    ]
    assert labels == [
        "延长 1 小时",
        "延长 4 小时",
        "立即释放",
        "保留",
        "释放",
        "已在平台上释放",
        "已在平台上停止（保留磁盘）",
    ]
    dialogs = _confirms(warning) | _confirms(idle) | _confirms(ask)
    assert len(dialogs) == 7
    assert_chinese(list(dialogs.values()))
    extend = dialogs[blocks.EXTEND_4H]
    assert extend["title"]["text"] == "将 box 延长 4 小时？"
    assert "*box* 继续运行到" in extend["text"]["text"]
    assert "8.40" in extend["text"]["text"]
    assert dialogs[blocks.RELEASE_NOW]["title"]["text"] == "立即释放 box？"
    assert "删除磁盘" in dialogs[blocks.IDLE_RELEASE]["text"]["text"]
    assert "2.10" in dialogs[blocks.IDLE_KEEP]["text"]["text"]
    assert all(dialog["deny"]["text"] == "取消" for dialog in dialogs.values())


def test_a_warning_in_chinese_says_when_and_what_it_costs() -> None:
    with speaking("zh"):
        text, _ = blocks.deadline_warning(_warning(PRICED))
        unpriced, _ = blocks.idle_prompt(rules.IdlePrompt(UNPRICED, 2, NOW, NOW, None, "UTC"))
    assert text.startswith(":alarm_clock: *box* 将在 *30 分钟* 后（")
    assert "2.10" in text
    assert "/小时" in text
    assert "未记录价格" in unpriced
