"""The contract every provider passes: aws against moto in server mode; lambda, runpod, vast and
compshare against their HTTP stand-ins (which refuse urllib's default User-Agent, as Cloudflare
does, so every test here also checks the bot's own)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

from bot.errors import (
    ProviderAuthError,
    ProviderBusy,
    ProviderError,
    ProviderNotFound,
    ProviderRateLimited,
    ProviderUnknownOutcome,
)
from bot.providers import aws
from bot.providers.aws import AwsProvider
from bot.providers.base import (
    PROVIDER_STATES,
    Provider,
    ProviderInstance,
    ReleaseOutcome,
)
from bot.providers.http import USER_AGENT
from bot.providers.registry import ProviderRegistry, platform_billing
from bot.settings import Settings
from tests.fixtures.platforms.aws import amazon_image
from tests.fixtures.providers import COMPSHARE_PRIVATE_KEY, StandIn

pytestmark = pytest.mark.integration

UNKNOWN_IDS = {
    "aws": "i-0123456789abcdef0",
    "lambda": "ffffffffffffffffffffffffffffffff",
    "runpod": "nosuchpod",
    "vast": "424242",
    "compshare": "uhost-nosuch",
}
REST = ["lambda", "runpod", "vast", "compshare"]
#: The request that changes a running instance when it is released, by platform: (method, a
#: fragment of its path). Compshare stops first (it terminates only stopped instances).
RELEASE_CALLS = {
    "lambda": ("POST", "terminate"),
    "runpod": ("DELETE", ""),
    "vast": ("DELETE", ""),
    "compshare": ("POST", "StopCompShareInstance"),
}
#: A release may take this many calls: Compshare stops, then terminates.
MOST_RELEASE_CALLS = 3


@dataclass
class Platform:
    """A provider and the platform behind it, seen from the platform's side."""

    provider: Provider
    create: Callable[[], str]
    terminate_outside: Callable[[str], None]
    stop_outside: Callable[[str], None] | None
    start_outside: Callable[[str], None] | None
    standin: StandIn | None


def _settings(**kwargs: object) -> Settings:
    return Settings(**kwargs)  # type: ignore[arg-type]


@pytest.fixture(params=["aws", *REST])
def platform(request: pytest.FixtureRequest) -> Iterator[Platform]:
    yield from _platform(request, request.param)


#: The platforms that can stop an instance (Lambda cannot).
STOPPABLE = ["aws", *(name for name in REST if name != "lambda")]


@pytest.fixture(params=STOPPABLE)
def stoppable_platform(request: pytest.FixtureRequest) -> Iterator[Platform]:
    yield from _platform(request, request.param)


@pytest.fixture(params=REST)
def rest_platform(request: pytest.FixtureRequest) -> Iterator[Platform]:
    """The REST platforms, whose stand-ins can be told to fail (AWS: see test_aws.py)."""
    yield from _platform(request, request.param)


def _platform(request: pytest.FixtureRequest, name: str) -> Iterator[Platform]:
    if name == "aws":
        url = request.getfixturevalue("aws_endpoint")
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
        image = amazon_image(ec2)

        def create() -> str:
            answer = ec2.run_instances(
                ImageId=image,
                InstanceType="g5.xlarge",
                MinCount=1,
                MaxCount=1,
                TagSpecifications=[
                    {"ResourceType": "instance", "Tags": [{"Key": "Name", "Value": "trainer"}]}
                ],
            )
            return answer["Instances"][0]["InstanceId"]

        provider = AwsProvider.from_settings(_settings(aws_endpoint_url=url))
        yield Platform(
            provider,
            create,
            lambda iid: ec2.terminate_instances(InstanceIds=[iid]),
            lambda iid: ec2.stop_instances(InstanceIds=[iid]),
            lambda iid: ec2.start_instances(InstanceIds=[iid]),
            None,
        )
        return
    standin = request.getfixturevalue(f"{name}_cloud")
    if name == "compshare":
        settings = _settings(
            compshare_api_url=standin.url,
            compshare_public_key=standin.api_key,
            compshare_private_key=COMPSHARE_PRIVATE_KEY,
        )
    else:
        settings = _settings(
            **{f"{name}_api_url": standin.url + ("/api/v1" if name == "lambda" else "")},
            **{f"{name}_api_key": standin.api_key},
        )
    registry = ProviderRegistry.from_settings(settings)
    yield Platform(
        registry.get(name),
        standin.add,
        standin.terminate_outside,
        getattr(standin, "stop_outside", None),
        getattr(standin, "start_outside", None),
        standin,
    )


