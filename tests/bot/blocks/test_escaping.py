"""Words from people and machines can mention nobody: in every renderer's fallback ``text`` (which
Slack reads as mrkdwn, like chat.postMessage's text) and in its mrkdwn blocks, ``&``, ``<`` and
``>`` arrive as entities, so ``<!channel>`` or ``<@U...>`` in a command, a project name or an
error message stays text. Only the mentions the bot means (owners, requesters) stay live."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from agents.protocol import Diagnosis, JobGpuStat, JobSummary
from bot.blocks import answers as answer_blocks
from bot.blocks import deadlines as blocks
from bot.blocks import instances, jobs, money, outbox
from bot.blocks import reconcile as reconcile_blocks
from bot.blocks import releases as release_blocks
from bot.blocks import rent as rent_blocks
from bot.blocks.kit import FALLBACK_TEXT_MAX, escape, fallback
from bot.services.instances import answers, policies, reconcile, releases, rent, starts
from bot.services.instances import deadlines as deadline_rules
from bot.services.instances.views import (
    CheckView,
    HealthView,
    InstanceBrief,
    InstanceDetail,
    InstanceSettings,
    JobBrief,
    Mismatch,
    ProblemView,
    ProcessView,
    RegisterResult,
    ReleaseAsk,
    ReleaseView,
    SettingsView,
    UnregisteredView,
)
from bot.services.jobs.views import (
    AccessChange,
    JobListView,
    JobView,
    LogView,
    WhoGpuView,
    WhoProcess,
    WhoReservation,
    WhoView,
)
from bot.services.money import advice
from bot.services.money.budgets import BudgetStatus
from bot.services.money.digest import DigestData, JobSpend, PlanSaving
from bot.services.speaking.outbox import PostFailed
from tests.bot.blocks.test_instances import NOW, gpus, inst, overview, row
from tests.bot.blocks.test_jobs import job
from tests.bot.blocks.test_money import report, spend_item

Message = tuple[str, tuple[dict[str, Any], ...]]

#: What someone might type, name a project, or a broken machine might print.
HOSTILE = "<!channel> & <@U0HOSTILE> <!here> <https://evil.example|click me>"
#: The mentions the bot itself makes in these messages (owners, requesters, admins).
BOT_MENTIONS = re.compile(r"<@(?!U0HOSTILE>)[UW][A-Z0-9]+>")
ENTITY = re.compile(r"&(?:amp|lt|gt);")
UTC = ZoneInfo("UTC")
USD = 1_000_000


def assert_inert(text: str, where: str) -> None:
    """No mention, link or bare ``&`` survives in ``text`` but the bot's own mentions."""
    rest = BOT_MENTIONS.sub("", text)
    assert "<" not in rest, f"{where}: {text!r}"
    assert ">" not in rest, f"{where}: {text!r}"
    assert "&" not in ENTITY.sub("", rest), f"{where}: {text!r}"


def mrkdwn_texts(node: Any) -> Iterator[str]:
    """Every mrkdwn text object in some blocks (plain_text is never parsed for mentions)."""
    if isinstance(node, dict):
        if node.get("type") == "mrkdwn":
            yield node["text"]
        for value in node.values():
            yield from mrkdwn_texts(value)
    elif isinstance(node, list | tuple):
        for item in node:
            yield from mrkdwn_texts(item)


def hostile_job(**changes: Any) -> JobView:
    values: dict[str, Any] = {
        "id": None,  # the job is then known as INSTANCE:AGENT_ID
        "agent_job_id": HOSTILE,
        "command": ("echo", HOSTILE),
        "note": HOSTILE,
        "state": "failed",
        "exit_code": 1,
        "summary": JobSummary(
            duration_s=60.0,
            cpu_avg_pct=None,
            gpus=(JobGpuStat(0, 10.0, 1024**3),),
            diagnoses=(Diagnosis("oom", HOSTILE),),
            log_tail=HOSTILE,
        ),
    }
    values.update(changes)
    return job(**values)


# --- every renderer, fed hostile words wherever it takes some ---------------------------------

