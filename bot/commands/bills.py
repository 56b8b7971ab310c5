"""`/gpu bills [YYYY-MM]`: what the platforms billed each instance beside gpubot's charges.

Thin: reads the month, asks bot.services.money.bills for the stored bills (the store only; the
clock reads the platforms) and renders them with bot.blocks.bills.
"""

from __future__ import annotations

import argparse

from bot.blocks import bills as blocks
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.i18n import N_
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.money import bills

BILLS_USAGE = "/gpu bills [YYYY-MM]"


def register(registry: Registry) -> None:
    """Add `/gpu bills`."""
    registry.command(
        CommandSpec(
            name="bills",
            summary=N_(
                "Compare what each platform billed per instance with gpubot's charges "
                "(this month, UTC, or YYYY-MM)"
            ),
            usage=BILLS_USAGE,
            examples=("/gpu bills", "/gpu bills 2026-11"),
            configure=_configure,
            handler=_bills,
            aliases=("账单",),
        )
    )


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("month", nargs="?", metavar="YYYY-MM")


def _bills(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    now = rt.now()
    month = bills.parse_month(args.month, now)
    text, body = blocks.bills_message(bills.bills_report(rt, month, now))
    return Reply(text=text, blocks=body)