#: The platforms whose 404 error document is their own not-found answer (Vast answers an
#: unknown instance with ``{"instances": null}``, Compshare with a RetCode, never a 404).
OWN_NOT_FOUND = ("lambda", "runpod")


def _release(provider: Provider, iid: str, mode: str) -> list[ReleaseOutcome]:
    """Call ``release`` until the platform confirms it (at most ``MOST_RELEASE_CALLS`` times);
    every answer but the last is work under way."""
    outcomes = [provider.release(iid, mode)]
    while not outcomes[-1].confirmed and len(outcomes) < MOST_RELEASE_CALLS:
        assert outcomes[-1].state in ("terminating", "stopping", "running"), outcomes[-1]
        outcomes.append(provider.release(iid, mode))
    return outcomes


def test_capabilities_are_sane(platform):
    caps = platform.provider.capabilities
    assert caps.billing.increment in ("second", "minute", "hour")
    assert caps.billing.min_charge_s >= 0
    assert caps.billing.billing_from in ("created", "ssh_ready")
    # The rules billing reads for the platform's instances are the ones its provider declares.
    assert platform_billing(platform.provider.name) == caps.billing
    assert caps.api_release
    assert caps.can_list
    assert caps.can_stop == (platform.stop_outside is not None)


def test_lists_and_gets_a_running_instance(platform):
    iid = platform.create()
    listed = {i.provider_id: i for i in platform.provider.list_instances()}
    assert iid in listed
    got = platform.provider.get(iid)
    assert got.provider_id == iid
    assert got.state in ("pending", "running")
    assert got.state in PROVIDER_STATES
    assert got.bills_compute
    assert listed[iid].state in ("pending", "running")
    # Whose it is: every platform gives a name or a label to show the ops channel.
    assert got.name == "trainer" or dict(got.tags).get("label") == "trainer"


def test_get_unknown_is_not_found(platform):
    with pytest.raises(ProviderNotFound):
        platform.provider.get(UNKNOWN_IDS[platform.provider.name])


def test_terminate_is_confirmed_and_idempotent(platform):
    iid = platform.create()
    outcomes = _release(platform.provider, iid, "terminate")
    if not outcomes[-1].confirmed:  # the platform is still shutting it down: look again
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
    stopped = platform.provider.get(iid)
    assert stopped.state == "stopped"
    assert not stopped.bills_compute
    assert platform.provider.release(iid, "stop").confirmed


def test_the_stoppable_platforms_say_they_can_stop(platform):
    assert platform.provider.capabilities.can_stop == (platform.provider.name in STOPPABLE)


def test_a_stopped_instance_terminates(stoppable_platform):
    platform = stoppable_platform
    iid = platform.create()
    _release(platform.provider, iid, "stop")
    assert _release(platform.provider, iid, "terminate")[-1].confirmed
    with contextlib.suppress(ProviderNotFound):
        assert platform.provider.get(iid).is_gone


def test_stopped_and_started_outside_the_bot(stoppable_platform):
    platform = stoppable_platform
    assert platform.stop_outside is not None
    assert platform.start_outside is not None
    iid = platform.create()
    platform.stop_outside(iid)
    seen = platform.provider.get(iid)
    if seen.state == "stopping":  # EC2 takes a moment
        seen = platform.provider.get(iid)
    assert seen.state == "stopped"
    platform.start_outside(iid)
    assert platform.provider.get(iid).state in ("pending", "running")


