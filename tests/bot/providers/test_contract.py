"""The contract every provider passes: aws against moto in server mode, lambda, runpod and vast
against their HTTP stand-ins."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import boto3
import pytest

from bot.errors import (
    ProviderAuthError,
    ProviderError,
    ProviderNotFound,
    ProviderRateLimited,
)
from bot.providers.aws import AwsProvider
from bot.providers.base import PROVIDER_STATES, Provider, ProviderRegistry
from bot.settings import Settings

pytestmark = pytest.mark.integration

UNKNOWN_IDS = {
    "aws": "i-0123456789abcdef0",
    "lambda": "ffffffffffffffffffffffffffffffff",
    "runpod": "nosuchpod",
    "vast": "424242",
}


@dataclass
class Platform:
    """A provider and the platform behind it, seen from the platform's side."""

    provider: Provider
    create: Callable[[], str]
    terminate_outside: Callable[[str], None]
    fail_next: Callable[..., None] | None


def _settings(**kwargs: object) -> Settings:
    return Settings(**kwargs)  # type: ignore[arg-type]


@pytest.fixture(params=["aws", "lambda", "runpod", "vast"])
def platform(request: pytest.FixtureRequest) -> Iterator[Platform]:
    yield from _platform(request, request.param)


@pytest.fixture(params=["lambda", "runpod", "vast"])
def rest_platform(request: pytest.FixtureRequest) -> Iterator[Platform]:
    """The REST platforms, whose stand-ins can be told to fail (AWS: see test_aws.py)."""
    yield from _platform(request, request.param)


def _platform(request: pytest.FixtureRequest, name: str) -> Iterator[Platform]:
    if name == "aws":
        url = request.getfixturevalue("aws_endpoint")
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]

        def create() -> str:
            answer = ec2.run_instances(
                ImageId=image, InstanceType="g5.xlarge", MinCount=1, MaxCount=1
            )
            return answer["Instances"][0]["InstanceId"]

        provider = AwsProvider.from_settings(_settings(aws_endpoint_url=url))
        yield Platform(
            provider,
            create,
            lambda iid: ec2.terminate_instances(InstanceIds=[iid]),
            None,
        )
        return
    standin = request.getfixturevalue(f"{name}_cloud")
    settings = _settings(
        **{f"{name}_api_url": standin.url + ("/api/v1" if name == "lambda" else "")},
        **{f"{name}_api_key": standin.api_key},
    )
    registry = ProviderRegistry.from_settings(settings)
    yield Platform(registry.get(name), standin.add, standin.terminate_outside, standin.fail_next)


def test_capabilities_are_sane(platform):
    caps = platform.provider.capabilities
    assert caps.billing_increment in ("second", "minute", "hour")
    assert caps.min_charge_s >= 0
    assert caps.api_release
    assert caps.can_list


def test_lists_and_gets_a_running_instance(platform):
    iid = platform.create()
    listed = {i.provider_id: i for i in platform.provider.list_instances()}
    assert iid in listed
    got = platform.provider.get(iid)
    assert got.provider_id == iid
    assert got.state in ("pending", "running")
    assert got.state in PROVIDER_STATES
    assert listed[iid].state in ("pending", "running")


def test_get_unknown_is_not_found(platform):
    with pytest.raises(ProviderNotFound):
        platform.provider.get(UNKNOWN_IDS[platform.provider.name])


def test_terminate_is_confirmed_and_idempotent(platform):
    iid = platform.create()
    first = platform.provider.release(iid, "terminate")
    if not first.confirmed:  # the platform is still shutting it down: look again
        assert first.state in ("terminating", "running")
        assert platform.provider.get(iid).is_gone
    again = platform.provider.release(iid, "terminate")
    assert again.confirmed
    running = [i for i in platform.provider.list_instances() if i.provider_id == iid]
    assert all(i.state == "terminated" for i in running)


def test_release_of_an_unknown_instance_counts_as_gone(platform):
    outcome = platform.provider.release(UNKNOWN_IDS[platform.provider.name], "terminate")
    assert outcome.confirmed
    assert outcome.already_gone


def test_terminated_outside_shows_as_gone(platform):
    iid = platform.create()
    platform.terminate_outside(iid)
    try:
        gone = platform.provider.get(iid).is_gone
    except ProviderNotFound:
        gone = True
    assert gone
    outcome = platform.provider.release(iid, "terminate")
    assert outcome.confirmed


def test_stop_where_the_platform_can(platform):
    iid = platform.create()
    if not platform.provider.capabilities.can_stop:
        with pytest.raises(ProviderError, match="cannot stop"):
            platform.provider.release(iid, "stop")
        assert platform.provider.get(iid).state == "running"
        return
    outcome = platform.provider.release(iid, "stop")
    if not outcome.confirmed:
        assert outcome.state == "stopping"
    assert platform.provider.get(iid).state == "stopped"
    assert platform.provider.release(iid, "stop").confirmed


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (401, ProviderAuthError),
        (403, ProviderAuthError),
        (404, ProviderNotFound),
        (429, ProviderRateLimited),
        (500, ProviderError),
        (503, ProviderError),
    ],
)
def test_http_errors_are_translated(rest_platform, status, error):
    platform = rest_platform
    assert platform.fail_next is not None
    platform.fail_next(status, retry_after="7" if status == 429 else None)
    with pytest.raises(error) as caught:
        platform.provider.list_instances()
    assert f"HTTP {status}" in str(caught.value)
    if status == 429:
        assert caught.value.retry_after_s == 7
    if status >= 500:
        assert caught.value.retryable
    if status in (401, 403):
        assert not caught.value.retryable
        assert "API key" in caught.value.hint


def test_a_failing_release_raises_and_retrying_succeeds(rest_platform):
    platform = rest_platform
    assert platform.fail_next is not None
    iid = platform.create()
    platform.fail_next(500, method="DELETE")
    platform.fail_next(500, method="POST", path="terminate")
    with pytest.raises(ProviderError) as caught:
        platform.provider.release(iid, "terminate")
    assert caught.value.retryable
    outcome = platform.provider.release(iid, "terminate")
    assert outcome.confirmed
