"""`/gpu help` writes its examples' amounts in the workspace's currency: yuan figures where the
bot counts in yuan (GPUBOT_CURRENCY=CNY), and each of them is taken by the command as typed."""

from __future__ import annotations

import re

import pytest

from bot.commands import build_registry
from bot.commands.help import YUAN_AMOUNTS, in_currency, render_command
from bot.commands.parser import parse
from bot.i18n import speaking
from bot.listeners import execute_command
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.values import parse_money, parse_price, parse_storage_price

REGISTRY = build_registry()
CALLER = Caller(user_id="UOWNER", channel_id="CTEAM")
#: An option that takes an amount, and its value as written in a help line.
AMOUNT = re.compile(r"--(price|storage|monthly|buy) (\S+)")
BUDGET = re.compile(r"/gpu budget set \S+ \S+ (\S+)$")
READERS = {
    "price": parse_price,
    "storage": parse_storage_price,
    "monthly": parse_money,
    "buy": parse_money,
}


def _lines(currency: str) -> list[str]:
    """Every usage and example line of every command's help, in ``currency``."""
    lines: list[str] = []
    for spec in REGISTRY.primary_commands():
        for language in ("en", "zh"):
            with speaking(language):
                text, _ = render_command(spec, currency=currency)
            lines.extend(line.strip("[]") for line in text.splitlines() if "/gpu" in line)
    return lines


def _amounts(lines: list[str]) -> list[tuple[str, str]]:
    found = [
        (option, value.rstrip("]")) for line in lines for option, value in AMOUNT.findall(line)
    ]
    found += [("monthly", match.group(1)) for line in lines if (match := BUDGET.search(line))]
    return [(option, value) for option, value in found if any(c.isdigit() for c in value)]


def test_under_yuan_every_amount_in_the_help_is_a_yuan_figure_the_command_takes() -> None:
    amounts = _amounts(_lines("CNY"))
    assert len(amounts) > 10
    for option, value in amounts:
        assert READERS[option](value, "CNY") > 0, value
        if option in ("price", "storage") and "/" in value:
            assert "元" in value or "¥" in value, f"--{option} {value} reads as dollars"
    shown = " ".join(f"--{option} {value}" for option, value in amounts)
    assert "¥3.5/小时" in shown
    assert "--price 2.2" in shown
    assert "3000元" in shown


def test_every_dollar_amount_in_a_help_line_has_its_yuan_figure() -> None:
    """A new example with a price in dollars fails here until it has a yuan figure."""
    for option, value in _amounts(_lines("USD")):
        if option in ("price", "storage"):
            assert f"--{option} {value}" in YUAN_AMOUNTS, f"--{option} {value} has no yuan figure"


def test_other_currencies_keep_the_examples_as_written() -> None:
    line = "/gpu register box1 root@203.0.113.7 --gpu a100 --price 2.10/h --release-in 3h"
    assert in_currency(line, "USD") == line
    assert in_currency(line, "EUR") == line
    assert in_currency(line, "cny") == line.replace("2.10/h", "¥3.5/小时")
    assert in_currency("/gpu budget set project llm 2000", "CNY").endswith(" 12000元")
    assert in_currency("/gpu budget list", "CNY") == "/gpu budget list"


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    return local_rt


def _help(rt: Runtime, command: str) -> str:
    spec, args = parse(f"help {command}", REGISTRY)
    reply = spec.handler(rt, CALLER, args)
    return " ".join(str(block) for block in reply.blocks)


def test_the_help_command_follows_the_workspace_s_currency(rt: Runtime) -> None:
    assert "--price 2.10/h" in _help(rt, "register")
    object.__setattr__(rt, "settings", rt.settings.with_(currency="CNY"))
    with speaking("zh"):
        shown = _help(rt, "register")
    assert "--price ¥3.5/小时" in shown
    assert "2.10" not in shown
    with speaking("zh"):
        assert "3000元" in _help(rt, "budget")


def test_the_forms_price_examples_follow_the_workspace_s_currency() -> None:
    from bot.blocks import forms
    from bot.blocks.forms import GpuChoice

    def placeholders(view: dict[str, object]) -> dict[str, str]:
        found: dict[str, str] = {}
        for block in view["blocks"]:  # type: ignore[attr-defined]
            element = block.get("element") or {}
            if "placeholder" in element:
                found[block["block_id"]] = element["placeholder"]["text"]
        return found

    gpus = [GpuChoice("a100", "A100")]
    dollars = placeholders(forms.register_form(gpus, ["manual"], default_release_in="8h"))
    yuan = placeholders(
        forms.register_form(gpus, ["manual"], default_release_in="8h", currency="CNY")
    )
    assert (dollars["price"], dollars["storage"]) == ("2.10/h", "0.10/GB-month")
    assert (yuan["price"], yuan["storage"]) == ("3.5元/小时", "0.35元/GB/月")
    assert parse_price(yuan["price"], "CNY") == 3_500_000
    assert parse_storage_price(yuan["storage"], "CNY") == 350_000
    rent = placeholders(forms.rent_form([], ["aws"], currency="CNY"))
    assert parse_price(rent["price"], "CNY") > 0
    assert "元" in rent["price"]


def test_the_usage_line_after_a_mistake_follows_the_workspace_s_currency(rt: Runtime) -> None:
    typo = "register box root@203.0.113.7 --gpu h100 --storage 0.1/GB-month"
    assert "--price 2.10/h" in execute_command(rt, REGISTRY, CALLER, typo).text
    object.__setattr__(rt, "settings", rt.settings.with_(currency="CNY"))
    with speaking("zh"):
        shown = execute_command(rt, REGISTRY, CALLER, typo).text
    assert "--price ¥3.5/小时" in shown
    assert "2.10/h" not in shown
