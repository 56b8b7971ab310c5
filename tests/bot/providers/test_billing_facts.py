"""Each platform's billing rules have one home, its provider module: billing reads those, and a
provider that does not declare them, or declares others, cannot be registered."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from bot import billing
from bot.billing import ProviderBilling
from bot.errors import UsageError
from bot.providers.aws import AwsProvider
from bot.providers.base import Provider, ProviderCapabilities
from bot.providers.compshare import CompshareProvider
from bot.providers.lambda_cloud import LambdaProvider
from bot.providers.manual import ManualProvider
from bot.providers.registry import (
    KNOWN_PROVIDERS,
    PLATFORM_BILLING,
    ProviderRegistry,
    platform_billing,
)
from bot.providers.runpod import RunpodProvider
from bot.providers.vast import VastProvider
from bot.settings import Settings
from bot.store.models import Instance

T0 = datetime(2026, 3, 10, 10, 0, 0)
CLASSES = (ManualProvider, AwsProvider, LambdaProvider, RunpodProvider, VastProvider)


@pytest.mark.parametrize("cls", [*CLASSES, CompshareProvider], ids=lambda c: c.name)
def test_billing_reads_the_rules_the_provider_module_declares(cls: type[Provider]) -> None:
    declared = cls.capabilities.billing
    assert platform_billing(cls.name) is declared
    row = Instance(
        name="box",
        owner_id="U1",
        host="10.0.0.1",
        ssh_user="root",
        provider=cls.name,
        created_at=T0,
        price_micros=3_600_000,
    )
    rules = billing.rules_for(row, platform_billing(row.provider))
    assert (rules.increment, rules.min_charge_s, rules.billing_from) == (
        declared.increment,
        declared.min_charge_s,
        declared.billing_from,
    )


def test_every_known_platform_has_its_rules_and_an_unknown_one_bills_as_typed() -> None:
    assert set(PLATFORM_BILLING) == set(KNOWN_PROVIDERS)
    assert platform_billing("a-platform-nobody-knows") is ManualProvider.capabilities.billing
    assert [name for name, rules in PLATFORM_BILLING.items() if not rules.verified] == ["compshare"]
    assert (platform_billing("aws").min_charge_s, platform_billing("lambda").billing_from) == (
        60,
        "ssh_ready",
    )


def test_the_configured_providers_bill_as_billing_reads_their_platform() -> None:
    registry = ProviderRegistry.from_settings(
        Settings(
            lambda_api_key="k",
            runpod_api_key="k",
            vast_api_key="k",
            compshare_public_key="pub",
            compshare_private_key="priv",
        )
    )
    assert registry.names() == sorted(KNOWN_PROVIDERS)
    for provider in registry.all():
        assert provider.capabilities.billing == platform_billing(provider.name)


def test_compshare_set_to_seconds_differs_only_in_its_unverified_increment() -> None:
    registry = ProviderRegistry.from_settings(
        Settings(compshare_public_key="p", compshare_private_key="k", compshare_billing="second")
    )
    configured = registry.get("compshare").capabilities.billing
    assert configured.increment == "second"
    assert replace(configured, increment="hour") == platform_billing("compshare")


class _Unbilled:
    """A provider whose capabilities say nothing of billing (duck-typed, as a Protocol allows)."""

    name = "unbilled"

    class capabilities:
        can_list = False


def _declaring(name: str, rules: ProviderBilling) -> ManualProvider:
    provider = ManualProvider()
    provider.name = name
    provider.capabilities = replace(ManualProvider.capabilities, billing=rules)
    return provider


def test_a_provider_without_billing_rules_cannot_be_registered() -> None:
    with pytest.raises(TypeError, match="does not declare its billing rules"):
        ProviderRegistry([_Unbilled()])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="does not declare"):
        ProviderRegistry().add(_Unbilled())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="billing"):
        ProviderCapabilities(can_stop=False, storage_bills_when_stopped=False, can_launch=False)  # type: ignore[call-arg]


def test_a_provider_declaring_other_rules_than_billing_reads_cannot_be_registered() -> None:
    sixty = replace(platform_billing("manual"), min_charge_s=60)
    with pytest.raises(TypeError, match="other than its platform's"):
        ProviderRegistry([_declaring("scripted", sixty)])
    hourly_aws = replace(platform_billing("aws"), increment="hour")  # documented: no setting
    with pytest.raises(TypeError, match="other than its platform's"):
        ProviderRegistry().add(_declaring("aws", hourly_aws))
    minimum = replace(platform_billing("compshare"), min_charge_s=60)  # only the increment
    with pytest.raises(TypeError, match="other than its platform's"):
        ProviderRegistry().add(_declaring("compshare", minimum))
    registry = ProviderRegistry([_declaring("scripted", platform_billing("scripted"))])
    # The same rules from another document bill the same: a stand-in may borrow them.
    registry.add(_declaring("runpod", platform_billing("manual")))
    assert registry.names() == ["runpod", "scripted"]


def test_a_rule_no_platform_uses_is_refused_where_it_is_declared() -> None:
    with pytest.raises(UsageError):
        ProviderBilling("fortnight", 0, "created", "nowhere")
    with pytest.raises(UsageError):
        ProviderBilling("second", -1, "created", "nowhere")
    with pytest.raises(UsageError):
        ProviderBilling("second", 0, "booted", "nowhere")


def test_a_documented_minimum_bills_a_short_start() -> None:
    row = Instance(
        name="box",
        owner_id="U1",
        host="10.0.0.1",
        ssh_user="root",
        provider="aws",
        created_at=T0,
        released_at=T0 + timedelta(seconds=30),
        price_micros=3_600_000,
    )
    assert billing.cost_so_far(row, platform_billing("aws"), T0 + timedelta(hours=1)) == 60_000
