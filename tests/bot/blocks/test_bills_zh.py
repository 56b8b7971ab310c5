"""`/gpu bills` in Chinese: the report and the flags read as a native speaker writes them."""

from __future__ import annotations

from datetime import timedelta

from bot.blocks.bills import bills_message, mismatch_message
from bot.i18n import speaking
from bot.local_slack import check_blocks
from bot.services.money import bills
from bot.services.money.bills import BillMismatch, PlatformBills
from tests.bot.blocks.test_bills import NOW, line, report, text_of


def test_the_report_in_chinese() -> None:
    runpod = PlatformBills(
        "runpod",
        NOW - timedelta(minutes=12),
        NOW,
        None,
        None,
        None,
        (line("t", "p", bills.DISCOUNT),),
    )
    with speaking("zh"):
        text, blocks = bills_message(report(runpod))
    body = text_of(blocks)
    assert "平台账单与 gpubot 对账，2026年12月（UTC）" in body
    assert "折扣" in body
    assert "Lambda 不提供 gpubot 能读取的按实例账单。" in body
    assert "有 1 处差额超过一分钱或 1 %，已标出。" in text


def test_a_flag_in_chinese() -> None:
    notice = BillMismatch(month="2026-11", line=line("trainer", "pod-1", bills.MINIMUM))
    with speaking("zh"):
        text, blocks = mismatch_message(notice)
    assert not check_blocks(list(blocks))
    assert text.startswith(":warning: RunPod 在 2026年11月 对 *trainer* (`pod-1`) 收费 US$6.00")
    assert "可能的原因：最低收费（平台收取了 gpubot 没有计入的最低费用）。" in text