_LAMBDA = InstanceBrief(
    name="box", owner_id="UOWNER", provider="lambda", price_micros_per_hour=2_100_000
)
_HOSTILE_INST = inst(
    host=HOSTILE,
    ssh_user="root",
    project=HOSTILE,
    gpu_model=HOSTILE,
    delivered_gpu_name=HOSTILE,
    provider_instance_id=HOSTILE,
    agent_version=HOSTILE,
)
_CHECKS = (CheckView(HOSTILE, "fail", HOSTILE, HOSTILE),)
_BRIEF = JobBrief(3, "j3", "UOTHER", HOSTILE, NOW - timedelta(minutes=5))
_HOSTILE_ROW = row(
    _HOSTILE_INST,
    live=False,
    gpus=gpus(2, name=HOSTILE),
    problem=ProblemView("Unreachable", HOSTILE, HOSTILE),
    running_jobs=(_BRIEF,),
    nvml_problem=HOSTILE,
    polled_at=NOW - timedelta(minutes=3),
)
_REGISTERED = RegisterResult(
    instance=_HOSTILE_INST,
    host_key_fingerprint=HOSTILE,
    agent_version=HOSTILE,
    health=HealthView(_HOSTILE_INST, "fail", _CHECKS, False),
    gpus=gpus(2, name=HOSTILE),
    mismatch=Mismatch(HOSTILE, 8, (HOSTILE,), (HOSTILE,)),
    re_registered=False,
    now=NOW,
    timezone="UTC",
)
_SPEND = report(
    [
        spend_item(0, name="box-0", project=HOSTILE, gpu_model=HOSTILE, idle_micros=USD),
        spend_item(1, gpu_model=HOSTILE),
    ],
    by="project",
)
_FIT = advice.fit("70b", "full")
_ESTIMATE = advice.estimate("4090", hours=Decimal(5), hourly_micros=500_000)

#: What holds the GPUs a queued job waits for, in hostile words (users, job references).
_HOSTILE_HELD = (
    WhoGpuView(
        0,
        HOSTILE,
        (WhoProcess(11, HOSTILE, None, None, HOSTILE, 70 * 1024**3),),
        util_gpu_pct=97,
        held_by=WhoReservation(HOSTILE, None, HOSTILE),
        unseen_mem_bytes=8 * 1024**3,
        free_for_jobs=False,
    ),
    WhoGpuView(1, HOSTILE, (WhoProcess(12, None, None, HOSTILE, None, None),)),
)

