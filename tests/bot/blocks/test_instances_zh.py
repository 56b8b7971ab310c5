"""Instance renderers in Simplified Chinese: every message of bot.blocks.instances reads as
Chinese, keeps its names and numbers, and stays within Slack's limits."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from agents.nvml import HINTS
from bot.blocks import instances as render
from bot.blocks import reconcile as reconcile_blocks
from bot.blocks import render as render_notice
from bot.blocks.kit import Message
from bot.i18n import speaking
from bot.services.instances.lookup import HostKeyAlert
from bot.services.instances.registration import GpuMismatch
from bot.services.instances.views import (
    CheckView,
    HealthView,
    InstanceSettings,
    JobBrief,
    Mismatch,
    ProblemView,
    ReleaseAsk,
    ReleaseView,
    UnregisteredView,
)
from bot.values import format_money
from tests.bot.blocks.slack_limits import all_text, check_message
from tests.bot.blocks.test_instances import (
    NOW,
    detail,
    gpus,
    inst,
    overview,
    registered,
    row,
    settings,
)
from tests.chinese import assert_chinese

JOB = JobBrief(3, "j3", "UOTHER", "python train.py", NOW - timedelta(minutes=5))
CHECKS = (
    CheckView("driver", "pass", "550.54.15", ""),
    CheckView("ecc", "fail", "ECC: 2", "RMA"),
    CheckView("cuda", "skip", "--full", ""),
)
MISMATCH = Mismatch("h100", 8, ("NVIDIA A100-SXM4-80GB",), ("1/8",))
STOPPED = inst(
    "cold1", state="stopped", stopped_at=NOW - timedelta(hours=1), storage_micros_per_hour=50_000
)


def chinese(message: Message, *names: str) -> str:
    """Assert ``message`` is accepted by Slack and reads as Chinese with ``names`` in it;
    returns its text and blocks' text."""
    text, blocks = message
    check_message(message)
    assert_chinese(text, list(blocks))
    shown = text + "\n" + all_text(list(blocks))
    for name in names:
        assert name in shown, name
    return shown


def money(micros: int) -> str:
    """An amount of dollars as the active language writes it."""
    return format_money(micros, "USD")


def fleet_rows() -> list[Any]:
    problem = ProblemView("Unreachable", "box2: 连接被拒绝", "")
    return [
        row(running_jobs=(JOB, JOB)),
        row(inst("box2"), live=False, problem=problem, polled_at=NOW - timedelta(minutes=7)),
        row(inst("box3"), live=False, gpus=gpus(2), polled_at=NOW - timedelta(minutes=3)),
        row(inst("box4"), live=False, gpus=(), polled_at=None),
        row(inst("box5", gpu_model="A100"), gpus=gpus(4, "RTX 4090"), mismatch=MISMATCH),
        row(STOPPED, live=False, gpus=()),
        row(inst("box6", state="releasing"), nvml_problem="NVML: 999"),
    ]


def test_the_fleet_and_the_list_in_chinese() -> None:
    with speaking("zh"):
        shown = chinese(
            render.fleet_overview(overview(fleet_rows())), "box1", "box2", "box4", "cold1"
        )
        listed = chinese(render.instance_list(overview(fleet_rows())), "box1", "box6")
        empty = chinese(render.fleet_overview(overview([])), "/gpu register")
        spent = money(48_000_000)
    assert "GPU 实例总览（7）" in shown
    assert "利用率 50%" in shown
    assert "显存 80/640 GiB" in shown
    assert f"注册以来已花费 {spent}" in shown
    assert "1 个无法连接" in shown
    assert "磁盘将在 3 小时 15 分后释放" in shown
    assert "租用 8x A100，交付 4x RTX 4090" in shown
    assert "尚未查询" in listed
    assert "实例列表（7）" in listed
    assert "还没有实例" in empty


def test_a_fleet_too_big_for_one_message_says_so_in_chinese() -> None:
    job = JobBrief(1, "j", "UOTHER", "x" * 5000, NOW)
    rows = [row(inst(f"n{i}" * 30), running_jobs=(job,)) for i in range(400)]
    with speaking("zh"):
        shown = chinese(render.fleet_overview(overview(rows)), "n0")
    assert "段未显示" in shown