#: Each platform's own words for its states, and what they mean for the bot (from its
#: documents; see each provider module). A value is the fields to set on the stand-in's record.
STATE_DOCUMENTS: dict[str, list[tuple[dict[str, Any], str]]] = {
    "lambda": [  # (booting: the stand-in boots an instance at the first look)
        ({"status": "active"}, "running"),
        ({"status": "unhealthy"}, "running"),
        ({"status": "terminating"}, "terminating"),
        ({"status": "preempted"}, "terminated"),
    ],
    "runpod": [
        # REST v2's PodStatus (a TERMINATED pod is gone: RunPod's not-found document)
        ({"status": "PROVISIONING"}, "pending"),
        ({"status": "STARTING"}, "pending"),
        ({"status": "RUNNING"}, "running"),
        ({"status": "EXITED"}, "stopped"),
        ({"status": "ERROR"}, "crashed"),
    ],
    "vast": [
        ({"actual_status": None, "intended_status": "running"}, "pending"),
        ({"actual_status": "loading"}, "pending"),
        ({"actual_status": "running"}, "running"),
        ({"actual_status": "frozen", "intended_status": "frozen"}, "running"),
        (
            {"actual_status": "stopped", "intended_status": "stopped", "cur_state": "stopped"},
            "stopped",
        ),
        ({"actual_status": "running", "intended_status": "stopped"}, "stopping"),
        # A container that exited on its own is not a stop: its machine still bills.
        (
            {"actual_status": "exited", "intended_status": "running", "cur_state": "running"},
            "crashed",
        ),
        (
            {"actual_status": "exited", "intended_status": "stopped", "cur_state": "stopped"},
            "stopped",
        ),
        ({"actual_status": "offline"}, "running"),
        ({"cur_state": "unloaded"}, "terminated"),
    ],
    "compshare": [
        ({"State": "Initializing"}, "pending"),
        ({"State": "Starting"}, "pending"),
        ({"State": "Running"}, "running"),
        ({"State": "Rebooting"}, "running"),
        ({"State": "Stopped"}, "stopped"),
        ({"State": "Install Fail"}, "crashed"),
        ({"State": ""}, "running"),
    ],
}


@pytest.mark.parametrize("name", REST)
def test_states_map_from_the_platforms_documents(request, name):
    standin = request.getfixturevalue(f"{name}_cloud")
    provider = next(_platform(request, name)).provider
    for fields, expected in STATE_DOCUMENTS[name]:
        iid = standin.add()
        with standin.lock:
            standin.instances[iid].update(fields)
        listed = {i.provider_id: i for i in provider.list_instances()}
        if iid in listed:  # Lambda leaves terminated instances out of its list
            assert (fields, listed[iid].state) == (fields, expected)
        with standin.lock:  # a platform moves on between looks (Starting, then Running)
            standin.instances[iid].update(fields)
        assert (fields, provider.get(iid).state) == (fields, expected)


def test_ec2_states_map_from_its_documents():
    for raw, expected in [
        ("pending", "pending"),
        ("running", "running"),
        ("stopping", "stopping"),
        ("stopped", "stopped"),
        ("shutting-down", "terminating"),
        ("terminated", "terminated"),
    ]:
        found = aws._instance({"InstanceId": "i-1", "State": {"Name": raw}})
        assert found.state == expected


def test_every_request_names_the_bot(rest_platform):
    platform = rest_platform
    iid = platform.create()
    platform.provider.list_instances()
    platform.provider.get(iid)
    _release(platform.provider, iid, "terminate")
    assert platform.standin is not None
    assert platform.standin.user_agents
    assert set(platform.standin.user_agents) == {USER_AGENT}


def test_what_the_platform_says_about_whose_and_since_when(platform):
    iid = platform.create()
    got: ProviderInstance = platform.provider.get(iid)
    if platform.provider.name != "lambda":  # Lambda's instances carry no start time
        assert got.launched_at is not None
    if got.price_micros_per_hour is not None:
        assert got.currency == ("CNY" if platform.provider.name == "compshare" else "USD")


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (401, ProviderAuthError),
        (403, ProviderAuthError),
        (404, ProviderNotFound),
        (409, ProviderBusy),
        (429, ProviderRateLimited),
        (500, ProviderError),
        (503, ProviderError),
    ],
)
def test_http_errors_are_translated(rest_platform, status, error):
    platform = rest_platform
    assert platform.standin is not None
    platform.standin.fail_next(status, retry_after="7" if status == 429 else None)
    if status == 404 and platform.provider.name not in OWN_NOT_FOUND:
        # Not the platform's own not-found document for an instance: nothing is concluded.
        error = ProviderUnknownOutcome
    with pytest.raises(error) as caught:
        platform.provider.list_instances()
    assert f"HTTP {status}" in str(caught.value)
    if status == 429:
        assert caught.value.retry_after_s == 7
    if status >= 500 or status == 409:
        assert caught.value.retryable
    if status in (401, 403):
        assert not caught.value.retryable
        assert "API key" in caught.value.hint


