"""`/gpu policy` (an instance's settings; with options, what happens at the deadline, when idle,
when the jobs are done) and `/gpu cap` (an admin's limit on an instance's lifetime)."""

from __future__ import annotations

import argparse
from datetime import timedelta

from bot.blocks import deadlines as blocks
from bot.blocks import instances as instance_blocks
from bot.commands.instances import parse_storage_price
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.errors import UsageError
from bot.i18n import N_, t
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import fleet_views, policies, registration
from bot.services.instances.lookup import echo
from bot.values import parse_duration, parse_size_gb

POLICY_USAGE = (
    "/gpu policy NAME [--at-deadline release|wait-for-jobs|stop] [--max-grace 2h] "
    "[--release-after 24h] "
    "[--idle-release 1h|off] [--release-when-done on|off] "
    "[--disk 200] [--storage 0.10/GB-month]"
)
CAP_USAGE = "/gpu cap NAME 3d|none"


def _configure_policy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument(
        "--at-deadline", choices=policies.POLICIES, metavar="release|wait-for-jobs|stop"
    )
    parser.add_argument("--release-after", type=parse_duration, metavar="24h")
    parser.add_argument("--max-grace", type=parse_duration, metavar="2h")
    parser.add_argument("--idle-release", type=_duration_or_off, metavar="1h|off")
    parser.add_argument("--release-when-done", type=_on_off, metavar="on|off")
    parser.add_argument("--disk", type=parse_size_gb, metavar="200")
    parser.add_argument("--storage", metavar="0.10/GB-month")


def _policy(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    change = policies.PolicyChange(
        at_deadline=args.at_deadline,
        max_grace_s=int(args.max_grace.total_seconds()) if args.max_grace else None,
        idle_release_after_s=args.idle_release,
        release_when_done=args.release_when_done,
        release_after_s=int(args.release_after.total_seconds()) if args.release_after else None,
    )
    storage_given = args.disk is not None or args.storage is not None
    if storage_given:
        settings = registration.set_storage(
            rt,
            caller,
            args.name,
            disk_gb=args.disk,
            storage_micros_per_gb_month=(
                None
                if args.storage is None
                else parse_storage_price(args.storage, rt.settings.currency)
            ),
        )
        if change == policies.PolicyChange():
            text, body = instance_blocks.instance_settings(settings)
            return Reply(text=text, blocks=body, ephemeral=False)
    if change == policies.PolicyChange():
        text, body = instance_blocks.instance_settings(fleet_views.instance_settings(rt, args.name))
        return Reply(text=text, blocks=body)
    return _policy_reply(policies.set_policy(rt, caller, args.name, change))


def _configure_cap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("lifetime", type=_duration_or_none, metavar="3d|none")


def _cap(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    lifetime = None if args.lifetime is None else timedelta(seconds=args.lifetime)
    return _policy_reply(policies.set_lifetime_cap(rt, caller, args.name, lifetime))


def _policy_reply(view: policies.PolicyView) -> Reply:
    text, body = blocks.policy_summary(view)
    return Reply(text=text, blocks=body, ephemeral=False)


def _duration_or_off(text: str) -> int:
    """``off`` as 0 (turn it off), else a duration in seconds."""
    if text.strip().lower() in ("off", "none", "no"):
        return 0
    return int(parse_duration(text).total_seconds())


def _duration_or_none(text: str) -> int | None:
    """``none`` as None (lift it), else a duration in seconds."""
    if text.strip().lower() in ("none", "off"):
        return None
    return int(parse_duration(text).total_seconds())


def _on_off(text: str) -> bool:
    value = text.strip().lower()
    if value in ("on", "yes", "true"):
        return True
    if value in ("off", "no", "false"):
        return False
    raise UsageError(
        t("{value!r} is not on or off.", value=echo(text)), hint=t("Like --release-when-done on.")
    )


POLICY = CommandSpec(
    name="policy",
    summary=N_(
        "an instance's settings (deadline policy, idle release, release when done, "
        "lifetime cap, billing increment, minimum charge, disk and storage price); with options, "
        "change what happens at the deadline, when idle, and when the jobs are done "
        "(--at-deadline stop, where the platform can stop: stopped at the deadline, its disk "
        "kept and billed, then released --release-after later unless someone starts it again); "
        "--disk and --storage tell the bot the disk's size and price, from now on (a stopped "
        "instance's disk bills on)"
    ),
    usage=POLICY_USAGE,
    examples=(
        "/gpu policy box1",
        "/gpu policy box1 --at-deadline wait-for-jobs --max-grace 2h",
        "/gpu policy box1 --at-deadline stop --release-after 24h",
        "/gpu policy box1 --idle-release 1h",
        "/gpu policy box1 --release-when-done on",
        "/gpu policy box1 --disk 200 --storage 0.10/GB-month",
    ),
    configure=_configure_policy,
    handler=_policy,
)
CAP = CommandSpec(
    name="cap",
    summary=N_("(admin) the longest an instance may live, counted from its registration"),
    usage=CAP_USAGE,
    examples=("/gpu cap box1 3d", "/gpu cap box1 none"),
    configure=_configure_cap,
    handler=_cap,
)


def register(registry: Registry) -> None:
    """Add this module's commands and buttons to ``registry``."""
    for spec in (
        POLICY,
        CAP,
    ):
        registry.command(spec)