def test_one_instance_in_chinese() -> None:
    big = row(
        inst("big1", agent_version="0.1.0"),
        gpus=gpus(64),
        running_jobs=tuple(JOB for _ in range(80)),
    )
    with speaking("zh"):
        shown = chinese(render.instance_detail(detail(settings=settings())), "box1", "$49.50")
        stopped = chinese(render.instance_detail(detail(row=row(STOPPED, gpus=()))), "cold1")
        huge = chinese(render.instance_detail(detail(row=big)), "big1")
        storage = money(1_500_000)
    assert "*所有者*" in shown
    assert f"（其中存储 {storage}）" in shown
    assert "驱动 550.54.15、CUDA 12.4" in shown
    assert "进程 4242" in shown
    assert "• 到期时：等待运行中的任务结束，最多 2 小时" in shown
    assert "释放…" in shown
    assert "box1：运行中，" in shown
    assert "已关机（" in stopped
    assert "块 GPU 未显示" in huge
    assert "个任务未显示" in huge


def test_the_settings_in_chinese() -> None:
    view = InstanceSettings(inst(), settings(), NOW, "Europe/Berlin")
    stop = settings(at_deadline="stop", max_grace_s=86_400)
    plain = settings(
        at_deadline="release",
        idle_release_after_s=None,
        release_when_done=False,
        lifetime_cap_at=None,
        min_charge_s=0,
        disk_gb=None,
        storage_micros_per_gb_month=0,
    )
    with speaking("zh"):
        shown = chinese(render.instance_settings(view), "box1", "/gpu policy box1")
        stopping = chinese(render.instance_settings(replace(view, settings=stop)), "box1")
        bare = chinese(render.instance_settings(replace(view, settings=plain)), "box1")
        per_gb = money(100_000)
    assert "• 计费：按分钟计费，最低收费 1 分钟" in shown
    assert f"• 磁盘：200 GB，每 GB 每月 {per_gb}" in shown
    assert "截止时间过后 1 天释放" in stopping
    assert "• 最长期限：无" in bare
    assert "• 任务完成后：保留" in bare


@pytest.mark.parametrize("full", [False, True])
def test_health_in_chinese(full: bool) -> None:
    view = HealthView(instance=inst(), status="fail", checks=CHECKS, full=full)
    with speaking("zh"):
        shown = chinese(render.health_report(view), "box1", "ecc")
    assert "box1 的" in shown
    assert "失败" in shown
    assert "1 项失败、1 项通过、1 项跳过" in shown


def test_registration_answers_in_chinese() -> None:
    result = registered(
        mismatch=MISMATCH,
        gpus=gpus(1, "NVIDIA A100-SXM4-80GB"),
        settings=settings(),
        default_deadline_s=3600,
        health=HealthView(inst(), "fail", CHECKS, False),
        instance=inst(project="llm"),
    )
    with speaking("zh"):
        shown = chinese(render.register_result(result), "box1", "root@203.0.113.7:2222", "llm")
        again = chinese(render.register_result(registered(re_registered=True)), "box1")
        blind = chinese(render.register_result(registered(gpus=())), "box1")
        notice = chinese(render.mismatch_notice(result), "box1", "<@UOWNER>")
        alert = chinese(
            render.host_key_changed(inst(), expected="SHA256:old", presented="SHA256:new"),
            "box1",
            "`SHA256:old`",
            "`SHA256:new`",
        )
        rendered = (
            render_notice(GpuMismatch(result)),
            render_notice(HostKeyAlert(inst(), expected="SHA256:old", presented="SHA256:new")),
        )
    assert "已注册 box1（root@203.0.113.7:2222）。" in shown
    assert "交付的 GPU 与租用的不符！" in shown
    assert "（默认值；" in shown
    assert "已重新注册 box1" in again
    assert "*GPU*\n看不到" in blind
    assert "租用 8x h100，交付 1x NVIDIA A100-SXM4-80GB" in notice
    assert "/gpu register box1 root@203.0.113.7:2222" in alert
    for message in rendered:
        check_message(message)
        assert_chinese(message[0], list(message[1]))


