"""The configured GPU platforms by name, built from the settings, and every platform's billing.

``ProviderRegistry.from_settings`` builds every provider the settings allow; ``get`` raises
ConfigError for a platform that needs a key and NotFound for a name no provider has.
``PLATFORM_BILLING`` holds each platform's documented billing rules as its provider module
declares them (``capabilities.billing``); ``platform_billing`` is what callers of bot.billing
pass for an instance's platform, configured or not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from bot.billing import ProviderBilling
from bot.errors import ConfigError, NotFound
from bot.i18n import t
from bot.providers.aws import AwsProvider
from bot.providers.base import Provider
from bot.providers.compshare import CompshareProvider
from bot.providers.lambda_cloud import LambdaProvider
from bot.providers.manual import ManualProvider
from bot.providers.runpod import RunpodProvider
from bot.providers.vast import VastProvider
from bot.settings import Settings

#: Each platform's documented billing rules, from its provider class: the rule an instance's
#: row does not say (NULL) is its platform's. Compshare's class holds the documented default;
#: a provider built from the settings may bill by another increment, which registration stores.
PLATFORM_BILLING: Mapping[str, ProviderBilling] = MappingProxyType(
    {
        ManualProvider.name: ManualProvider.capabilities.billing,
        AwsProvider.name: AwsProvider.capabilities.billing,
        LambdaProvider.name: LambdaProvider.capabilities.billing,
        RunpodProvider.name: RunpodProvider.capabilities.billing,
        VastProvider.name: VastProvider.capabilities.billing,
        CompshareProvider.name: CompshareProvider.capabilities.billing,
    }
)


#: Every platform the bot ships a provider for, by name (the classes listed above, in order).
KNOWN_PROVIDERS: tuple[str, ...] = tuple(PLATFORM_BILLING)


def platform_billing(provider: str) -> ProviderBilling:
    """The billing rules of the platform called ``provider``; a name no platform has (an
    instance of a platform the bot does not know) bills as typed, like ``manual``."""
    return PLATFORM_BILLING.get(provider, PLATFORM_BILLING["manual"])


class ProviderRegistry:
    """The configured providers by name; ``manual`` is always there."""

    def __init__(
        self,
        providers: Sequence[Provider] = (),
        *,
        missing: dict[str, str] | None = None,
        implicit: Sequence[str] = (),
    ) -> None:
        self._providers: dict[str, Provider] = {p.name: _billed(p) for p in providers}
        self._missing = dict(missing or {})
        self._implicit = frozenset(implicit)

    @classmethod
    def from_settings(cls, settings: Settings) -> ProviderRegistry:
        """Build every provider the settings allow. REST platforms need their API key; a platform
        without one is listed as missing, and ``get`` says which variable to set."""
        providers: list[Provider] = [ManualProvider(), AwsProvider.from_settings(settings)]
        missing: dict[str, str] = {}
        compshare_keys = settings.compshare_public_key and settings.compshare_private_key
        factories: tuple[tuple[str, str | None, str, Callable[[Settings], Provider]], ...] = (
            (
                "lambda",
                settings.lambda_api_key,
                "GPUBOT_LAMBDA_API_KEY",
                LambdaProvider.from_settings,
            ),
            (
                "runpod",
                settings.runpod_api_key,
                "GPUBOT_RUNPOD_API_KEY",
                RunpodProvider.from_settings,
            ),
            ("vast", settings.vast_api_key, "GPUBOT_VAST_API_KEY", VastProvider.from_settings),
            (
                "compshare",
                settings.compshare_private_key if compshare_keys else None,
                "GPUBOT_COMPSHARE_PUBLIC_KEY and GPUBOT_COMPSHARE_PRIVATE_KEY",
                CompshareProvider.from_settings,
            ),
        )
        for name, key, var, factory in factories:
            if key:
                providers.append(factory(settings))
            else:
                missing[name] = var
        # AWS is there without any setting (boto3 finds credentials itself): its account is
        # looked at only once the team uses it, or its endpoint is set.
        implicit = () if settings.aws_endpoint_url else ("aws",)
        return cls(providers, missing=missing, implicit=implicit)

    def get(self, name: str) -> Provider:
        """The provider called ``name``. Raises ConfigError when it needs configuring,
        NotFound when there is no such provider."""
        provider = self._providers.get(name)
        if provider is not None:
            return provider
        if name in self._missing:
            raise ConfigError(
                t("The {name} provider is not configured.", name=name),
                hint=t(
                    "Set {value} in the bot's environment and restart it.",
                    value=self._missing[name],
                ),
            )
        raise NotFound(
            t("There is no provider called {name!r}.", name=name),
            hint=t("Use one of: {choices}.", choices=", ".join(KNOWN_PROVIDERS)),
        )

    def names(self) -> list[str]:
        """The configured providers' names, in a stable order."""
        return sorted(self._providers)

    def all(self) -> list[Provider]:
        """The configured providers."""
        return [self._providers[name] for name in self.names()]

    def accounts(self, in_use: set[str] | frozenset[str] = frozenset()) -> list[Provider]:
        """The providers whose account the bot looks at (for instances nobody registered):
        those that can list, configured on purpose or named in ``in_use`` (the providers of
        registered instances)."""
        return [
            p
            for p in self.all()
            if p.capabilities.can_list and (p.name not in self._implicit or p.name in in_use)
        ]

    def add(self, provider: Provider) -> None:
        """Add or replace a provider (used when building a registry by hand). Raises TypeError
        for a provider that does not say how its platform bills."""
        self._providers[provider.name] = _billed(provider)
        self._missing.pop(provider.name, None)


def _billed(provider: Provider) -> Provider:
    """The provider, once it is known to bill as billing reads its platform's rules: it declares
    a :class:`ProviderBilling` (``capabilities.billing``) whose minimum, start and increment are
    :func:`platform_billing`'s, the increment aside only where no document states it and a
    setting decides it (registration then stores it). Raises TypeError otherwise."""
    declared = getattr(provider.capabilities, "billing", None)
    if not isinstance(declared, ProviderBilling):
        raise TypeError(f"provider {provider.name!r} does not declare its billing rules")
    documented = platform_billing(provider.name)
    same_increment = declared.increment == documented.increment or not documented.verified
    if not same_increment or (declared.min_charge_s, declared.billing_from) != (
        documented.min_charge_s,
        documented.billing_from,
    ):
        raise TypeError(
            f"provider {provider.name!r} declares billing rules other than its platform's"
        )
    return provider
