"""The manual provider: any platform, with or without an API. The bot cannot list or release
these instances itself; releasing (or stopping) means asking the owner to do it on the platform
and to confirm which they did (see bot.services.instances.releases). A stopped one bills its disk at
the storage price its owner gave."""

from __future__ import annotations

from bot.billing import ProviderBilling
from bot.errors import ProviderError
from bot.i18n import t
from bot.providers.base import (
    InstanceTypeInfo,
    LaunchRequest,
    ProviderCapabilities,
    ProviderInstance,
    ReleaseOutcome,
    no_launch,
)


class ManualProvider:
    """A platform the bot knows nothing about beyond what the owner told it."""

    name = "manual"
    capabilities = ProviderCapabilities(
        can_stop=True,
        storage_bills_when_stopped=True,
        billing=ProviderBilling("second", 0, "created", "as typed at registration"),
        can_launch=False,
        can_list=False,
        api_release=False,
    )

    def list_instances(self) -> list[ProviderInstance]:
        """Nothing: the bot cannot see these platforms."""
        return []

    def get(self, provider_id: str) -> ProviderInstance:
        """Always fails: the platform is not reachable through an API."""
        raise ProviderError(
            t("manual instances cannot be looked up ({provider_id!r}).", provider_id=provider_id),
            retryable=False,
            hint=t("Check the instance on its platform's own console."),
        )

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        """Not confirmed: the owner must release on the platform and press the confirm button."""
        return ReleaseOutcome(
            provider_id=provider_id,
            mode=mode,
            confirmed=False,
            state="running",
            detail="waiting for the owner to release it on the platform",
        )

    def price(self, instance_type: str) -> int | None:
        """Unknown: the owner gives the price at registration."""
        return None

    def instance_types(self) -> list[InstanceTypeInfo]:
        """None listed."""
        return []

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        """Always fails: rent by hand, then register."""
        raise no_launch(self.name)