RENDERERS: dict[str, Callable[[], Message]] = {
    # jobs
    "queued_message": lambda: jobs.queued_message(
        hostile_job(state="queued", gpus_in_use=_HOSTILE_HELD)
    ),
    "completion_reply": lambda: jobs.completion_reply(hostile_job()),
    "job_list": lambda: jobs.job_list(JobListView(None, (hostile_job(),), problem=HOSTILE)),
    "log_message": lambda: jobs.log_message(LogView(hostile_job(), HOSTILE + "\n" * 3, 50)),
    "who_message": lambda: jobs.who_message(
        WhoView(
            "box1",
            (WhoGpuView(0, HOSTILE, (WhoProcess(11, HOSTILE, None, HOSTILE, HOSTILE, None),)),),
        )
    ),
    "cancel_message": lambda: jobs.cancel_message(hostile_job(state="cancelled")),
    "access_message": lambda: jobs.access_message(
        AccessChange("box1", "UOWNER", "U0BOB", True, True, ("U0ALICE",))
    ),
    "submitted_reply": lambda: jobs.submitted_reply(
        hostile_job(state="queued", gpus_in_use=_HOSTILE_HELD), True
    ),
    # instances
    "register_result": lambda: instances.register_result(_REGISTERED),
    "mismatch_notice": lambda: instances.mismatch_notice(_REGISTERED),
    "host_key_changed": lambda: instances.host_key_changed(
        _HOSTILE_INST, expected=HOSTILE, presented=HOSTILE
    ),
    "post_failed": lambda: outbox.post_failed(
        PostFailed("job_reply", "U0OWNER", 5, NOW, HOSTILE, None)
    ),
    "fleet_overview": lambda: instances.fleet_overview(overview([_HOSTILE_ROW])),
    "instance_list": lambda: instances.instance_list(overview([_HOSTILE_ROW])),
    "instance_detail": lambda: instances.instance_detail(
        InstanceDetail(
            row=_HOSTILE_ROW,
            now=NOW,
            timezone="UTC",
            hostname=HOSTILE,
            driver_version=HOSTILE,
            cuda_version=HOSTILE,
            processes=(ProcessView(0, 4242, HOSTILE, HOSTILE, 1024**3, HOSTILE),),
            compute_cost_micros=USD,
            storage_cost_micros=USD,
        )
    ),
    "health_report": lambda: instances.health_report(
        HealthView(_HOSTILE_INST, "fail", _CHECKS, False)
    ),
    "extended": lambda: instances.extended(_HOSTILE_INST, now=NOW, timezone="UTC"),
    "release_ask": lambda: instances.release_ask(
        ReleaseAsk(_HOSTILE_INST, manual=False, cost_micros=USD, running_jobs=(_BRIEF,))
    ),
    "release_result": lambda: instances.release_result(
        ReleaseView(_HOSTILE_INST, 1, "escalated", False, HOSTILE)
    ),
    "release_cancelled": lambda: instances.release_cancelled(_HOSTILE_INST),
    "start_result": lambda: instances.start_result(
        starts.StartResult(_HOSTILE_INST, started=False, platform_state=HOSTILE)
    ),
    "instance_settings": lambda: instances.instance_settings(
        InstanceSettings(
            _HOSTILE_INST,
            SettingsView(HOSTILE, "release", 0, None, False, None, "hour", 0, None, 0),
            NOW,
            "UTC",
        )
    ),
    "unregistered_notice": lambda: reconcile_blocks.unregistered_notice(
        UnregisteredView(
            provider="vast",
            provider_id=HOSTILE,
            name=HOSTILE,
            state="running",
            raw_state=HOSTILE,
            gpu_model=HOSTILE,
            gpu_count=2,
            price_micros_per_hour=712_000,
            currency="USD",
            launched_at=NOW - timedelta(hours=3),
            tags=((HOSTILE, HOSTILE),),
            now=NOW,
            timezone="UTC",
        )
    ),
    # deadlines
    "deadline_warning": lambda: blocks.deadline_warning(
        deadline_rules.DeadlineWarning(
            _LAMBDA,
            prompt_id=1,
            deadline_at=NOW + timedelta(minutes=30),
            release_at=NOW + timedelta(minutes=40),
            now=NOW,
            tz_name="UTC",
            policy="wait-for-jobs",
            capped=True,
        )
    ),
    "release_confirm": lambda: answer_blocks.release_confirm(answers.ReleaseConfirmAsk(_LAMBDA, 1)),
    "decided": lambda: release_blocks.decided(
        releases.Decided(_LAMBDA, releases.KEPT, by="U0ALICE", at=NOW, tz_name="UTC")
    ),
    "superseded": lambda: blocks.superseded(deadline_rules.Superseded(_LAMBDA, NOW, "UTC")),
    "busy_again": lambda: blocks.busy_again(deadline_rules.BusyAgain(_LAMBDA)),
    "new_jobs": lambda: blocks.new_jobs(deadline_rules.NewJobs(_LAMBDA)),
    "idle_prompt": lambda: blocks.idle_prompt(
        deadline_rules.IdlePrompt(_LAMBDA, 1, NOW - timedelta(hours=1), NOW, NOW, "UTC")
    ),
    "jobs_done_prompt": lambda: blocks.jobs_done_prompt(
        deadline_rules.JobsDonePrompt(_LAMBDA, 1, NOW, "UTC")
    ),
    "manual_release_request": lambda: release_blocks.manual_release_request(
        releases.ManualReleaseRequest(_LAMBDA, instance_id=1, reason=HOSTILE)
    ),
    "manual_release_reminder": lambda: release_blocks.manual_release_reminder(
        releases.ManualReleaseReminder(_LAMBDA, 1, asked_at=NOW, now=NOW + timedelta(hours=1))
    ),
    "release_escalation": lambda: release_blocks.release_escalation(
        releases.ReleaseEscalation(_LAMBDA, attempts=3, last_error=HOSTILE, manual=False)
    ),
    "released_notice": lambda: release_blocks.released_notice(
        releases.ReleasedNotice(
            _LAMBDA, mode="stop", reason="idle", storage_bills=True, by="U0ALICE"
        )
    ),
    "released_outside": lambda: reconcile_blocks.released_outside(
        reconcile.ReleasedOutside(_LAMBDA, state="stopped")
    ),
    "stopped_reminder": lambda: blocks.stopped_reminder(
        deadline_rules.StoppedReminder(
            InstanceBrief(
                name=HOSTILE,
                owner_id="UOWNER",
                provider=HOSTILE,
                price_micros_per_hour=2_100_000,
                storage_micros_per_hour=100_000,
            ),
            instance_id=7,
            stopped_at=NOW - timedelta(days=3),
            storage_micros=7_200_000,
            release_at=None,
            now=NOW,
            tz_name="UTC",
            last=True,
            can_start=True,
        )
    ),
    "released_unwarned": lambda: blocks.released_unwarned(deadline_rules.ReleasedUnwarned(_LAMBDA)),
    "unregistered_found": lambda: reconcile_blocks.unregistered_found(
        reconcile.UnregisteredFound(
            UnregisteredView(
                provider="vast",
                provider_id=HOSTILE,
                name=HOSTILE,
                state="running",
                raw_state=HOSTILE,
                gpu_model=HOSTILE,
                gpu_count=2,
                price_micros_per_hour=712_000,
                currency="USD",
                launched_at=NOW - timedelta(hours=3),
                tags=((HOSTILE, HOSTILE),),
                now=NOW,
                timezone="UTC",
            )
        )
    ),
    "policy_summary": lambda: blocks.policy_summary(
        policies.PolicyView(
            name="box",
            deadline_at=NOW,
            lifetime_cap_at=NOW,
            at_deadline="wait-for-jobs",
            max_grace_s=3600,
            idle_release_after_s=1800,
            release_when_done=True,
            tz_name="UTC",
        )
    ),
    "answered_before": lambda: answer_blocks.answered_before(
        answers.AnsweredBefore("U0ALICE", "extended_1h")
    ),
    "being_released": lambda: answer_blocks.being_released(
        answers.BeingReleased("box", "releasing")
    ),
    "release_pending": lambda: answer_blocks.release_pending(answers.ReleasePending(_LAMBDA, True)),
    "extend_answered": lambda: answer_blocks.extend_answered(
        answers.Extended(_LAMBDA, 3600, NOW, "UTC")
    ),
    "kept": lambda: answer_blocks.kept(answers.Kept(_LAMBDA)),
    "release_answered": lambda: answer_blocks.release_answered(
        answers.ReleaseAnswered(_LAMBDA, "escalated")
    ),
    "release_refused": lambda: answer_blocks.release_refused(
        answers.ReleaseRefused("box is already released.")
    ),
    "rent_started": lambda: rent_blocks.rent_started(
        rent.RentStarted("lambda", HOSTILE, ("box-1", "box-2"))
    ),
    "rent_finished": lambda: rent_blocks.rent_finished(
        rent.RentFinished("lambda", ("box-1",), ((HOSTILE, HOSTILE),), "UOWNER")
    ),
    "rent_failed": lambda: rent_blocks.rent_failed(rent.RentFailed("lambda", HOSTILE)),
    "rent_given_back_failed": lambda: rent_blocks.rent_given_back_failed(
        rent.RentGivenBackFailed("lambda", HOSTILE, HOSTILE, HOSTILE)
    ),
    "rent_recovered": lambda: rent_blocks.rent_recovered(
        rent.RentRecovered("lambda", HOSTILE, HOSTILE, NOW, HOSTILE)
    ),
    "rent_recover_failed": lambda: rent_blocks.rent_recover_failed(
        rent.RentRecoverFailed("lambda", HOSTILE, HOSTILE, HOSTILE, HOSTILE)
    ),
    "rent_launch_checked": lambda: rent_blocks.rent_launch_checked(
        rent.RentLaunchChecked("lambda", HOSTILE, NOW, HOSTILE)
    ),
    # money
    "spend_message": lambda: money.spend_message(_SPEND),
    "digest_message": lambda: money.digest_message(
        DigestData(
            month="2026-03",
            report=_SPEND,
            previous_total_micros=USD,
            savings=(PlanSaving(HOSTILE, "U0005", HOSTILE, 2000 * USD, 1570 * USD, "runpod"),),
            jobs=(JobSpend(HOSTILE, HOSTILE, "U0005", HOSTILE, 7200, 6 * USD),),
        )
    ),
    "budget_list_message": lambda: money.budget_list_message(
        [BudgetStatus(1, "project", HOSTILE, 100 * USD, 85 * USD)], "2026-03", "USD"
    ),
    "budget_alert_message": lambda: money.budget_alert_message(
        BudgetStatus(1, "project", HOSTILE, 100 * USD, 120 * USD), 100, "USD"
    ),
    "fit_message": lambda: money.fit_message(
        replace(_FIT, model=replace(_FIT.model, name=HOSTILE))
    ),
    "estimate_message": lambda: money.estimate_message(replace(_ESTIMATE, gpu_name=HOSTILE), "USD"),
}