def test_extend_and_release_in_chinese() -> None:
    capped = inst(lifetime_cap_at=NOW + timedelta(hours=5))
    ask = ReleaseAsk(instance=inst(), manual=True, cost_micros=12_340_000, running_jobs=(JOB,))
    with speaking("zh"):
        extended = chinese(render.extended(capped, now=NOW, timezone="UTC"), "box1")
        asks = [
            chinese(render.release_ask(replace(ask, manual=manual, mode=mode)), "box1", "$12.34")
            for manual in (True, False)
            for mode in ("terminate", "stop")
        ]
        free = chinese(
            render.release_ask(replace(ask, instance=inst(price_micros_per_hour=0), cost_micros=0)),
            "box1",
        )
        nothing = money(0)
        results = [
            chinese(render.release_result(ReleaseView(inst(), 1, state, manual, error)), "box1")
            for state, manual in (
                ("confirmed", False),
                ("awaiting_owner", True),
                ("pending", False),
                ("escalated", False),
            )
            for error in (None, "HTTP 500")
        ]
        stopped = chinese(
            render.release_result(ReleaseView(STOPPED, 1, "confirmed", False, None, "stop")),
            "cold1",
        )
        cancelled = chinese(render.release_cancelled(inst()), "box1")
    assert "截止时间现在是" in extended
    assert "管理员已把它的最长期限设为" in extended
    assert "还有 1 个任务在运行" in asks[0]
    assert "确认释放 box1" in asks[0]
    assert "确认关机 box1" in asks[1]
    assert "机器人会在 手动登记 上释放它。" in asks[2]
    assert f"它至今已花费 {nothing}。" in free
    assert "已释放" in results[0]
    assert "HTTP 500" in results[5]
    assert "已关机" in stopped
    assert "已取消释放 *box1*" in cancelled


def test_the_confirm_dialogs_in_chinese() -> None:
    ask = ReleaseAsk(instance=inst(), manual=False, cost_micros=12_340_000, running_jobs=())
    with speaking("zh"):
        for mode in ("terminate", "stop"):
            _, blocks = render.release_ask(replace(ask, mode=mode))
            dialog = blocks[1]["elements"][0]["confirm"]
            assert_chinese(dialog)
            assert "box1" in dialog["title"]["text"]
            assert "$12.34" in dialog["text"]["text"]
            assert dialog["deny"]["text"] == "取消"


def test_an_unregistered_instance_in_chinese() -> None:
    view = UnregisteredView(
        provider="runpod",
        provider_id="abc123",
        name="forgotten",
        state="active",
        raw_state="RUNNING",
        gpu_model="H100",
        gpu_count=2,
        price_micros_per_hour=5_000_000,
        currency="USD",
        launched_at=NOW - timedelta(hours=30),
        tags=(("owner", "alice"),),
        now=NOW,
        timezone="UTC",
    )
    bare = replace(view, price_micros_per_hour=None, launched_at=None, gpu_model=None, tags=())
    with speaking("zh"):
        shown = chinese(reconcile_blocks.unregistered_notice(view), "abc123", "forgotten", "$5.00")
        unknown = chinese(reconcile_blocks.unregistered_notice(bare), "abc123")
    assert "/gpu adopt runpod abc123 NAME" in shown
    assert "标签：owner=alice" in shown
    assert "已运行 1 天 6 小时" in shown
    assert "平台未报告价格" in unknown


#: What the agent sends when NVML cannot start (agents/nvml.py): the loader's English reason.
LOADER_SAYS = (
    "the NVIDIA driver's NVML library does not load: libnvidia-ml.so.1: cannot open shared "
    "object file: No such file or directory"
)


def test_gpus_that_cannot_be_read_are_said_by_kind_with_the_drivers_words_as_code() -> None:
    failing = row(inst("box7"), gpus=(), nvml_problem=LOADER_SAYS, nvml_code="library_not_found")
    with speaking("zh"):
        shown = chinese(render.fleet_overview(overview([failing])), "box7")
        one = chinese(render.instance_detail(detail(row=failing)), "box7")
    for text in (shown, one):
        assert "无法读取 GPU：NVIDIA 驱动库无法加载（NVML 报告：`the NVIDIA driver's" in text
    english = all_text(list(render.fleet_overview(overview([failing]))[1]))
    assert "GPUs not readable: the NVIDIA driver library does not load (NVML said: `" in english


@pytest.mark.parametrize("code", sorted(HINTS))
def test_the_nvml_health_finding_reads_in_chinese(code: str) -> None:
    """As the agent's nvml check sends it (agents/checks/gpu.py): a summary template with the
    code and the driver's message, and the hint as plain English (old agents, too)."""
    check = CheckView(
        "nvml",
        "fail",
        f"NVML failed ({code}): {LOADER_SAYS}",
        HINTS[code],
        summary_template="NVML failed ({code}): {message}",
        summary_params={"code": code, "message": LOADER_SAYS},
    )
    view = HealthView(instance=inst(), status="fail", checks=(check,), full=False)
    with speaking("zh"):
        shown = chinese(render.health_report(view), "box1", "nvml")
    assert "NVML 失败：" in shown
    assert "`the NVIDIA driver's NVML library does not load: libnvidia-ml.so.1" in shown
