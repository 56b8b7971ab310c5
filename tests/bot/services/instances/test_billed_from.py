"""A rented instance is metered from when its platform started billing it (its creation or
running time, as the platform reports it), not from the moment its SSH answered."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

import pytest

from bot import billing
from bot.providers.registry import platform_billing
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import registration
from bot.store.db import Database
from bot.store.models import Instance
from tests.bot.services.support import Clock, get_instance, local_request

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM", user_name="owner")


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    return local_rt


def _register(rt: Runtime, db: Database, **changes: object) -> Instance:
    result = registration.register(rt, OWNER, local_request(**changes))
    assert result.instance.id is not None
    return get_instance(db, result.instance.id)


def test_a_rented_instance_is_metered_from_the_platforms_start(rt: Runtime, db: Database) -> None:
    now = cast(Clock, rt.clock).now
    launched = now - timedelta(minutes=7, seconds=30)

    inst = _register(rt, db, price_micros_per_hour=3_600_000, billed_from=launched)

    assert inst.created_at == launched
    # 7.5 minutes at $3.60/h, per second: the boot and the wait for SSH are billed too.
    assert (
        billing.cost_breakdown(inst, platform_billing(inst.provider), now).compute_micros == 450_000
    )


@pytest.mark.parametrize(
    "offset",
    [timedelta(minutes=5), -registration.BILLED_FROM_MAX_AGE - timedelta(seconds=1)],
    ids=["in the future", "older than any launch"],
)
def test_an_implausible_start_is_not_believed(rt: Runtime, db: Database, offset: timedelta) -> None:
    now = cast(Clock, rt.clock).now

    inst = _register(rt, db, billed_from=now + offset)

    assert inst.created_at == now


def test_without_a_platform_start_the_meter_starts_at_registration(
    rt: Runtime, db: Database
) -> None:
    now = cast(Clock, rt.clock).now

    assert _register(rt, db).created_at == now
