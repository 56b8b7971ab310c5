"""Money and job messages in Simplified Chinese: every sentence translated, the names and
amounts still in them, and still within Slack's limits."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from decimal import Decimal

from agents import diagnose
from agents.diagnose import GpuPoint, Sample
from agents.protocol import Diagnosis, JobGpuStat, JobSummary
from bot.blocks import jobs, money
from bot.blocks.kit import escape
from bot.i18n import speaking
from bot.services.jobs.views import (
    AccessChange,
    JobListView,
    LogView,
    WhoGpuView,
    WhoProcess,
    WhoReservation,
    WhoView,
)
from bot.services.money import advice
from bot.services.money.budgets import BudgetStatus
from bot.services.money.costs import FinalCost
from bot.services.money.digest import DigestData, JobSpend, PlanSaving
from bot.values import format_money
from tests.bot.blocks.slack_limits import Message, all_text, check_message
from tests.bot.blocks.test_jobs import job
from tests.bot.blocks.test_money import report, spend_item
from tests.chinese import assert_chinese

USD = 1_000_000
GIB = 1024**3


def chinese(message: Message) -> str:
    """Assert ``message`` is valid for Slack and has no English sentence; returns all its text."""
    blocks = check_message(message)
    assert_chinese(message[0], blocks)
    return message[0] + "\n" + all_text(blocks)


def zh_money(micros: int) -> str:
    with speaking("zh"):
        return format_money(micros, "USD")


def test_spend_report_so_far_and_complete() -> None:
    items = [
        spend_item(0, idle_micros=USD // 2, storage_micros=250_000, unmeasured_micros=USD // 10),
        spend_item(1, project="llm-训练"),
    ]
    so_far = replace(
        report(items, by="project", complete=False),
        now=datetime(2026, 3, 5, 12, 30),
        charged_until=datetime(2026, 3, 5, 12),
    )
    with speaking("zh"):
        shown = chinese(money.spend_message(so_far))
        complete = chinese(money.spend_message(report(items, by="gpu"), shared=True))
        empty = chinese(money.spend_message(report([])))
        titles = money.spend_file_titles(report(items, by="user"))
    assert "2026年3月" in shown
    assert "12:30" in shown
    assert "llm-训练" in shown
    assert "box-0" in shown
    assert zh_money(3_250_000) in shown
    assert "`--share`" in shown
    assert "box-1" in complete
    assert "2026年3月" in empty
    assert_chinese(*titles)
    assert all("2026年3月" in title for title in titles)


def test_digest() -> None:
    data = DigestData(
        month="2026-03",
        report=report([spend_item(0, project="llm", idle_micros=USD), spend_item(5)]),
        previous_total_micros=4 * USD,
        savings=(PlanSaving("box-5", "U0005", "h100-sxm", 2000 * USD, 1570 * USD, "runpod"),),
        jobs=(JobSpend("j-1", "box-5", "U0005", "python train.py", 7200, 6 * USD),),
    )
    with speaking("zh"):
        shown = chinese(money.digest_message(data))
        title = money.digest_chart_title("2026-03")
    assert "box-5" in shown
    assert "`j-1`" in shown
    assert "<@U0005>" in shown
    assert "75%" in shown
    assert zh_money(430 * USD) in shown
    assert_chinese(title)
    assert "2026年3月" in title


def test_budgets_and_their_alerts() -> None:
    statuses = [
        BudgetStatus(1, "user", "UALICE", 100 * USD, 85 * USD),
        BudgetStatus(2, "project", "llm", 100 * USD, 120 * USD),
    ]
    with speaking("zh"):
        listed = chinese(
            money.budget_list_message(statuses, "2026-03", "USD", now=datetime(2026, 3, 5, 9))
        )
        none = chinese(money.budget_list_message([], "2026-03", "USD"))
        used_up = chinese(money.budget_alert_message(statuses[1], 100, "USD"))
        warned = chinese(money.budget_alert_message(statuses[0], 80, "USD"))
    assert "<@UALICE>" in listed
    assert "*llm*" in listed
    assert zh_money(85 * USD) in listed
    assert "`/gpu budget set user @alice 500`" in none
    assert "*llm*" in used_up
    assert zh_money(120 * USD) in used_up
    assert "80%" in warned


def test_fit() -> None:
    with speaking("zh"):
        big = chinese(money.fit_message(advice.fit("70b", "full")))
        small = chinese(money.fit_message(advice.fit("llama-3.1-8b", "inference")))
        nothing = chinese(money.fit_message(replace(advice.fit("7b", "lora"), fits=())))
    assert "llama-3.1-70b" in big
    assert "NVIDIA H100" in big
    assert "70.3 GiB" in big
    assert "KV 缓存" in small
    assert "64" in nothing


def test_estimate() -> None:
    estimate = advice.estimate(
        "a100-sxm4-80gb",
        hours=Decimal(50),
        count=2,
        hourly_micros=869_000,
        monthly_micros=1015 * USD,
        buy_micros=4031 * USD,
    )
    # The options' details and the prices' sources are the services' words, not this module's.
    estimate = replace(
        estimate,
        options=tuple(replace(option, detail="A100") for option in estimate.options),
        hourly_source="runpod",
        monthly_source="runpod",
        buy_source="runpod",
    )
    with speaking("zh"):
        shown = chinese(money.estimate_message(estimate, "USD"))
    assert "2x NVIDIA A100" in shown
    assert "50" in shown
    assert zh_money(4031 * USD) in shown
    assert "--price" in shown


def test_what_a_session_cost() -> None:
    cost = FinalCost(4 * USD, 4 * USD, USD // 2, 4200, 7200, 2 * USD, "USD")
    with speaking("zh"):
        texts = [
            money.final_cost_text(cost),
            money.final_cost_sentence(cost),
            money.final_cost_sentence(replace(cost, carried=True), stopped=True),
            money.final_cost_text(replace(cost, started=False)),
        ]
    assert_chinese(*texts)
    assert zh_money(4 * USD) in texts[0]
    assert "1 小时 10 分，按 2 小时计费" in texts[0]
    assert "/小时" in texts[0]


def test_job_queued_finished_and_cancelled() -> None:
    queued = job(
        state="queued",
        gpus_assigned=(),
        gpus_requested="any:2",
        retries=2,
        release_when_done=True,
        summary=None,
    )
    finished = job(state="failed", exit_code=1, retries=1, attempt=2, cancelled_by="U0BOB")
    with speaking("zh"):
        shown = chinese(jobs.queued_message(queued))
        reply = jobs.completion_reply(finished)
        replied = chinese(reply)
        cancelled = chinese(jobs.cancel_message(replace(finished, state="cancelled")))
        submitted = chinese(jobs.submitted_reply(queued, True))
    assert "box1" in shown
    assert "`20261202-120000-ab12`" in shown
    assert "python train.py --lr 3e-4" in shown
    assert "<@U0BOB>" in replied
    assert zh_money(6_300_000) in replied
    assert "70.0 GiB" in replied
    (button,) = reply[1][-1]["elements"]
    assert button["text"]["text"] == "释放实例"
    assert "box1" in cancelled
    assert "42" in submitted


def test_job_list_and_log() -> None:
    listed = JobListView(None, (job(), job(state="running", summary=None)), None)
    log = LogView(job(state="running"), "epoch 1\nepoch 2\n", 50, state_stale=True)
    with speaking("zh"):
        fleet = chinese(jobs.job_list(listed))
        empty = chinese(jobs.job_list(JobListView("box1", ())))
        shown = chinese(jobs.log_message(log))
        blank = chinese(jobs.log_message(replace(log, text="")))
    assert "box1" in fleet
    assert zh_money(6_300_000) in fleet
    assert "box1" in empty
    assert "epoch 2" in shown
    assert "`/gpu logs 42 --tail N`" in shown
    assert "42" in blank


def test_who_uses_the_gpus() -> None:
    process = WhoProcess(11, "root", "U1", "j1", "python a.py", 3 * GIB, 87, 101.0, 3700.0)
    gpus = (
        WhoGpuView(
            0,
            "H100",
            (process,),
            90,
            WhoReservation("j2", None, "bob", starting=True),
            (WhoReservation("j3", "U3", None),),
            10 * GIB,
            80 * GIB,
            2 * GIB,
        ),
        WhoGpuView(1, "H100", (), None, None, (), None, None, 5 * GIB),
        WhoGpuView(2, "H100", (), 0, None, (), 0, 80 * GIB),
    )
    view = WhoView("box1", gpus, (WhoReservation("j5", None, "carol", wanted="2"),))
    with speaking("zh"):
        shown = chinese(jobs.who_message(view))
        none = chinese(jobs.who_message(WhoView("box1", ())))
    assert "box1" in shown
    assert "<@U1>" in shown
    assert "`j2`" in shown
    assert "carol" in shown
    assert "box1" in none


def test_access_changes() -> None:
    with speaking("zh"):
        for granted in (True, False):
            for changed in (True, False):
                change = AccessChange("box1", "UOWNER", "UPAL", granted, changed, ())
                shown = chinese(jobs.access_message(change))
                assert "*box1*" in shown
                assert "<@UPAL>" in shown
                assert "<@UOWNER>" in shown


def test_english_again_after_a_chinese_block() -> None:
    with speaking("zh"):
        assert money.month_name("2026-03") == "2026年3月"
    assert money.month_name("2026-03") == "March 2026"
    shown = json.dumps(jobs.completion_reply(job()), ensure_ascii=False)
    assert "Job 42 on box1 succeeded" in shown
    assert "Release instance" in shown


def test_unknown_use_and_a_job_without_gpus() -> None:
    summary = JobSummary(
        duration_s=10.0,
        cpu_avg_pct=None,
        gpus=(JobGpuStat(0, None, None),),
        diagnoses=(),
        log_tail="",
    )
    cpu_only = job(gpus_assigned=(), gpus_requested="none", summary=summary)
    with speaking("zh"):
        shown = chinese(jobs.completion_reply(cpu_only))
        text = jobs.gpus_text(job(state="queued", gpus_assigned=(), gpus_requested="0,1"))
    assert "GPU 0" in shown
    assert_chinese(text)
    assert "CUDA_VISIBLE_DEVICES=0,1" in text


def test_a_job_waiting_for_gpus_others_hold_and_who_marks_them() -> None:
    from tests.bot.blocks.test_jobs import HELD_GPUS

    waiting = job(state="queued", gpus_assigned=(), gpus_in_use=HELD_GPUS, summary=None)
    with speaking("zh"):
        queued = chinese(jobs.queued_message(waiting))
        answer = chinese(jobs.submitted_reply(waiting, True))
        busy = WhoGpuView(4, "A800", (), util_gpu_pct=97, free_for_jobs=False)
        who = chinese(jobs.who_message(WhoView("box1", (*HELD_GPUS, busy))))
    for shown in (queued, answer):
        assert "pid 4242 · mallory · 70.0 GiB · 不是 gpubot 的任务" in shown
        assert "已占用 78.0 GiB，看不到进程" in shown
        assert "<@U0BOB>" in shown
    assert "被 gpubot 以外的程序占用：新任务会等它空出来" in who
    assert "GPU 4: 正被 gpubot 以外的程序使用" in who


def _agent_diagnoses() -> tuple[Diagnosis, ...]:
    """The five diagnoses as the agent makes them from a job's samples and log."""
    idle = [
        Sample(float(i), 400.0, (GpuPoint(0, 5.0, GIB), GpuPoint(1, 0.0, GIB))) for i in range(6)
    ]
    skewed = [
        Sample(float(i), 100.0, (GpuPoint(0, 95.0, 40 * GIB), GpuPoint(1, 2.0, 40 * GIB)))
        for i in range(6)
    ]
    unused = [Sample(float(i), 5.0, (GpuPoint(0, 0.0, 0),)) for i in range(6)]
    totals = {0: 80 * GIB, 1: 80 * GIB}
    stats = diagnose.gpu_stats(idle, (0, 1))
    found = (
        diagnose.cuda_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"),
        diagnose.memory_leak([10 * GIB + i * GIB // 4 for i in range(40)], 0, 80 * GIB),
        diagnose.dataloader_bound(idle, stats, 400.0),
        diagnose.gpu_imbalance(skewed, diagnose.gpu_stats(skewed, (0, 1))),
        diagnose.gpu_unused(unused, diagnose.gpu_stats(unused, (0,)), totals),
    )
    assert all(d is not None for d in found)
    return tuple(d for d in found if d is not None)


def test_a_finished_jobs_diagnoses_are_chinese() -> None:
    found = _agent_diagnoses()
    assert [d.code for d in found] == [
        "cuda_oom",
        "memory_leak",
        "dataloader_bound",
        "gpu_imbalance",
        "gpu_unused",
    ]
    failed = job(
        state="failed",
        exit_code=1,
        summary=JobSummary(
            duration_s=600.0, cpu_avg_pct=400.0, gpus=(), diagnoses=found, log_tail=""
        ),
    )
    for one in found:
        alone = replace(failed, summary=JobSummary(600.0, 400.0, (), (one,)))
        with speaking("zh"):
            chinese(jobs.completion_reply(alone))
    with speaking("zh"):
        replied = chinese(jobs.completion_reply(failed))
    assert "7.2 GiB" in replied  # the leak's rise, written out by the bot
    assert "`torchrun --nproc_per_node=2`" in replied
    assert "95%" in replied
    assert "2%" in replied
    _, body = jobs.completion_reply(failed)
    english = json.dumps(body, ensure_ascii=False)
    for one in found:
        assert json.dumps(escape(one.message), ensure_ascii=False)[1:-1] in english


def test_a_diagnosis_from_an_agent_before_templates_reads_as_it_was_sent() -> None:
    old = Diagnosis(code="cuda_oom", message="The job ran out of GPU memory.")
    failed = job(
        state="failed",
        summary=JobSummary(duration_s=6.0, cpu_avg_pct=None, gpus=(), diagnoses=(old,)),
    )
    with speaking("zh"):
        text = all_text(check_message(jobs.completion_reply(failed)))
    assert "The job ran out of GPU memory." in text
