"""Changes of an instance's billing rules while it bills (its disk and storage price), each
written so the old rules bill up to the change and the new ones from it: the charges up to the
change are written and what was owed is carried (bot.billing.carry). Used by registration
(`/gpu storage`), reconcile (a platform's disk price at a stop or start) and releases (a stop
the bot made on a platform whose disk bills by state)."""

from __future__ import annotations

import logging
from datetime import datetime
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import exc as sa_exc
from sqlalchemy import update
from sqlmodel import Session, col

from bot import billing
from bot.errors import Conflict, GpubotError
from bot.i18n import t
from bot.providers.base import ProviderInstance
from bot.providers.registry import platform_billing
from bot.runtime import Runtime
from bot.services.money import ledger
from bot.store.models import Instance

log = logging.getLogger(__name__)


def change_storage(
    session: Session,
    inst: Instance,
    disk_gb: float,
    storage_micros_per_gb_month: int,
    now: datetime,
    tz: ZoneInfo,
) -> bool:
    """Set the instance's disk (GB) and storage price (micros per GB-month) from ``now``: its
    charges are written up to ``now`` and what its disk cost so far is carried, so the new
    price bills only from ``now``. False (nothing changed) when the price and size are the ones
    it has. The row is written only if its storage price, carried storage and state are still
    the ones read (else another process changed them meanwhile: raises Conflict, and the caller
    rolls back the charges written); a clash over the charges raises IntegrityError likewise."""
    changes: dict[str, object] = {
        "disk_gb": disk_gb,
        "storage_micros_per_gb_month": storage_micros_per_gb_month,
    }
    if not rules_change(inst, changes):
        return False
    assert inst.id is not None
    unchanged = (
        col(Instance.id) == inst.id,
        col(Instance.storage_micros_per_gb_month) == inst.storage_micros_per_gb_month,
        col(Instance.storage_carried_s) == inst.storage_carried_s,
        col(Instance.state) == inst.state,  # not stopped, started or released meanwhile
    )
    changes.update(close_rules(session, inst, now, tz))
    written = session.exec(
        update(Instance)
        .where(*unchanged)
        .values(**changes)
        .execution_options(synchronize_session=False)
    ).rowcount
    if written != 1:
        raise storage_clash(inst.name)
    session.refresh(inst)
    return True


def rules_change(inst: Instance, changes: dict[str, object]) -> bool:
    """Whether ``changes`` to the instance's fields change its billing rules."""
    platform = platform_billing(inst.provider)
    return billing.rules_for(inst, platform) != billing.rules_for(preview(inst, changes), platform)


def close_rules(session: Session, inst: Instance, now: datetime, tz: ZoneInfo) -> dict[str, int]:
    """Before the instance's billing rules change at ``now``: write its charges up to ``now``
    (under the rules in force) and return the carried fields to store with the new rules
    (bot.billing.carry). Raises IntegrityError when another process wrote a bucket first."""
    ledger.close_charges(session, inst, now, tz)
    return billing.carry(inst, platform_billing(inst.provider), now)


def storage_clash(name: str) -> Conflict:
    return Conflict(
        t("{name} changed while its storage was being set.", name=name), hint=t("Try again.")
    )


def preview(inst: Instance, changes: dict[str, object]) -> billing.BilledInstance:
    """The instance's billing fields as they would be after ``changes``."""
    values = {name: getattr(inst, name) for name in billing.BILLED_FIELDS}
    values.update((k, v) for k, v in changes.items() if k in billing.BILLED_FIELDS)
    preview: Any = SimpleNamespace(**values)
    return preview  # type: ignore[no-any-return]


def take_platform_storage(
    rt: Runtime, session: Session, inst: Instance, seen: ProviderInstance | None, now: datetime
) -> None:
    """A stopped registration without a storage price takes the platform's, where the platform
    says the disk and its price in the registration's currency, from ``now`` (so what it costs
    stopped is known). A price someone gave is left as it is, one given meanwhile too (the
    stop is recorded all the same) — except on a platform whose disk bills by the instance's
    state (``storage_follows_state``: RunPod), whose disk and price at each stop and start are
    what it bills from then on."""
    if seen is None:
        return
    if inst.storage_micros_per_gb_month > 0 and not follows_state(rt, inst.provider):
        return
    if seen.disk_gb is None or seen.storage_micros_per_gb_month is None:
        return
    if seen.currency != inst.currency:
        return
    try:
        with session.begin_nested():
            change_storage(
                session, inst, seen.disk_gb, seen.storage_micros_per_gb_month, now, rt.settings.tz()
            )
    except (Conflict, sa_exc.IntegrityError):
        log.info("%s's storage was set meanwhile; left as it is", inst.name)
    session.refresh(inst)


def follows_state(rt: Runtime, provider_name: str) -> bool:
    """Whether the platform bills the disk by the instance's state (its capabilities say)."""
    try:
        return rt.providers.get(provider_name).capabilities.storage_follows_state
    except GpubotError:
        return False
