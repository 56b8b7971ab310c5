"""`/gpu rent`, `/gpu policy`, `/gpu cap` and the buttons of deadline warnings, idle prompts and
release-when-done prompts.

Prompt buttons carry the prompt's id. The first answer wins: a prompt already answered, or one
whose deadline has since moved, says so and changes nothing. An answered prompt's message is
edited to show what was decided and by whom.
"""

from __future__ import annotations

import argparse
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlmodel import col, select

from bot.blocks import deadlines as blocks
from bot.blocks.kit import escape
from bot.commands.registry import REGISTRY, ActionSpec, CommandSpec, Reply
from bot.errors import AlreadyAnswered, Conflict, GpubotError, NotFound, UsageError
from bot.providers.base import KNOWN_PROVIDERS
from bot.services import access, deadlines, prompts, releases
from bot.services import instances as instance_service
from bot.services import rent as rent_service
from bot.services.access import Caller
from bot.store.models import Instance, Prompt
from bot.values import format_duration, parse_duration, parse_price, parse_when

if TYPE_CHECKING:
    from bot.runtime import Runtime

log = logging.getLogger(__name__)

RENT_USAGE = (
    "/gpu rent PROVIDER TYPE [--count N] [--name NAME] [--release-in 3h | --release-at 18:00] "
    "[--price 1.01/h] [--image AMI] [--ssh-key NAME] [--region R] [--user root] [--key NAME] "
    "[--project P] [--python PATH] [--disk GB]"
)
POLICY_USAGE = (
    "/gpu policy NAME [--at-deadline release|wait-for-jobs] [--max-grace 2h] "
    "[--idle-release 1h|off] [--release-when-done on|off]"
)
CAP_USAGE = "/gpu cap NAME 3d|none"


# --- prompt buttons -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Clicked:
    prompt: Prompt
    inst: Instance


def _extend_1h(rt: Runtime, caller: Caller, value: str) -> Reply:
    return _extend(rt, caller, value, timedelta(hours=1))


def _extend_4h(rt: Runtime, caller: Caller, value: str) -> Reply:
    return _extend(rt, caller, value, timedelta(hours=4))


def _extend(rt: Runtime, caller: Caller, value: str, delta: timedelta) -> Reply:
    clicked = _open_prompt(rt, caller, value, kinds=(deadlines.KIND_WARNING,))
    if isinstance(clicked, Reply):
        return clicked
    inst = clicked.inst
    assert clicked.prompt.id is not None
    try:
        view = instance_service.extend(rt, caller, inst.name, delta, answering=clicked.prompt.id)
    except AlreadyAnswered:
        return _already_answered(rt, clicked.prompt.id)
    what = f"Extended {format_duration(delta)}"
    _show_decision(
        rt, clicked, resolution=f"extended_{format_duration(delta)}", what=what, by=caller
    )
    new_deadline = view.deadline_at
    tail = (
        f"; the deadline is now {blocks.when(new_deadline, rt.settings.tz())}"
        if new_deadline
        else ""
    )
    return Reply(text=f"{what}: *{inst.name}*{tail}.")


def _release_now(rt: Runtime, caller: Caller, value: str) -> Reply:
    clicked = _open_prompt(rt, caller, value, kinds=(deadlines.KIND_WARNING,))
    if isinstance(clicked, Reply):
        return clicked
    assert clicked.prompt.id is not None
    text, body = blocks.release_confirm(
        releases.instance_view(clicked.inst), prompt_id=clicked.prompt.id
    )
    return Reply(text=text, blocks=body)


def _release_confirm(rt: Runtime, caller: Caller, value: str) -> Reply:
    clicked = _open_prompt(rt, caller, value, kinds=(deadlines.KIND_WARNING,))
    if isinstance(clicked, Reply):
        return clicked
    return _release(rt, caller, clicked, reason="user", what="Release requested")


def _idle_keep(rt: Runtime, caller: Caller, value: str) -> Reply:
    clicked = _open_prompt(rt, caller, value, kinds=(deadlines.KIND_IDLE, deadlines.KIND_JOBS_DONE))
    if isinstance(clicked, Reply):
        return clicked
    assert clicked.prompt.id is not None
    now = rt.now()
    with rt.db.session() as session:
        won = prompts.resolve(
            session, clicked.prompt.id, resolution="kept", by=caller.user_id, now=now
        )
    if not won:
        return _already_answered(rt, clicked.prompt.id)
    view = releases.instance_view(clicked.inst)
    text, body = blocks.decided(view, what="Kept", by=caller.user_id, at=now, tz=rt.settings.tz())
    prompts.update_message(rt, clicked.prompt, text, body)
    return Reply(text=f"Kept *{clicked.inst.name}*; it will not be released for this.")


