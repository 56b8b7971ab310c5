"""The monthly digest's section against the platforms' bills: built from `/gpu bills`' report
(the same lines, added up per platform), rendered compact, escaped, in English and Chinese, and
left out when no platform publishes bills."""

from __future__ import annotations

from datetime import datetime, timedelta

from bot.blocks import money
from bot.blocks.bills import digest_section
from bot.services.money import bills
from bot.services.money.bills import BillsReport, PlatformBills
from bot.services.money.digest import DigestData, bills_digest
from tests.bot.blocks.test_bills import USD, line
from tests.bot.blocks.test_money import report as spend_report
from tests.bot.blocks.test_money import spend_item, validate

NOW = datetime(2026, 12, 1, 9, 0)
DEC_1 = datetime(2026, 12, 1)


def platform(name: str, *lines: bills.BillLine, **fields: object) -> PlatformBills:
    values: dict[str, object] = {
        "fetched_at": NOW - timedelta(hours=9),
        "tried_at": NOW - timedelta(hours=9),
        "error": None,
        "covered_from": datetime(2026, 10, 1),
        "covered_to": DEC_1,
    }
    values.update(fields)
    return PlatformBills(name, lines=tuple(lines), **values)  # type: ignore[arg-type]


def november(*platforms: PlatformBills, unreadable: tuple[str, ...] = ("manual",)) -> BillsReport:
    return BillsReport("2026-11", NOW, platforms, unreadable)


def digest(section: object) -> DigestData:
    return DigestData(
        "2026-11",
        spend_report([spend_item(0)]),
        0,
        (),
        (),
        bills=section,  # type: ignore[arg-type]
    )


def test_totals_flags_and_the_largest_difference_per_platform() -> None:
    runpod = platform(
        "runpod",
        line("same", "pod-1", None, platform_total_micros=5 * USD),
        line("trainer", "pod-2", bills.START),  # +$1.00
        line("big", "pod-3", bills.MINIMUM, platform_total_micros=8 * USD),  # +$3.00
        line(None, "pod-9", bills.UNREGISTERED, bot_total_micros=None, bot_compute_micros=None),
    )
    section = bills_digest(november(runpod, unreadable=("lambda", "manual")))
    assert section is not None
    (totals,) = section.platforms
    assert (totals.bot_micros, totals.platform_micros, totals.difference_micros) == (
        15 * USD,
        25 * USD,
        10 * USD,
    )
    assert (totals.instances, totals.flagged) == (4, 3)
    assert totals.largest is not None
    assert totals.largest.provider_instance_id == "pod-9"  # $6.00 billed, never registered

    shown = validate(money.digest_message(digest(section)))
    assert "*Against the platforms' bills* (November 2026, UTC" in shown
    assert (
        "• *RunPod*: gpubot $15.00, platform $25.00, difference +$10.00 "
        "(bills fetched 9h ago)" in shown
    )
    assert "3 of 4 instances flagged; the largest: `pod-9` (never registered) +$6.00" in shown
    assert "likely never registered" in shown
    assert "Lambda, manual publish no per-instance bill gpubot can read." in shown


def test_a_platform_in_agreement_a_partial_read_and_one_never_read() -> None:
    aws = platform(
        "aws",
        line("a", "i-1", None, platform_total_micros=5 * USD),
        covered_from=datetime(2026, 11, 17),
        covered_to=datetime(2026, 11, 30),
        error="LimitExceededException: *Rate* exceeded",
    )
    vast = platform("vast", fetched_at=None, error="vast: error 401")
    fresh = platform("runpod", fetched_at=None, tried_at=None)
    section = bills_digest(november(aws, fresh, vast, unreadable=()))
    assert section is not None
    text = digest_section(section)
    assert "no difference past one cent or 1 % over 1 instance" in text
    assert "covering 2026-11-17 to 2026-11-29" in text
    assert "the last read failed: LimitExceededException: \u2217Rate\u2217 exceeded" in text
    assert "• *RunPod*: not read yet" in text
    assert "• *Vast*: not read yet; the last try failed: vast: error 401" in text
    assert "publish" not in text


def test_nothing_when_no_platform_publishes_bills() -> None:
    assert bills_digest(november(unreadable=("lambda", "manual"))) is None
    shown = validate(money.digest_message(digest(None)))
    assert "platforms' bills" not in shown
