"""`/gpu bills` and the ops channel's bill flags rendered: Slack's limits, money, ages, causes, and
the same in Chinese."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from bot.blocks import render
from bot.blocks.bills import CAUSE_WORDS, bills_message, mismatch_message
from bot.i18n import speaking
from bot.local_slack import check_blocks
from bot.services.money import bills
from bot.services.money.bills import BillLine, BillMismatch, BillsReport, PlatformBills

NOW = datetime(2026, 12, 4, 10, 12)
USD = 1_000_000


def line(name: str | None, pid: str, cause: str | None = None, **money: int | None) -> BillLine:
    values: dict[str, int | None] = {
        "bot_compute_micros": 5 * USD,
        "bot_storage_micros": 0,
        "bot_total_micros": 5 * USD,
        "platform_compute_micros": 6 * USD,
        "platform_storage_micros": None,
        "platform_total_micros": 6 * USD,
    }
    values.update(money)
    difference = (values["platform_total_micros"] or 0) - (values["bot_total_micros"] or 0)
    return BillLine(
        provider="runpod",
        provider_instance_id=pid,
        name=name,
        currency="USD",
        difference_micros=difference,
        cause=cause,
        **values,
    )


def report(*platforms: PlatformBills) -> BillsReport:
    return BillsReport("2026-12", NOW, platforms, unreadable=("compshare", "lambda", "manual"))


def text_of(blocks: tuple[dict[str, object], ...]) -> str:
    return "\n".join(str(block) for block in blocks)


def test_the_report_shows_both_sides_the_age_and_the_causes() -> None:
    lines = (
        line("trainer", "pod-1", bills.START),
        line(
            "disk",
            "pod-2",
            bills.STORAGE,
            bot_storage_micros=USD,
            bot_total_micros=6 * USD,
            platform_storage_micros=2 * USD,
            platform_total_micros=8 * USD,
            platform_compute_micros=6 * USD,
            bot_compute_micros=5 * USD,
        ),
        line(None, "pod-9", bills.UNREGISTERED, bot_total_micros=None, bot_compute_micros=None),
        line("same", "pod-3", platform_total_micros=5 * USD),
    )
    runpod = PlatformBills("runpod", NOW - timedelta(minutes=12), NOW, None, None, None, lines)
    text, blocks = bills_message(report(runpod))

    assert not check_blocks(list(blocks))
    body = text_of(blocks)
    assert "*RunPod*: fetched 12m ago" in body
    assert "*trainer* (`pod-1`): gpubot $5.00, platform $6.00, difference +$1.00" in body
    assert "likely cause: the start time" in body
    assert (
        "gpubot $6.00 (compute $5.00, storage $1.00), platform $8.00 (compute $6.00, storage $2.00)"
        in body
    )
    assert "`pod-9` (never registered): gpubot nothing (never registered)" in body
    assert "difference $0.00" in body
    assert "Compshare publishes no per-instance bill gpubot can read." in body
    assert "Lambda publishes no per-instance bill gpubot can read." in body
    assert text.endswith("3 differences past one cent or 1 % are flagged.")


def test_a_failed_read_and_a_platform_never_read() -> None:
    stale = PlatformBills(
        "vast", NOW - timedelta(hours=3), NOW, "vast: 503 Service Unavailable", None, None, ()
    )
    never = PlatformBills("aws", None, NOW, "aws: this account has not opted in", None, None)
    text, blocks = bills_message(report(stale, never))
    body = text_of(blocks)
    assert (
        "*Vast*: the last read failed (vast: 503 Service Unavailable); "
        "these bills were fetched 3h ago" in body
    )
    assert "Nothing billed on either side in December 2026." in body
    assert "*AWS*: not read yet; the last try failed: aws: this account has not opted in" in body
    assert text.endswith("No difference past one cent or 1 %.")


def test_many_instances_stay_within_slacks_limits() -> None:
    lines = tuple(line(f"box-{i:03d}", f"pod-{i}", bills.INCREMENT) for i in range(1000))
    platform = PlatformBills("runpod", NOW, NOW, None, None, None, lines)
    _, blocks = bills_message(report(platform))
    assert not check_blocks(list(blocks))
    assert "More lines than one message holds were left out." in text_of(blocks)


@pytest.mark.parametrize("cause", sorted(CAUSE_WORDS))
def test_every_flag_renders_through_the_one_door(cause: str) -> None:
    notice = BillMismatch(month="2026-11", line=line("trainer", "pod-1", cause))
    text, blocks = render(notice)
    assert not check_blocks(list(blocks))
    assert text.startswith(":warning: RunPod billed *trainer* (`pod-1`) $6.00 in November 2026")
    assert "gpubot counted $5.00, a difference of +$1.00" in text
    with speaking("zh"):
        zh, _ = mismatch_message(notice)
    assert "可能的原因" in zh
