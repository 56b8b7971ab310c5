"""Compshare's billing increment is a setting (GPUBOT_COMPSHARE_BILLING), because no document
of the platform states it: a registration through the provider bills by the configured
increment (per second too, which the old "not said" default swallowed), and every reply that
quotes its cost says the rule is unverified."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from bot import billing
from bot.blocks.instances import settings_text
from bot.blocks.money import final_cost_sentence
from bot.fleet.fleet import Fleet
from bot.i18n import speaking
from bot.providers.registry import ProviderRegistry, platform_billing
from bot.services.access import Caller
from bot.services.instances import lookup, registration
from bot.services.instances.registration import RegisterRequest
from bot.services.money import costs
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import Instance
from tests.bot.services.support import T0, Clock, RecordingNotifier, grant_key, make_runtime
from tests.fixtures.providers import COMPSHARE_PRIVATE_KEY, CompshareStandIn
from tests.fixtures.sshd import SshServer

pytestmark = pytest.mark.integration

ALICE = Caller("U0ALICE", channel_id="CTEAM", user_name="alice")
CNY = 1_000_000


@pytest.mark.parametrize(("increment", "billed_s"), [("hour", 2 * 3600), ("second", 70 * 60)])
def test_a_compshare_registration_bills_by_the_configured_increment_and_says_it_is_unverified(
    db: Database,
    sshd: SshServer,
    fake_gpu_zipapp: Path,
    tmp_path: Path,
    increment: str,
    billed_s: int,
) -> None:
    standin = CompshareStandIn(ssh_host=sshd.host, ssh_port=sshd.port)
    standin.start()
    settings = Settings(
        compshare_api_url=standin.url,
        compshare_public_key=standin.api_key,
        compshare_private_key=COMPSHARE_PRIVATE_KEY,
        compshare_billing=increment,
    )
    rt = make_runtime(
        db,
        Clock(),
        providers=[ProviderRegistry.from_settings(settings).get("compshare")],
        notifier=RecordingNotifier(),
        ssh_key_dir=sshd.directory,
        ssh_connect_timeout_s=3.0,
        ssh_command_timeout_s=30.0,
    )
    rt.fleet = Fleet(rt.settings, zipapp_path=fake_gpu_zipapp)
    grant_key(db, sshd.client_key_path.name, ALICE.user_id)
    try:
        uid = standin.add()
        result = registration.register(
            rt,
            ALICE,
            RegisterRequest(
                name="cs1",
                address=f"{sshd.user}@{sshd.host}:{sshd.port}",
                price_micros_per_hour=2 * CNY,
                release_in=timedelta(hours=3),
                key_name=sshd.client_key_path.name,
                provider="compshare",
                provider_id=uid,
                agent_home=str(tmp_path / "remote-home"),
            ),
        )
    finally:
        rt.fleet.close()
        rt.executor.shutdown(wait=True)
        standin.close()
    with db.session() as session:
        inst = session.get(Instance, result.instance.id)
        assert inst is not None
    # The documented default is not said again (NULL); another increment is stored.
    assert inst.billing_increment == (None if increment == "hour" else increment)
    assert billing.rules_for(inst, platform_billing(inst.provider)).increment == increment
    assert billing.unverified_increment(inst, platform_billing(inst.provider)) == increment

    shown = settings_text(lookup.settings_view(inst), rt.settings.tz())
    assert f"per {increment}" in shown
    assert "GPUBOT_COMPSHARE_BILLING" in shown
    assert "unverified" in shown

    start = billing.billing_start(inst, platform_billing(inst.provider))
    assert start is not None
    released = inst.model_copy(
        update={"state": "released", "released_at": start + timedelta(minutes=70)}
    )
    cost = costs.final_cost(released)
    assert cost is not None
    assert (cost.used_s, cost.billed_s) == (70 * 60, billed_s)
    assert cost.compute_micros == -(-billed_s * 2 * CNY // 3600)  # rounded up to the micro
    sentence = final_cost_sentence(cost)
    assert f"billed by the {increment} as GPUBOT_COMPSHARE_BILLING says" in sentence
    assert "unverified" in sentence
    with speaking("zh"):
        assert "未经核实" in final_cost_sentence(cost)


def test_a_documented_rule_adds_nothing_to_the_cost() -> None:
    inst = Instance(
        name="aws1",
        owner_id="U0ALICE",
        state="released",
        host="203.0.113.5",
        port=22,
        ssh_user="ubuntu",
        provider="aws",
        provider_instance_id="i-1",
        price_micros=3 * CNY,
        created_at=T0,
        released_at=T0 + timedelta(seconds=30),
    )
    assert billing.unverified_increment(inst, platform_billing(inst.provider)) is None
    cost = costs.final_cost(inst)
    assert cost is not None
    assert cost.billed_s == 60  # AWS's documented 60-second minimum, the registration said none
    assert "unverified" not in final_cost_sentence(cost)
