"""`/gpu register`, `status`, `list`, `health`, `extend`, `release` and the release buttons.

Handlers are thin: read the arguments, call the instance services (registration, fleet_views,
lifecycle, lookup), render with bot.blocks.instances. Bad values raise UsageError (from
bot.values) before anything changes.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bot import billing
from bot import text as bot_text
from bot.blocks import instance_list as list_blocks
from bot.blocks import instances as blocks
from bot.commands.registry import ActionSpec, CommandSpec, Registry, Reply, button_number
from bot.errors import UsageError
from bot.i18n import N_, t
from bot.providers.registry import KNOWN_PROVIDERS
from bot.services import access
from bot.services.access import Caller
from bot.services.instances import fleet_views, lifecycle, lookup, reconcile, registration, starts
from bot.values import (
    parse_duration,
    parse_price,
    parse_size_gb,
    parse_when,
    whole_number,
)
from bot.values import parse_storage_price as read_storage_price

if TYPE_CHECKING:
    from bot.runtime import Runtime

REGISTER_USAGE = (
    "/gpu register NAME USER@HOST[:PORT] --gpu MODEL [--count N] --price 2.10/h "
    "[--release-in 3h | --release-at 18:00] "
    "[--provider manual|aws|lambda|runpod|vast|compshare --provider-id ID] "
    "[--billing second|minute|hour] [--min-charge 1m] [--disk 200 --storage 0.10/GB-month] "
    "[--project P] [--python PATH] [--key NAME]"
)
ADOPT_USAGE = (
    "/gpu adopt PROVIDER ID NAME [--user root] [--key NAME] "
    "[--release-in 3h | --release-at 18:00] [--price 2.10/h] [--gpu MODEL] [--count N] "
    "[--disk 200 --storage 0.10/GB-month] [--project P] [--python PATH]"
)
STATUS_USAGE = "/gpu status [NAME]"
LIST_USAGE = "/gpu list [--all] [--page N]"
HEALTH_USAGE = "/gpu health NAME [--full]"
EXTEND_USAGE = "/gpu extend NAME DURATION"
RELEASE_USAGE = "/gpu release NAME [--stop]"

#: ``--count``: a whole number of GPUs, 1 or more (the service caps it at MAX_GPU_COUNT).
GPU_COUNT = whole_number("--count", 1)
#: ``--page``: which page of the others' instances `/gpu list --all` shows, from 1.
PAGE = whole_number("--page", 1)

# --- register ---------------------------------------------------------------------------------


def _configure_register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("address", metavar="USER@HOST[:PORT]")
    parser.add_argument("--gpu", required=True, metavar="MODEL")
    parser.add_argument("--count", type=GPU_COUNT, metavar="N")
    parser.add_argument("--price", required=True, metavar="2.10/h")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--release-in", type=parse_duration, metavar="3h")
    when.add_argument("--release-at", metavar="18:00")
    # No default: a re-registration without --provider keeps the instance's platform and id.
    parser.add_argument("--provider", type=str.lower, choices=KNOWN_PROVIDERS)
    parser.add_argument("--provider-id", metavar="ID")
    parser.add_argument("--billing", type=billing.parse_increment, metavar="second|minute|hour")
    parser.add_argument("--min-charge", type=parse_duration, metavar="1m")
    parser.add_argument("--disk", type=parse_size_gb, metavar="200")
    parser.add_argument("--storage", metavar="0.10/GB-month")
    parser.add_argument("--project", type=bot_text.project, metavar="P")
    parser.add_argument("--python", metavar="PATH")
    parser.add_argument("--key", metavar="NAME")


def _register(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    release_at = None
    if args.release_at is not None:
        release_at = parse_when(args.release_at, now_utc=rt.now(), tz=rt.settings.tz())
    if args.storage is not None and args.disk is None:
        raise UsageError(
            t("--storage needs --disk (the size it is charged on)."), usage=REGISTER_USAGE
        )
    request = registration.RegisterRequest(
        name=args.name,
        address=args.address,
        gpu_model=args.gpu,
        gpu_count=args.count,
        price_micros_per_hour=parse_price(args.price, rt.settings.currency),
        release_in=args.release_in,
        release_at=release_at,
        provider=args.provider,
        provider_id=args.provider_id,
        billing=args.billing,
        min_charge_s=int(args.min_charge.total_seconds()) if args.min_charge else None,
        disk_gb=args.disk,
        storage_micros_per_gb_month=(
            0 if args.storage is None else parse_storage_price(args.storage, rt.settings.currency)
        ),
        project=args.project,
        python_path=args.python,
        key_name=args.key,
    )
    result = registration.register(rt, caller, request)
    text, body = blocks.register_result(result)
    return Reply(text=text, blocks=body, ephemeral=False)


# --- adopt ------------------------------------------------------------------------------------


def _configure_adopt(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("provider", type=str.lower, choices=KNOWN_PROVIDERS, metavar="PROVIDER")
    parser.add_argument("provider_id", metavar="ID")
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--user", default="root", metavar="USER")
    parser.add_argument("--key", metavar="NAME")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--release-in", type=parse_duration, metavar="3h")
    when.add_argument("--release-at", metavar="18:00")
    parser.add_argument("--price", metavar="2.10/h")
    parser.add_argument("--gpu", metavar="MODEL")
    parser.add_argument("--count", type=GPU_COUNT, metavar="N")
    parser.add_argument("--disk", type=parse_size_gb, metavar="200")
    parser.add_argument("--storage", metavar="0.10/GB-month")
    parser.add_argument("--project", type=bot_text.project, metavar="P")
    parser.add_argument("--python", metavar="PATH")


def _adopt(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    release_at = None
    if args.release_at is not None:
        release_at = parse_when(args.release_at, now_utc=rt.now(), tz=rt.settings.tz())
    request = reconcile.AdoptRequest(
        provider=args.provider,
        provider_id=args.provider_id,
        name=args.name,
        ssh_user=args.user,
        key_name=args.key,
        release_in=args.release_in,
        release_at=release_at,
        price_micros_per_hour=(
            None if args.price is None else parse_price(args.price, rt.settings.currency)
        ),
        gpu_model=args.gpu,
        gpu_count=args.count,
        project=args.project,
        python_path=args.python,
        disk_gb=args.disk,
        storage_micros_per_gb_month=(
            None
            if args.storage is None
            else parse_storage_price(args.storage, rt.settings.currency)
        ),
    )
    text, body = blocks.register_result(reconcile.adopt(rt, caller, request))
    return Reply(text=text, blocks=body, ephemeral=False)


# --- reading ----------------------------------------------------------------------------------


def _configure_status(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", metavar="NAME")


def _status(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    if args.name:
        text, body = blocks.instance_detail(fleet_views.instance_detail(rt, args.name))
    else:
        text, body = blocks.fleet_overview(fleet_views.fleet_overview(rt))
    return Reply(text=text, blocks=body)


def _configure_list(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--page", type=PAGE, metavar="N")


def _list(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    # An admin sees the first page unasked; --page alone asks for a page as --all does.
    paged = args.all or args.page is not None or access.is_admin(rt, caller)
    view = fleet_views.viewer_list(rt, caller.user_id, paged=paged, page=args.page or 1)
    text, body = list_blocks.viewer_list(view)
    return Reply(text=text, blocks=body)


def _configure_health(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--full", action="store_true")


def _health(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    text, body = blocks.health_report(fleet_views.health(rt, caller, args.name, full=args.full))
    return Reply(text=text, blocks=body)


# --- changing ---------------------------------------------------------------------------------


def _configure_extend(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("duration", type=parse_duration, metavar="DURATION")


def _extend(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    view = lifecycle.extend(rt, caller, args.name, args.duration)
    text, body = blocks.extended(view, now=rt.now(), timezone=rt.settings.timezone)
    return Reply(text=text, blocks=body, ephemeral=False)


def _configure_release(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--stop", action="store_true")


def _release(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    text, body = blocks.release_ask(lifecycle.ask_release(rt, caller, args.name, stop=args.stop))
    return Reply(text=text, blocks=body)


# --- buttons ----------------------------------------------------------------------------------


def _release_ask_button(rt: Runtime, caller: Caller, value: str) -> Reply:
    inst = lookup.instance_by_id(rt, button_number(value))
    text, body = blocks.release_ask(lifecycle.ask_release(rt, caller, inst.name))
    return Reply(text=text, blocks=body)


def _release_confirm_button(rt: Runtime, caller: Caller, value: str) -> Reply:
    text, body = blocks.release_result(lifecycle.release(rt, caller, button_number(value)))
    return Reply(text=text, blocks=body, replace_original=True)


def _stop_confirm_button(rt: Runtime, caller: Caller, value: str) -> Reply:
    view = lifecycle.release(rt, caller, button_number(value), mode="stop")
    text, body = blocks.release_result(view)
    return Reply(text=text, blocks=body, replace_original=True)


def _start_button(rt: Runtime, caller: Caller, value: str) -> Reply:
    text, body = blocks.start_result(starts.start(rt, caller, button_number(value)))
    return Reply(text=text, blocks=body)


def _release_cancel_button(rt: Runtime, caller: Caller, value: str) -> Reply:
    text, body = blocks.release_cancelled(lookup.instance_by_id(rt, button_number(value)))
    return Reply(text=text, blocks=body, replace_original=True)


def _release_done_button(rt: Runtime, caller: Caller, value: str) -> Reply:
    text, body = blocks.release_result(lifecycle.confirm_released(rt, caller, button_number(value)))
    return Reply(text=text, blocks=body, replace_original=True, ephemeral=False)


def _stop_done_button(rt: Runtime, caller: Caller, value: str) -> Reply:
    view = lifecycle.confirm_released(rt, caller, button_number(value), stopped=True)
    text, body = blocks.release_result(view)
    return Reply(text=text, blocks=body, replace_original=True, ephemeral=False)


# --- values -----------------------------------------------------------------------------------


def parse_storage_price(text: str, currency: str) -> int:
    """``0.10/GB-month`` (or ``0.10``, or in Chinese ``0.35元/GB/月``) in ``currency`` as
    micro-units per GB-month (:func:`bot.values.parse_storage_price`). Raises UsageError (an
    amount in another currency included)."""
    return read_storage_price(text, currency)


# --- the specs --------------------------------------------------------------------------------


REGISTER = CommandSpec(
    name="register",
    summary=N_(
        "Adopt an instance rented anywhere: pin its host key, install the agent, "
        "check its GPUs, start the meter and the deadline. Without --release-in or --release-at "
        "the deadline is the default (8h from now unless the bot's "
        "GPUBOT_DEFAULT_RELEASE_IN_S says otherwise); the reply says when. GPUs other than the "
        "rented ones are said in the reply, once in the ops channel, and in `/gpu status` for "
        "as long as they differ"
    ),
    usage=REGISTER_USAGE,
    examples=(
        "/gpu register box1 root@203.0.113.7 --gpu a100 --price 2.10/h --release-in 3h",
        "/gpu register big ubuntu@gpu.example.com:2222 --gpu h100 --count 8 --price 24/h "
        "--release-at 18:00 --project llm",
        "/gpu register rp1 root@[2001:db8::7]:22 --gpu 4090 --price 0.69/h "
        "--provider runpod --provider-id abc123 --disk 200 --storage 0.10/GB-month",
    ),
    configure=_configure_register,
    handler=_register,
)
ADOPT = CommandSpec(
    name="adopt",
    summary=N_(
        "Take over an instance of a platform account that nobody registered (admins only; "
        "the ops channel is told of each): its address, GPUs and price come from the platform, "
        "and its disk and storage price where the platform says them (Vast.ai); --disk and "
        "--storage say them where it does not"
    ),
    usage=ADOPT_USAGE,
    examples=(
        "/gpu adopt runpod abc123xyz rp1 --release-in 3h",
        "/gpu adopt compshare uhost-1a2b3c cs1 --user ubuntu --price 13.50/h",
    ),
    configure=_configure_adopt,
    handler=_adopt,
)
STATUS = CommandSpec(
    name="status",
    summary=N_(
        "The fleet: owner, GPUs, utilisation, memory, running job, time to deadline, "
        "cost so far; or one instance in detail"
    ),
    usage=STATUS_USAGE,
    examples=("/gpu status", "/gpu status box1"),
    configure=_configure_status,
    handler=_status,
)
LIST = CommandSpec(
    name="list",
    summary=N_(
        "Your instances as stored, without asking them, then the team in figures (by state, "
        "cost per hour, nearest deadlines); --all (an admin's default) adds the others' "
        "instances a page at a time"
    ),
    usage=LIST_USAGE,
    examples=("/gpu list", "/gpu list --all", "/gpu list --all --page 2"),
    configure=_configure_list,
    handler=_list,
    aliases=("ls",),
)
HEALTH = CommandSpec(
    name="health",
    summary=N_("The health checklist of an instance, pass/warn/fail/skip, each with a hint"),
    usage=HEALTH_USAGE,
    examples=("/gpu health box1", "/gpu health box1 --full"),
    configure=_configure_health,
    handler=_health,
)
EXTEND = CommandSpec(
    name="extend",
    summary=N_("Move an instance's deadline later"),
    usage=EXTEND_USAGE,
    examples=("/gpu extend box1 2h", "/gpu extend box1 1h30m"),
    configure=_configure_extend,
    handler=_extend,
)
RELEASE = CommandSpec(
    name="release",
    summary=N_(
        "Release an instance, or only stop it (its disk kept and billed); asks for "
        "confirmation first"
    ),
    usage=RELEASE_USAGE,
    examples=("/gpu release box1", "/gpu release box1 --stop"),
    configure=_configure_release,
    handler=_release,
)


def register(registry: Registry) -> None:
    """Add this module's commands and buttons to ``registry``."""
    for spec in (
        REGISTER,
        ADOPT,
        STATUS,
        LIST,
        HEALTH,
        EXTEND,
        RELEASE,
    ):
        registry.command(spec)
    for action in (
        ActionSpec(blocks.RELEASE_ASK, _release_ask_button),
        ActionSpec(blocks.RELEASE_CONFIRM, _release_confirm_button),
        ActionSpec(blocks.RELEASE_CANCEL, _release_cancel_button),
        ActionSpec(blocks.RELEASE_DONE, _release_done_button),
        ActionSpec(blocks.STOP_CONFIRM, _stop_confirm_button),
        ActionSpec(blocks.STOP_DONE, _stop_done_button),
        ActionSpec(blocks.START_INSTANCE, _start_button),
    ):
        registry.action(action)
