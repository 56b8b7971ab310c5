"""Answering the buttons of deadline warnings, idle prompts and release-when-done prompts.

A button carries its prompt's id. The first answer wins: a prompt already answered, or one whose
deadline has since moved, says so and changes nothing. An answered prompt's message is edited to
show what was decided and by whom (:class:`bot.services.instances.releases.Decided`). Each answer
returns
the notice the person who clicked reads. Releasing takes the same route as `/gpu release`
(:func:`bot.services.instances.releases.release_now`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlmodel import col, select

from bot.errors import AlreadyAnswered, Conflict, NotFound
from bot.i18n import t
from bot.notify import Notice
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances import deadlines, lifecycle, releases
from bot.services.instances.releases import Decided
from bot.services.instances.views import InstanceBrief
from bot.services.speaking import prompts
from bot.store.models import Instance, Prompt
from bot.values import duration_code


@dataclass(frozen=True)
class AnsweredBefore(Notice):
    """The prompt was answered already: ``resolution`` (like ``extended_1h``), by the Slack user
    ``by`` (None: the bot closed it)."""

    by: str | None
    resolution: str | None


@dataclass(frozen=True)
class BeingReleased(Notice):
    """The prompt's instance is no longer active: its release is under way or done (``state``)."""

    name: str
    state: str


@dataclass(frozen=True)
class ReleasePending(Notice):
    """The prompt's manual instance waits for its owner to confirm it is released on the
    platform; ``by_owner`` when the owner clicked."""

    instance: InstanceBrief
    by_owner: bool


@dataclass(frozen=True)
class Extended(Notice):
    """The deadline moved ``extended_s`` seconds later, to ``deadline_at`` (naive UTC, shown in
    ``tz_name``)."""

    instance: InstanceBrief
    extended_s: int
    deadline_at: datetime | None
    tz_name: str


@dataclass(frozen=True)
class ReleaseConfirmAsk(Notice):
    """After "Release now": the question whose button (value ``prompt_id``) confirms it."""

    instance: InstanceBrief
    prompt_id: int


@dataclass(frozen=True)
class Kept(Notice):
    """The owner keeps the instance: the idle or jobs-done prompt no longer releases it."""

    instance: InstanceBrief


@dataclass(frozen=True)
class ReleaseAnswered(Notice):
    """A release asked for from a prompt: the Release's ``state`` after its first attempt
    (``confirmed``, ``awaiting_owner`` for a manual platform, or still being worked on)."""

    instance: InstanceBrief
    state: str


@dataclass(frozen=True)
class ReleaseRefused(Notice):
    """The release could not be opened; ``reason`` says why (the Conflict's words)."""

    reason: str


def extend(rt: Runtime, caller: Caller, prompt_id: int, delta: timedelta) -> Notice:
    """Extend the deadline a warning is about by ``delta``
    (bot.services.instances.lifecycle.extend, the
    warning and its group answered with it). Raises NotFound, NotAuthorized, BudgetExceeded,
    Conflict and UsageError as that does."""
    clicked = _open_prompt(rt, caller, prompt_id, kinds=(deadlines.KIND_WARNING,))
    if isinstance(clicked, Notice):
        return clicked
    try:
        view = lifecycle.extend(rt, caller, clicked.inst.name, delta, answering=prompt_id)
    except AlreadyAnswered:
        return _answered_before(rt, prompt_id)
    _show_decision(rt, clicked, delta=delta, by=caller)
    brief = releases.instance_view(clicked.inst)
    return Extended(brief, int(delta.total_seconds()), view.deadline_at, rt.settings.timezone)


def extend_to_paid_hour(rt: Runtime, caller: Caller, prompt_id: int) -> Notice:
    """Keep the instance a warning is about to the last minute of the billed hour its deadline
    falls in (deadlines.paid_hour_end, read now: the button carries no time). Raises as
    :func:`extend`, and Conflict when there is no paid time left to keep."""
    clicked = _open_prompt(rt, caller, prompt_id, kinds=(deadlines.KIND_WARNING,))
    if isinstance(clicked, Notice):
        return clicked
    now = rt.now()
    base = max(clicked.inst.deadline_at or now, now)
    end = deadlines.paid_hour_end(clicked.inst, base)
    if end is None:
        raise Conflict(
            t("{name} has no paid time left in this hour to keep.", name=clicked.inst.name),
            hint=t("Extend it by an hour, or let it go."),
        )
    return extend(rt, caller, prompt_id, end - base)


