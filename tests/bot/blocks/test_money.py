"""Money blocks stay within Slack's limits (checked with slack_sdk's models) and say enough."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pytest
from slack_sdk.models.blocks import Block

from bot.blocks import money, render
from bot.services.money import advice
from bot.services.money.budgets import BudgetAlert, BudgetStatus
from bot.services.money.costs import FinalCost
from bot.services.money.digest import Digest, DigestData, JobSpend, PlanSaving
from bot.services.money.spend import DaySpend, InstanceSpend, SpendReport, group_lines

USD = 1_000_000


def validate(message: tuple[str, tuple[dict[str, Any], ...]]) -> str:
    """Every block parses and validates as slack_sdk models; returns all text as JSON."""
    text, blocks = message
    assert text
    assert 0 < len(blocks) <= 50
    for raw in blocks:
        model = Block.parse(raw)
        assert model is not None, raw
        model.validate_json()
        assert model.to_dict() == raw
    return text + json.dumps(blocks, ensure_ascii=False)


def spend_item(index: int, **fields: Any) -> InstanceSpend:
    values: dict[str, Any] = {
        "instance_id": index,
        "name": f"box-{index}",
        "owner_id": f"U{index:04d}",
        "project": None,
        "provider": "manual",
        "gpu_model": "h100-sxm",
        "gpu_count": 1,
        "compute_micros": (index + 1) * USD,
        "storage_micros": 0,
        "idle_micros": 0,
        "compute_s": 3600,
    }
    values.update(fields)
    return InstanceSpend(**values)


def report(items: list[InstanceSpend], by: str = "user", complete: bool = True) -> SpendReport:
    ordered = tuple(sorted(items, key=lambda i: -i.total_micros))
    return SpendReport(
        month="2026-03",
        start_at=datetime(2026, 3, 1),
        end_at=datetime(2026, 4, 1),
        currency="USD",
        by=by,
        complete=complete,
        instances=ordered,
        groups=group_lines(ordered, by),
        days=(DaySpend(date(2026, 3, 1)),),
    )


def test_spend_message_shows_totals_idle_and_top_instances() -> None:
    items = [
        spend_item(0, idle_micros=USD // 2, storage_micros=250_000),
        spend_item(1, project="llm"),
    ]
    shown = validate(money.spend_message(report(items, by="project", complete=False)))
    # The current month counts the open hour too (as budgets and status do), and says so.
    assert "GPU spend, March 2026 (this month so far)" in shown
    assert "*Total $3.25*" in shown
    assert "Compute in use *$2.50* · idle *$0.50* (17% of compute) · not measured *$0.00*." in shown
    assert "*By project*" in shown
    assert "llm: $2.00" in shown
    assert "Charged up to the last full hour" in shown
    assert "egress) is not metered" in shown


def test_spend_message_says_what_no_poll_measured() -> None:
    partly = [spend_item(0, idle_micros=USD // 4, unmeasured_micros=USD // 2), spend_item(1)]
    shown = validate(money.spend_message(report(partly, by="instance")))
    # $3.00 of compute: $0.25 idle, $0.50 not measured, the rest in use.
    assert "Compute in use *$2.25* · idle *$0.25* (8% of compute) · not measured *$0.50*." in shown
    assert "box-0: $1.00 (idle $0.25, not measured $0.50)" in shown
    assert "*box-0* (h100-sxm, <@U0000>): $1.00, idle $0.25, not measured $0.50" in shown
    never = [spend_item(0, unmeasured_micros=USD), spend_item(1, unmeasured_micros=2 * USD)]
    shown = validate(money.spend_message(report(never, by="instance")))
    assert (
        "GPU use was not measured for any of the compute ($3.00): no poll read the GPUs, so "
        "none of it counts as idle or in use."
    ) in shown
    assert "box-1: $2.00 (not measured $2.00)" in shown
    assert "*box-1* (h100-sxm, <@U0001>): $2.00, not measured $2.00" in shown
    assert "in use *" not in shown


def test_spend_message_with_hundreds_of_groups_stays_within_limits() -> None:
    items = [spend_item(i, name="x" * 60 + str(i)) for i in range(400)]
    shown = validate(money.spend_message(report(items, by="instance")))
    assert "390 more" in shown


def test_empty_month() -> None:
    shown = validate(money.spend_message(report([])))
    assert "Nothing was charged in March 2026" in shown


def test_digest_message() -> None:
    items = [spend_item(0, project="llm", idle_micros=USD), spend_item(5)]
    data = DigestData(
        month="2026-03",
        report=report(items),
        previous_total_micros=4 * USD,
        savings=(PlanSaving("box-5", "U0005", "h100-sxm", 2000 * USD, 1570 * USD, "runpod plan"),),
        jobs=(JobSpend("j-1", "box-5", "U0005", "python `train`.py <x>", 7200, 6 * USD),),
    )
    shown = validate(money.digest_message(data))
    assert "GPU spend in March 2026: $7.00 (up 75% on the month before)" in shown
    assert "*By GPU model*" in shown
    assert "$430.00 less" in shown
    assert "j-1" in shown
    assert "&lt;x&gt;" in shown
    assert "egress) is not metered" in shown
    assert "2h" in shown


def test_budget_messages() -> None:
    statuses = [
        BudgetStatus(1, "user", "UALICE", 100 * USD, 85 * USD),
        BudgetStatus(2, "project", "llm", 100 * USD, 120 * USD),
    ]
    shown = validate(money.budget_list_message(statuses, "2026-03", "USD"))
    assert ":warning: <@UALICE>: $85.00 of $100.00 (85%)" in shown
    assert ":no_entry: project *llm*: $120.00 of $100.00 (120%)" in shown
    assert "No budgets are set" in validate(money.budget_list_message([], "2026-03", "USD"))
    alert = validate(money.budget_alert_message(statuses[1], 100, "USD"))
    assert "used up" in alert
    assert "need an admin" in alert
    assert "80% used" in validate(money.budget_alert_message(statuses[0], 80, "USD"))


def test_fit_message() -> None:
    shown = validate(money.fit_message(advice.fit("70b", "full")))
    assert "70B (shaped like llama-3.1-70b) full, 16-bit" in shown
    assert "optimizer state" in shown
    # 80 GB is 74.5 GiB, 70.3 GiB of it usable: 15 cards, not 14 at a full 80 GiB each.
    assert "15x *NVIDIA H100" in shown
    assert "usable each" in shown
    assert "0.5 GiB for the CUDA context and 5% for fragmentation" in shown
    small = validate(money.fit_message(advice.fit("llama-3.1-8b", "inference")))
    assert "KV cache" in small
    assert "/h on RunPod" in small


@pytest.mark.parametrize(("hours", "months"), [(Decimal("1.5"), "2,400"), (Decimal(500), "7.2")])
def test_estimate_message(hours: Decimal, months: str) -> None:
    report_ = advice.estimate("4090", hours=hours, hourly_micros=500_000, buy_micros=1800 * USD)
    shown = validate(money.estimate_message(report_, "USD"))
    assert f"NVIDIA GeForce RTX 4090 at {hours} h a month" in shown
    assert "Buying pays off after *3,600 h* of renting by the hour" in shown
    assert f"*{months} months* at {hours} h a month" in shown
    assert "Cheapest: *hourly* (to rent at" in shown
    assert "--price, --monthly and --buy are per card" in shown


def test_estimate_for_two_cards_says_per_card_and_never_one_card_for_a_total() -> None:
    report_ = advice.estimate(
        "a100-sxm4-80gb",
        hours=Decimal(50),
        count=2,
        hourly_micros=869_000,
        monthly_micros=1015 * USD,
        buy_micros=4031 * USD,
    )
    shown = validate(money.estimate_message(report_, "USD"))
    assert "buy $4,031.00 a card (as given)" in shown
    assert "*$8,062.00* once" in shown
    assert "one card" not in shown
    assert "A monthly plan *never pays off*, at any usage" in shown
    assert "pays off from" not in shown


def test_final_cost_explains_the_rounding() -> None:
    cost = FinalCost(
        total_micros=4 * USD,
        compute_micros=4 * USD,
        storage_micros=0,
        used_s=4200,
        billed_s=7200,
        hourly_micros=2 * USD,
        currency="USD",
    )
    assert money.final_cost_text(cost) == "$4.00: 1h10m billed as 2 h at $2.00/h"
    exact = replace(cost, total_micros=2_333_334, billed_s=4200, storage_micros=0)
    assert money.final_cost_text(exact) == "$2.33: 1h10m at $2.00/h"
    never = replace(cost, total_micros=0, used_s=0, billed_s=0, started=False)
    assert money.final_cost_text(never) == "$0.00: billing never started"


def test_month_names() -> None:
    assert money.month_name("2026-01") == "January 2026"
    assert money.month_name("2025-12") == "December 2025"


def test_fit_lines_say_when_the_gpus_span_machines() -> None:
    shown = validate(money.fit_message(advice.fit("70b", "full")))
    # A card's capacity in decimal GB, and what of it is usable in GiB.
    assert "(80 GB: 70.3 GiB usable each, needs 70.3 GiB each; 2 machines of up to 8)" in shown
    assert "(141 GB: 124.3 GiB usable each, needs" in shown


def test_money_notices_render_through_the_one_door() -> None:
    status = BudgetStatus(2, "project", "llm", 100 * USD, 120 * USD)
    alert = render(BudgetAlert(status, 100, "USD"))
    assert alert == money.budget_alert_message(status, 100, "USD")
    assert "used up" in validate(alert)
    data = DigestData("2026-03", report([spend_item(0)]), 0, (), ())
    assert render(Digest(data)) == money.digest_message(data)
    assert money.digest_chart_title("2026-03") == "GPU spend per day, March 2026"


def test_digest_cuts_a_long_command_with_an_ellipsis() -> None:
    job = JobSpend("j-1", "box-0", "U0000", "python " + "x" * 200, 60, USD)
    data = DigestData("2026-03", report([spend_item(0)]), 0, (), (job,))
    _, blocks = money.digest_message(data)
    assert "`python " + "x" * 72 + "…`" in json.dumps(blocks, ensure_ascii=False)


def test_spend_file_titles() -> None:
    assert money.spend_file_titles(report([], by="project")) == (
        "GPU spend by project, March 2026",
        "GPU spend per instance, March 2026",
    )


def test_digest_says_once_that_the_month_before_had_nothing() -> None:
    items = [spend_item(0, idle_micros=USD // 4, unmeasured_micros=USD // 2)]
    data = DigestData("2026-03", report(items), previous_total_micros=0, savings=(), jobs=())
    shown = validate(money.digest_message(data))
    assert "*Total $1.00* — nothing was charged the month before" in shown
    assert "in the month before" not in shown
    assert "Compute in use *$0.25* · idle *$0.25* (25% of compute) · not measured *$0.50*." in shown
    quiet = DigestData("2026-03", report([]), previous_total_micros=0, savings=(), jobs=())
    shown = validate(money.digest_message(quiet))
    assert "*Total $0.00* — nothing was charged this month or the month before" in shown
    assert "in the month before" not in shown
    before = DigestData(
        "2026-03", report(items), previous_total_micros=2 * USD, savings=(), jobs=()
    )
    shown = validate(money.digest_message(before))
    assert "*Total $1.00* — down 50% on the month before ($2.00 in the month before)" in shown
