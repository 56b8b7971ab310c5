"""The console's `local`, stored without a price when the console starts and registered at a
price a moment later, is billed at that one price: its release says so, never "partly at an
earlier price"."""

from __future__ import annotations

from typing import cast

import pytest

from bot.blocks.money import final_cost_sentence
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import registration, releases
from bot.services.money import costs
from tests.bot.services.support import Clock, get_instance, local_request

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM", user_name="owner")


@pytest.mark.integration
@pytest.mark.parametrize("after_s", [0.0, 0.4])
def test_local_registered_at_a_price_costs_that_one_price(
    local_rt: Runtime, after_s: float
) -> None:
    """Register `local` at $2.00/h by the hour the moment the console stored it, release it
    70 minutes later: "$4.00: 1h10m billed as 2 h at $2.00/h"."""
    clock = cast(Clock, local_rt.clock)
    local = registration.ensure_local_instance(local_rt, OWNER.user_id)
    clock.advance(seconds=after_s)
    registration.register(
        local_rt,
        OWNER,
        local_request(price_micros_per_hour=2_000_000, billing="hour", gpu_count=2),
    )
    clock.advance(minutes=70)
    releases.release_now(local_rt, OWNER, local.id)
    releases.confirm_manual_release(local_rt, OWNER, local.id)
    cost = costs.final_cost(get_instance(local_rt.db, local.id))
    assert cost is not None
    sentence = final_cost_sentence(cost)
    assert "earlier price" not in sentence
    assert sentence == " It cost $4.00: 1h10m billed as 2 h at $2.00/h."
    assert cost.total_micros == 4_000_000
