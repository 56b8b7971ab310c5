"""Starting a stopped instance from the bot (the Start button of a stopped instance): the
platform is asked outside any transaction, and only the platform's own answer that it runs
records the start (the compute meter resumes from then and the instance gets a new deadline,
as when reconcile sees a start made on the platform). An answer that was not the platform's
own leaves the instance stopped: reconcile records the start once the platform lists it
running."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from bot.errors import Conflict, ProviderError, ProviderUnknownOutcome, UsageError
from bot.i18n import t
from bot.providers.base import Startable
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances import reconcile, releases
from bot.services.instances.lookup import by_id, instance_view
from bot.services.instances.views import InstanceView


@dataclass(frozen=True)
class StartResult:
    """After a start was asked: the instance as it stands (``started`` True when it runs
    again and its meter resumed; False when the platform is still starting it, and reconcile
    records the start once it runs)."""

    instance: InstanceView
    started: bool
    platform_state: str


def start(rt: Runtime, caller: Caller, instance_id: int) -> StartResult:
    """Start the stopped instance ``instance_id`` on its platform. Owner or admin. Raises
    NotFound, NotAuthorized, Conflict (not stopped, or a release under way), UsageError (its
    platform cannot be started from the bot), ProviderError (the platform refused; an unknown
    outcome is said as such: it may be starting)."""
    with rt.db.session() as session:
        inst = by_id(rt, session, instance_id)
        access.require_owner_or_admin(rt, caller, inst, action="start")
        if inst.state != releases.STOPPED:
            raise Conflict(
                t("{name} is not stopped.", name=inst.name),
                hint=t("`/gpu status {name}` shows where it stands.", name=inst.name),
            )
        if releases.open_release(session, instance_id) is not None:
            raise Conflict(
                t("{name} is being released.", name=inst.name),
                hint=t("`/gpu status {name}` shows where it stands.", name=inst.name),
            )
        provider_id = inst.provider_instance_id
        provider = rt.providers.get(inst.provider) if provider_id else None
    if provider is None or provider_id is None or not provider.capabilities.can_start:
        raise UsageError(
            t("The bot cannot start {name} on its platform.", name=inst.name),
            hint=t("Start it on the platform; the bot notices within a few minutes."),
        )
    try:
        seen = cast(Startable, provider).start(provider_id)
    except ProviderUnknownOutcome as exc:
        raise ProviderError(
            t(
                "{provider} did not answer as itself; {name} may be starting.",
                provider=inst.provider,
                name=inst.name,
            ),
            hint=t("The bot records the start once the platform lists it running."),
        ) from exc
    started = reconcile.record_started(rt, instance_id, seen, by=caller.user_id)
    with rt.db.session() as session:
        view = instance_view(by_id(rt, session, instance_id))
    return StartResult(view, started=started, platform_state=seen.raw_state or seen.state)