def _idle_release(rt: Runtime, caller: Caller, value: str) -> Reply:
    clicked = _open_prompt(rt, caller, value, kinds=(deadlines.KIND_IDLE, deadlines.KIND_JOBS_DONE))
    if isinstance(clicked, Reply):
        return clicked
    reason = "idle" if clicked.prompt.kind == deadlines.KIND_IDLE else "jobs_done"
    return _release(rt, caller, clicked, reason=reason, what="Release requested")


def _open_prompt(
    rt: Runtime, caller: Caller, value: str, *, kinds: tuple[str, ...]
) -> _Clicked | Reply:
    """The clicked prompt and its instance, when it is still open and current; otherwise the
    answer to give (already answered, superseded, released). Raises NotAuthorized."""
    prompt_id = _prompt_id(value)
    with rt.db.session() as session:
        prompt = session.get(Prompt, prompt_id)
        if prompt is None or prompt.kind not in kinds:
            raise NotFound("This prompt no longer exists.", hint="Use /gpu status NAME.")
        inst = session.get(Instance, prompt.instance_id)
        assert inst is not None
    access.require_owner_or_admin(rt, caller, inst, action="answer prompts about")
    if prompt.resolved_at is not None:
        return _already_answered(rt, prompt_id)
    if inst.state != "active":
        return Reply(text=f"*{inst.name}* is already being released ({inst.state}).")
    if prompt.kind == deadlines.KIND_WARNING:
        deadline = deadlines.effective_deadline(inst)
        if deadline is None or not prompt.key.startswith(f"{deadline.key}:"):
            text, body = blocks.superseded(
                releases.instance_view(inst),
                new_deadline_at=deadline.at if deadline else None,
                tz=rt.settings.tz(),
            )
            with rt.db.session() as session:
                prompts.resolve(session, prompt_id, resolution="superseded", by=None, now=rt.now())
            prompts.update_message(rt, prompt, text, body)
            return Reply(text=text)
    return _Clicked(prompt, inst)


def _release(rt: Runtime, caller: Caller, clicked: _Clicked, *, reason: str, what: str) -> Reply:
    inst = clicked.inst
    assert inst.id is not None
    try:
        opened = releases.request_release(rt, inst.id, reason=reason, requested_by=caller.user_id)
    except Conflict as exc:
        return Reply(text=exc.user_text())
    if clicked.prompt.kind == deadlines.KIND_WARNING:
        _close_warnings(rt, clicked, resolution="released", what=what, by=caller)
    else:
        _close_one(rt, clicked.prompt, resolution="released", what=what, by=caller)
    assert opened.id is not None
    done = releases.process_release(rt, opened.id)
    rt.fleet.forget(inst.name)
    if done.state == "confirmed":
        return Reply(text=f"*{inst.name}* is released.")
    if done.state == "awaiting_owner":
        return Reply(text=f"Release *{inst.name}* on its platform, then press the button I sent.")
    return Reply(
        text=f"Releasing *{inst.name}* ({done.state}); I will say when the platform confirms."
    )


def _close_warnings(
    rt: Runtime, clicked: _Clicked, *, resolution: str, what: str, by: Caller
) -> None:
    """Answer every open warning about the same deadline (the 30- and the 10-minute one)."""
    prefix = clicked.prompt.key.rsplit(":", 1)[0] + ":"
    now = rt.now()
    closed: list[Prompt] = []
    with rt.db.session() as session:
        open_warnings = session.exec(
            select(Prompt).where(
                Prompt.instance_id == clicked.prompt.instance_id,
                Prompt.kind == deadlines.KIND_WARNING,
                col(Prompt.key).startswith(prefix),
                col(Prompt.resolved_at).is_(None),
            )
        ).all()
        for prompt in open_warnings:
            assert prompt.id is not None
            if prompts.resolve(session, prompt.id, resolution=resolution, by=by.user_id, now=now):
                closed.append(prompt)
    view = releases.instance_view(clicked.inst)
    text, body = blocks.decided(view, what=what, by=by.user_id, at=now, tz=rt.settings.tz())
    for prompt in closed:
        prompts.update_message(rt, prompt, text, body)