def test_a_failing_release_raises_and_retrying_succeeds(rest_platform):
    platform = rest_platform
    assert platform.standin is not None
    iid = platform.create()
    method, fragment = RELEASE_CALLS[platform.provider.name]
    platform.standin.fail_next(500, method=method, path=fragment)
    with pytest.raises(ProviderError) as caught:
        platform.provider.release(iid, "terminate")
    assert caught.value.retryable
    assert _release(platform.provider, iid, "terminate")[-1].confirmed


def test_a_slow_platform_times_out_as_an_unknown_outcome(rest_platform):
    """The request was sent and the answer did not come in time: it may have been done."""
    platform = rest_platform
    assert platform.standin is not None
    api = platform.provider.api
    http = getattr(api, "api", api)  # Compshare signs on top of the same HTTP client
    http.timeout_s = 0.2
    platform.standin.holds["GET"] = platform.standin.holds["POST"] = 1.0
    with pytest.raises(ProviderUnknownOutcome, match="no answer came") as caught:
        platform.provider.list_instances()
    assert caught.value.retryable


def test_a_release_whose_answer_is_lost_is_an_unknown_outcome_that_was_done(rest_platform):
    """The platform acts and the connection drops before its answer: the bot hears an unknown
    outcome (never a plain failure to reach the API), and the retry finds the work done."""
    platform = rest_platform
    assert platform.standin is not None
    iid = platform.create()
    method, fragment = RELEASE_CALLS[platform.provider.name]
    platform.standin.lose_answers(1, method=method, path=fragment)
    if platform.provider.name == "compshare":
        # Compshare looks again after any act that failed, finds the stop under way, waits
        # for it and terminates.
        outcome = platform.provider.release(iid, "terminate")
        assert (outcome.confirmed, outcome.state) == (True, "terminated")
    else:
        with pytest.raises(ProviderUnknownOutcome, match="no answer came") as caught:
            platform.provider.release(iid, "terminate")
        assert caught.value.retryable
    assert platform.standin.lost == 1
    assert _release(platform.provider, iid, "terminate")[-1].confirmed


def test_the_stand_ins_refuse_urllib_s_own_user_agent(rest_platform):
    """What the User-Agent protects against: without it, Cloudflare (and the stand-ins) answer
    403 before looking at the key."""
    import urllib.error
    import urllib.request

    assert rest_platform.standin is not None
    request = urllib.request.Request(rest_platform.standin.url + "/", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 403
    assert rest_platform.standin.user_agents[-1].startswith("Python-urllib")


#: The disk and its storage price each platform's documents give for an instance of its
#: stand-in: (GB, micros per 730-hour GB-month, compute micros per hour). A platform left out
#: does not say them in its instance documents.
DISK_DOCUMENTS: dict[str, tuple[float, int, int]] = {
    # show instance: disk_space 86.4 GB, storage_total_cost 0.012 $/h (86.4 GB at 0.1
    # $/GB/month over Vast's 720 h), dph_total 0.712 = dph_base 0.7 + the disk.
    "vast": (86.4, round(0.012 / 86.4 * 730 * 1_000_000), 700_000),
    # a running pod: its 50 GB container disk and 20 GB volume at $0.10/GB-month (RunPod's
    # billing page), the pod's cost $0.69/h.
    "runpod": (70.0, 100_000, 690_000),
}


def test_disk_and_storage_are_the_platforms_or_none(platform: Platform):
    """Where a platform documents an instance's disk and storage price, the provider reads
    them (and a price with the disk in it is left without it); elsewhere they are None."""
    iid = platform.create()
    for seen in (platform.provider.get(iid), _listed(platform.provider, iid)):
        expected = DISK_DOCUMENTS.get(platform.provider.name)
        if expected is None:
            assert (seen.disk_gb, seen.storage_micros_per_gb_month) == (None, None)
            continue
        disk_gb, storage, compute = expected
        assert seen.disk_gb == disk_gb
        assert seen.storage_micros_per_gb_month == storage
        assert seen.price_micros_per_hour == compute


def _listed(provider: Provider, iid: str) -> ProviderInstance:
    return next(i for i in provider.list_instances() if i.provider_id == iid)
