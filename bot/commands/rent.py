"""`/gpu rent`: check the request, answer at once, rent in the background
(bot.services.instances.rent
tells the channel what came of it)."""

from __future__ import annotations

import argparse

from bot import text as bot_text
from bot.blocks import rent as blocks
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.i18n import N_
from bot.providers.registry import KNOWN_PROVIDERS
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import rent as rent_service
from bot.values import parse_duration, parse_price, parse_when, whole_number

#: The largest disk `/gpu rent --disk` asks a platform for, in GB.
MAX_DISK_GB = 100_000

RENT_USAGE = (
    "/gpu rent PROVIDER TYPE [--count N] [--name NAME] [--release-in 3h | --release-at 18:00] "
    "[--price 1.01/h] [--image AMI] [--ssh-key NAME] [--region R] [--user root] [--key NAME] "
    "[--project P] [--python PATH] [--disk GB]"
)


def _configure_rent(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("provider", type=str.lower, choices=KNOWN_PROVIDERS, metavar="PROVIDER")
    parser.add_argument("instance_type", metavar="TYPE")
    parser.add_argument(
        "--count", type=whole_number("--count", 1, rent_service.MAX_COUNT), default=1, metavar="N"
    )
    parser.add_argument("--name", metavar="NAME")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--release-in", type=parse_duration, metavar="3h")
    when.add_argument("--release-at", metavar="18:00")
    parser.add_argument("--price", metavar="1.01/h")
    parser.add_argument("--image", metavar="AMI")
    parser.add_argument("--ssh-key", metavar="NAME")
    parser.add_argument("--region", metavar="REGION")
    parser.add_argument("--user", default="root", metavar="USER")
    parser.add_argument("--key", metavar="NAME")
    parser.add_argument("--project", type=bot_text.project, metavar="P")
    parser.add_argument("--python", metavar="PATH")
    parser.add_argument("--disk", type=whole_number("--disk", 1, MAX_DISK_GB), metavar="GB")


def _rent(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    release_at = None
    if args.release_at is not None:
        release_at = parse_when(args.release_at, now_utc=rt.now(), tz=rt.settings.tz())
    request = rent_service.RentRequest(
        provider=args.provider,
        instance_type=args.instance_type,
        count=args.count,
        name=args.name,
        price_micros_per_hour=(
            None if args.price is None else parse_price(args.price, rt.settings.currency)
        ),
        release_in=args.release_in,
        release_at=release_at,
        image=args.image,
        ssh_key_name=args.ssh_key,
        region=args.region,
        ssh_user=args.user,
        key_name=args.key,
        project=args.project,
        python_path=args.python,
        disk_gb=args.disk,
    )
    plan = rent_service.plan_rent(rt, caller, request)
    rt.executor.submit(rent_service.rent_and_report, rt, caller, plan)
    started = rent_service.RentStarted(plan.provider.name, request.instance_type, plan.names)
    text, body = blocks.rent_started(started)
    return Reply(text=text, blocks=body, ephemeral=False)


RENT = CommandSpec(
    name="rent",
    summary=N_("rent an instance through a provider's API, then register it"),
    usage=RENT_USAGE,
    examples=(
        "/gpu rent aws g5.xlarge --image ami-0abc1234 --ssh-key bot --user ubuntu "
        "--price 1.01/h --release-in 3h",
        "/gpu rent lambda gpu_1x_a100_sxm4 --region us-east-1 --ssh-key bot --user ubuntu",
        "/gpu rent runpod 'NVIDIA GeForce RTX 4090' --name pod1 --release-in 8h",
    ),
    configure=_configure_rent,
    handler=_rent,
)


def register(registry: Registry) -> None:
    """Add this module's commands and buttons to ``registry``."""
    for spec in (RENT,):
        registry.command(spec)