def _show_decision(
    rt: Runtime, clicked: _Clicked, *, resolution: str, what: str, by: Caller
) -> None:
    """Edit the messages of the prompts this answer closed (their buttons go)."""
    prefix = clicked.prompt.key.rsplit(":", 1)[0] + ":"
    with rt.db.session() as session:
        closed = session.exec(
            select(Prompt).where(
                Prompt.instance_id == clicked.prompt.instance_id,
                Prompt.kind == clicked.prompt.kind,
                col(Prompt.key).startswith(prefix),
                Prompt.resolution == resolution,
                Prompt.resolved_by == by.user_id,
            )
        ).all()
        inst = session.get(Instance, clicked.prompt.instance_id)
        assert inst is not None
    view = releases.instance_view(inst)
    text, body = blocks.decided(view, what=what, by=by.user_id, at=rt.now(), tz=rt.settings.tz())
    for prompt in closed:
        prompts.update_message(rt, prompt, text, body)


def _close_one(rt: Runtime, prompt: Prompt, *, resolution: str, what: str, by: Caller) -> None:
    assert prompt.id is not None
    now = rt.now()
    with rt.db.session() as session:
        won = prompts.resolve(session, prompt.id, resolution=resolution, by=by.user_id, now=now)
        inst = session.get(Instance, prompt.instance_id)
        assert inst is not None
    if won:
        text, body = blocks.decided(
            releases.instance_view(inst), what=what, by=by.user_id, at=now, tz=rt.settings.tz()
        )
        prompts.update_message(rt, prompt, text, body)


def _already_answered(rt: Runtime, prompt_id: int) -> Reply:
    with rt.db.session() as session:
        prompt = session.get(Prompt, prompt_id)
        assert prompt is not None
    who = f" by <@{prompt.resolved_by}>" if prompt.resolved_by else ""
    decision = (prompt.resolution or "answered").replace("_", " ")
    return Reply(text=f"This was already answered{who}: {decision}.")


def _prompt_id(value: str) -> int:
    if not (value.isascii() and value.isdigit()):
        raise UsageError("This button is broken; use /gpu status NAME instead.")
    return int(value)


# --- /gpu rent -----------------------------------------------------------------------------------