def _renderers() -> set[str]:
    """The names of every function in the renderer modules that returns a Message."""
    found = set()
    for module in (
        jobs,
        instances,
        blocks,
        release_blocks,
        reconcile_blocks,
        answer_blocks,
        rent_blocks,
        outbox,
        money,
    ):
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if (
                function.__module__ == module.__name__
                and not name.startswith("_")
                and inspect.signature(function).return_annotation == "Message"
            ):
                found.add(name)
    return found


def test_every_renderer_is_walked() -> None:
    assert set(RENDERERS) == _renderers()


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_no_renderer_lets_a_mention_or_link_through(name: str) -> None:
    text, body = RENDERERS[name]()
    assert_inert(text, f"{name} text")
    for shown in mrkdwn_texts(body):
        assert_inert(shown, f"{name} blocks")


@pytest.mark.parametrize(
    "name",
    [
        "queued_message",
        "completion_reply",
        "job_list",
        "log_message",
        "cancel_message",
        "submitted_reply",
        "register_result",
        "instance_detail",
        "release_result",
        "post_failed",
        "release_escalation",
        "rent_started",
        "rent_finished",
        "rent_failed",
        "rent_given_back_failed",
        "rent_recovered",
        "rent_recover_failed",
        "rent_launch_checked",
        "budget_alert_message",
        "fit_message",
        "estimate_message",
    ],
)
def test_the_fallback_text_keeps_the_words_as_entities(name: str) -> None:
    text, _ = RENDERERS[name]()
    assert "&lt;!channel&gt; &amp; &lt;@U0HOSTILE&gt;" in text, text


# --- the job from the brief, end to end through the renderers --------------------------------


def test_a_command_that_mentions_the_channel_mentions_nobody() -> None:
    command = ("echo", "<!channel>", "&", "<@U123>")
    shown = "echo '&lt;!channel&gt;' '&amp;' '&lt;@U123&gt;'"
    text, body = jobs.queued_message(job(state="queued", command=command))
    assert shown in text
    assert shown in json.dumps(body)
    text, body = jobs.completion_reply(job(command=command))
    assert shown in json.dumps(body)
    for everything in (
        json.dumps(jobs.queued_message(job(command=command))),
        text + json.dumps(body),
    ):
        assert "<!channel>" not in everything
        assert "<@U123>" not in everything


def test_a_clipped_fallback_never_ends_inside_an_entity() -> None:
    for pad in range(8):
        text = "x" * (FALLBACK_TEXT_MAX - pad) + escape("<<<<")
        clipped = fallback(text)
        assert len(clipped) <= FALLBACK_TEXT_MAX
        assert re.search(r"&[a-z]*…$", clipped) is None, clipped[-8:]
        assert clipped.endswith("…")
