"""The digest's section against the platforms' bills in Chinese."""

from __future__ import annotations

from bot.blocks import money
from bot.i18n import speaking
from bot.services.money import bills
from bot.services.money.digest import bills_digest
from tests.bot.blocks.test_bills import line
from tests.bot.blocks.test_bills_digest import digest, november, platform
from tests.bot.blocks.test_money import validate


def test_the_section_in_chinese() -> None:
    runpod = platform("runpod", line("trainer", "pod-2", bills.START))
    section = bills_digest(november(runpod))
    assert section is not None
    with speaking("zh"):
        shown = validate(money.digest_message(digest(section)))
    assert "*与平台账单对账*（2026年11月，UTC；`/gpu bills 2026-11` 列出每台实例）" in shown
    assert "• *RunPod*：gpubot US$5.00，平台 US$6.00，差额 +US$1.00（账单于 9 小时前获取）" in shown
    assert "1 台实例中有 1 台被标出" in shown
    assert "可能的原因：开始时间" in shown
    assert "手动登记 不提供 gpubot 能读取的按实例账单。" in shown