def _configure_rent(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("provider", type=str.lower, choices=KNOWN_PROVIDERS, metavar="PROVIDER")
    parser.add_argument("instance_type", metavar="TYPE")
    parser.add_argument("--count", type=_count, default=1, metavar="N")
    parser.add_argument("--name", metavar="NAME")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--release-in", type=parse_duration, metavar="3h")
    when.add_argument("--release-at", metavar="18:00")
    parser.add_argument("--price", type=parse_price, metavar="1.01/h")
    parser.add_argument("--image", metavar="AMI")
    parser.add_argument("--ssh-key", metavar="NAME")
    parser.add_argument("--region", metavar="REGION")
    parser.add_argument("--user", default="root", metavar="USER")
    parser.add_argument("--key", metavar="NAME")
    parser.add_argument("--project", metavar="P")
    parser.add_argument("--python", metavar="PATH")
    parser.add_argument("--disk", type=_count_gb, metavar="GB")


def _rent(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    release_at = None
    if args.release_at is not None:
        release_at = parse_when(args.release_at, now_utc=rt.now(), tz=rt.settings.tz())
    request = rent_service.RentRequest(
        provider=args.provider,
        instance_type=args.instance_type,
        count=args.count,
        name=args.name,
        price_micros_per_hour=args.price,
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
    rt.executor.submit(_rent_in_background, rt, caller, plan)
    text, body = blocks.rent_started(plan.provider.name, request.instance_type, plan.names)
    return Reply(text=text, blocks=body, ephemeral=False)


def _rent_in_background(rt: Runtime, caller: Caller, plan: rent_service.RentPlan) -> None:
    where = caller.channel_id or caller.user_id
    key = f"rent:{caller.user_id}:{uuid.uuid4().hex}"  # this rent's outcome is said once
    try:
        result = rent_service.rent(rt, caller, plan)
    except GpubotError as exc:
        text = f":x: Renting on {plan.provider.name} failed: {escape(exc.user_text())}"
        prompts.notify(rt, where, text, (), key=key)
        return
    except Exception:  # a background task has nobody else to tell
        log.exception("renting on %s failed", plan.provider.name)
        text = f":x: Renting on {plan.provider.name} failed; see the bot's log."
        prompts.notify(rt, where, text, (), key=key)
        return
    text, body = blocks.rent_finished(
        plan.provider.name,
        [r.instance.name for r in result.registered],
        list(result.failed),
        caller.user_id,
    )
    prompts.notify(rt, where, text, body, key=key)


def _count(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= rent_service.MAX_COUNT:
        raise UsageError(
            f"{text[:20]!r} is not an instance count.", hint=f"Use 1 to {rent_service.MAX_COUNT}."
        )
    return int(text)


def _count_gb(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 100_000:
        raise UsageError(f"{text[:20]!r} is not a disk size in GB.", hint="Like --disk 200.")
    return int(text)


# --- /gpu policy and /gpu cap --------------------------------------------------------------------


def _configure_policy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument(
        "--at-deadline", choices=deadlines.POLICIES, metavar="release|wait-for-jobs"
    )
    parser.add_argument("--max-grace", type=parse_duration, metavar="2h")
    parser.add_argument("--idle-release", type=_duration_or_off, metavar="1h|off")
    parser.add_argument("--release-when-done", type=_on_off, metavar="on|off")


def _policy(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    change = deadlines.PolicyChange(
        at_deadline=args.at_deadline,
        max_grace_s=int(args.max_grace.total_seconds()) if args.max_grace else None,
        idle_release_after_s=args.idle_release,
        release_when_done=args.release_when_done,
    )
    return _policy_reply(rt, deadlines.set_policy(rt, caller, args.name, change))


def _configure_cap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("lifetime", type=_duration_or_none, metavar="3d|none")


def _cap(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    lifetime = None if args.lifetime is None else timedelta(seconds=args.lifetime)
    return _policy_reply(rt, deadlines.set_lifetime_cap(rt, caller, args.name, lifetime))


def _policy_reply(rt: Runtime, view: deadlines.PolicyView) -> Reply:
    text, body = blocks.policy_summary(
        name=view.name,
        deadline_at=view.deadline_at,
        lifetime_cap_at=view.lifetime_cap_at,
        at_deadline=view.at_deadline,
        max_grace_s=view.max_grace_s,
        idle_release_after_s=view.idle_release_after_s,
        release_when_done=view.release_when_done,
        tz=rt.settings.tz(),
    )
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
    raise UsageError(f"{text[:20]!r} is not on or off.")


# --- the specs -----------------------------------------------------------------------------------


RENT = REGISTRY.command(
    CommandSpec(
        name="rent",
        summary="rent an instance through a provider's API, then register it",
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
)
POLICY = REGISTRY.command(
    CommandSpec(
        name="policy",
        summary="what happens at the deadline, when idle, and when the jobs are done",
        usage=POLICY_USAGE,
        examples=(
            "/gpu policy box1 --at-deadline wait-for-jobs --max-grace 2h",
            "/gpu policy box1 --idle-release 1h",
            "/gpu policy box1 --release-when-done on",
        ),
        configure=_configure_policy,
        handler=_policy,
    )
)
CAP = REGISTRY.command(
    CommandSpec(
        name="cap",
        summary="(admin) the longest an instance may live, counted from its registration",
        usage=CAP_USAGE,
        examples=("/gpu cap box1 3d", "/gpu cap box1 none"),
        configure=_configure_cap,
        handler=_cap,
    )
)
REGISTRY.action(ActionSpec(blocks.EXTEND_1H, _extend_1h))
REGISTRY.action(ActionSpec(blocks.EXTEND_4H, _extend_4h))
REGISTRY.action(ActionSpec(blocks.RELEASE_NOW, _release_now))
REGISTRY.action(ActionSpec(blocks.RELEASE_CONFIRM, _release_confirm))
REGISTRY.action(ActionSpec(blocks.IDLE_KEEP, _idle_keep))
REGISTRY.action(ActionSpec(blocks.IDLE_RELEASE, _idle_release))