def ask_release(rt: Runtime, caller: Caller, prompt_id: int) -> Notice:
    """ "Release now" on a warning: the question that confirms it (nothing changes yet). Raises
    NotFound, NotAuthorized."""
    clicked = _open_prompt(rt, caller, prompt_id, kinds=(deadlines.KIND_WARNING,))
    if isinstance(clicked, Notice):
        return clicked
    return ReleaseConfirmAsk(releases.instance_view(clicked.inst), prompt_id)


def confirm_release(rt: Runtime, caller: Caller, prompt_id: int) -> Notice:
    """The confirmed "Release now": release the instance (reason ``user``) and close the
    warnings of its deadline. Raises NotFound, NotAuthorized, ProviderError/ConfigError."""
    clicked = _open_prompt(rt, caller, prompt_id, kinds=(deadlines.KIND_WARNING,))
    if isinstance(clicked, Notice):
        return clicked
    return _release(rt, caller, clicked, reason="user")


def keep(rt: Runtime, caller: Caller, prompt_id: int) -> Notice:
    """ "Keep it" on an idle or jobs-done prompt: it no longer releases the instance. Raises
    NotFound, NotAuthorized."""
    clicked = _open_prompt(
        rt, caller, prompt_id, kinds=(deadlines.KIND_IDLE, deadlines.KIND_JOBS_DONE)
    )
    if isinstance(clicked, Notice):
        return clicked
    now = rt.now()
    with rt.db.session() as session:
        won = prompts.resolve(session, prompt_id, resolution="kept", by=caller.user_id, now=now)
    if not won:
        return _answered_before(rt, prompt_id)
    view = releases.instance_view(clicked.inst)
    decided = Decided(view, releases.KEPT, by=caller.user_id, at=now, tz_name=rt.settings.timezone)
    prompts.update_message(rt, clicked.prompt, decided)
    return Kept(view)


def release(rt: Runtime, caller: Caller, prompt_id: int) -> Notice:
    """ "Release it" on an idle or jobs-done prompt: release the instance (reason ``idle`` or
    ``jobs_done``). Raises NotFound, NotAuthorized, ProviderError/ConfigError."""
    clicked = _open_prompt(
        rt, caller, prompt_id, kinds=(deadlines.KIND_IDLE, deadlines.KIND_JOBS_DONE)
    )
    if isinstance(clicked, Notice):
        return clicked
    reason = "idle" if clicked.prompt.kind == deadlines.KIND_IDLE else "jobs_done"
    return _release(rt, caller, clicked, reason=reason)


@dataclass(frozen=True)
class _Clicked:
    prompt: Prompt
    inst: Instance


def _open_prompt(
    rt: Runtime, caller: Caller, prompt_id: int, *, kinds: tuple[str, ...]
) -> _Clicked | Notice:
    """The clicked prompt and its instance, when it is still open and current; otherwise what
    to answer (already answered, superseded, being released). Raises NotFound, NotAuthorized."""
    with rt.db.session() as session:
        prompt = session.get(Prompt, prompt_id)
        if prompt is None or prompt.kind not in kinds:
            raise NotFound(t("This prompt no longer exists."), hint=t("Use /gpu status NAME."))
        inst = session.get(Instance, prompt.instance_id)
        assert inst is not None
    access.require_owner_or_admin(rt, caller, inst, action="answer prompts about")
    if inst.state == "awaiting_confirmation":
        return ReleasePending(releases.instance_view(inst), caller.user_id == inst.owner_id)
    if prompt.resolved_at is not None:
        return _withdrawn(rt, prompt, inst) or _answered_before(rt, prompt_id)
    if inst.state != "active" and not _stopped_warning(rt, prompt, inst):
        return BeingReleased(inst.name, inst.state)
    if prompt.kind == deadlines.KIND_WARNING:
        deadline = deadlines.effective_deadline(inst)
        if deadline is None or not prompt.key.startswith(f"{deadline.key}:"):
            superseded = deadlines.Superseded(
                releases.instance_view(inst),
                deadline.at if deadline else None,
                rt.settings.timezone,
            )
            with rt.db.session() as session:
                prompts.resolve(session, prompt_id, resolution="superseded", by=None, now=rt.now())
            prompts.update_message(rt, prompt, superseded)
            return superseded
    return _Clicked(prompt, inst)


def _withdrawn(rt: Runtime, prompt: Prompt, inst: Instance) -> deadlines.Superseded | None:
    """A warning answered by a release that was since taken back (the instance runs with a new
    deadline): the deadline it has now, rather than "already answered: released"."""
    if (
        prompt.kind != deadlines.KIND_WARNING
        or prompt.resolution != "released"
        or inst.state != "active"
    ):
        return None
    deadline = deadlines.effective_deadline(inst)
    return deadlines.Superseded(
        releases.instance_view(inst), deadline.at if deadline else None, rt.settings.timezone
    )


