"""The provider registry: what is configured, and what to do about what is not."""

from __future__ import annotations

import pytest

from bot.errors import ConfigError, NotFound, ProviderError
from bot.providers.lambda_cloud import LambdaProvider
from bot.providers.manual import ManualProvider
from bot.providers.registry import ProviderRegistry
from bot.settings import Settings


def test_manual_and_aws_are_always_there_rest_needs_a_key():
    registry = ProviderRegistry.from_settings(Settings(runpod_api_key="k"))
    assert registry.names() == ["aws", "manual", "runpod"]
    with pytest.raises(ConfigError) as caught:
        registry.get("lambda")
    assert "GPUBOT_LAMBDA_API_KEY" in caught.value.hint


def test_unknown_provider_lists_the_known_ones():
    with pytest.raises(NotFound) as caught:
        ProviderRegistry.from_settings(Settings()).get("azure")
    assert "manual, aws, lambda, runpod, vast" in caught.value.hint


def test_manual_cannot_be_listed_launched_or_stopped():
    manual = ProviderRegistry.from_settings(Settings()).get("manual")
    assert isinstance(manual, ManualProvider)
    assert not manual.capabilities.api_release
    assert manual.list_instances() == []
    assert not manual.release("x", "terminate").confirmed
    with pytest.raises(ProviderError, match="cannot rent") as caught:
        manual.launch(None)  # type: ignore[arg-type]
    assert "/gpu register" in caught.value.hint


def test_compshare_needs_both_keys():
    registry = ProviderRegistry.from_settings(Settings(compshare_public_key="pub"))
    with pytest.raises(ConfigError) as caught:
        registry.get("compshare")
    assert "GPUBOT_COMPSHARE_PUBLIC_KEY and GPUBOT_COMPSHARE_PRIVATE_KEY" in caught.value.hint
    both = ProviderRegistry.from_settings(
        Settings(compshare_public_key="pub", compshare_private_key="pk-7f3a9c")
    )
    assert "compshare" in both.names()
    assert "pk-7f3a9c" not in repr(Settings(compshare_private_key="pk-7f3a9c"))


def test_lambda_is_reached_at_its_documented_host():
    """Lambda's API documents ``https://cloud.lambda.ai/api/v1`` (formerly cloud.lambdalabs.com)."""
    lam = ProviderRegistry.from_settings(Settings(lambda_api_key="k")).get("lambda")
    assert Settings().lambda_api_url == "https://cloud.lambda.ai/api/v1"
    assert isinstance(lam, LambdaProvider)
    assert lam.api.base_url == "https://cloud.lambda.ai/api/v1"
