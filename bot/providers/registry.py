"""The configured GPU platforms by name, built from the settings.

``ProviderRegistry.from_settings`` builds every provider the settings allow; ``get`` raises
ConfigError for a platform that needs a key and NotFound for a name no provider has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bot.errors import ConfigError, NotFound
from bot.i18n import t
from bot.providers.aws import AwsProvider
from bot.providers.base import KNOWN_PROVIDERS, Provider
from bot.providers.compshare import CompshareProvider
from bot.providers.lambda_cloud import LambdaProvider
from bot.providers.manual import ManualProvider
from bot.providers.runpod import RunpodProvider
from bot.providers.vast import VastProvider
from bot.settings import Settings


class ProviderRegistry:
    """The configured providers by name; ``manual`` is always there."""

    def __init__(
        self,
        providers: Sequence[Provider] = (),
        *,
        missing: dict[str, str] | None = None,
        implicit: Sequence[str] = (),
    ) -> None:
        self._providers: dict[str, Provider] = {p.name: p for p in providers}
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
        """Add or replace a provider (used when building a registry by hand)."""
        self._providers[provider.name] = provider
        self._missing.pop(provider.name, None)