def _stopped_warning(rt: Runtime, prompt: Prompt, inst: Instance) -> bool:
    """A warning about a stopped instance with no release under way: it can still be answered
    (extended, or released now)."""
    if prompt.kind != deadlines.KIND_WARNING or inst.state != releases.STOPPED:
        return False
    with rt.db.session() as session:
        return releases.open_release(session, inst.id or 0) is None


def _release(rt: Runtime, caller: Caller, clicked: _Clicked, *, reason: str) -> Notice:
    """Release through the one route `/gpu release` takes, then close the prompts it answers."""
    inst = clicked.inst
    assert inst.id is not None
    try:
        done = releases.release_now(rt, caller, inst.id, reason=reason)
    except Conflict as exc:
        return ReleaseRefused(exc.user_text())
    if clicked.prompt.kind == deadlines.KIND_WARNING:
        _close_warnings(rt, clicked, by=caller)
    else:
        _close_one(rt, clicked.prompt, by=caller)
    return ReleaseAnswered(releases.instance_view(inst), done.state)


def _close_warnings(rt: Runtime, clicked: _Clicked, *, by: Caller) -> None:
    """Answer every open warning about the same deadline (the 30- and the 10-minute one)."""
    prefix = clicked.prompt.key.rsplit(":", 1)[0] + ":"
    now = rt.now()
    closed: list[Prompt] = []
    with rt.db.session() as session:
        open_warnings = session.exec(
            select(Prompt)
            .where(
                Prompt.instance_id == clicked.prompt.instance_id,
                Prompt.kind == deadlines.KIND_WARNING,
                col(Prompt.key).startswith(prefix),
                col(Prompt.resolved_at).is_(None),
            )
            .order_by(col(Prompt.id))
        ).all()
        for prompt in open_warnings:
            assert prompt.id is not None
            if prompts.resolve(session, prompt.id, resolution="released", by=by.user_id, now=now):
                closed.append(prompt)
    decided = _release_requested(rt, clicked.inst, by, now)
    for prompt in closed:
        prompts.update_message(rt, prompt, decided)


def _close_one(rt: Runtime, prompt: Prompt, *, by: Caller) -> None:
    assert prompt.id is not None
    now = rt.now()
    with rt.db.session() as session:
        won = prompts.resolve(session, prompt.id, resolution="released", by=by.user_id, now=now)
        inst = session.get(Instance, prompt.instance_id)
        assert inst is not None
    if won:
        prompts.update_message(rt, prompt, _release_requested(rt, inst, by, now))


def _release_requested(rt: Runtime, inst: Instance, by: Caller, at: datetime) -> Decided:
    view = releases.instance_view(inst)
    return Decided(
        view, releases.RELEASE_REQUESTED, by=by.user_id, at=at, tz_name=rt.settings.timezone
    )


def _show_decision(rt: Runtime, clicked: _Clicked, *, delta: timedelta, by: Caller) -> None:
    """Edit the messages of the warnings an extension closed (their buttons go); they carry
    the resolution lifecycle.extend wrote."""
    prefix = clicked.prompt.key.rsplit(":", 1)[0] + ":"
    resolution = f"extended_{duration_code(delta)}"
    with rt.db.session() as session:
        closed = session.exec(
            select(Prompt)
            .where(
                Prompt.instance_id == clicked.prompt.instance_id,
                Prompt.kind == clicked.prompt.kind,
                col(Prompt.key).startswith(prefix),
                Prompt.resolution == resolution,
                Prompt.resolved_by == by.user_id,
            )
            .order_by(col(Prompt.id))
        ).all()
        inst = session.get(Instance, clicked.prompt.instance_id)
        assert inst is not None
    decided = Decided(
        releases.instance_view(inst),
        releases.EXTENDED,
        by=by.user_id,
        at=rt.now(),
        tz_name=rt.settings.timezone,
        extended_s=int(delta.total_seconds()),
    )
    for prompt in closed:
        prompts.update_message(rt, prompt, decided)


def _answered_before(rt: Runtime, prompt_id: int) -> AnsweredBefore:
    with rt.db.session() as session:
        prompt = session.get(Prompt, prompt_id)
        assert prompt is not None
    return AnsweredBefore(prompt.resolved_by, prompt.resolution)
