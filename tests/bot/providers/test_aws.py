"""The EC2 provider: GPU info from describe_instance_types, launch, stop, and error translation
(moto in server mode; an EC2 error stand-in for the answers moto cannot give)."""

from __future__ import annotations

import boto3
import pytest

from bot.errors import (
    ProviderAuthError,
    ProviderError,
    ProviderNotFound,
    ProviderRateLimited,
    ProviderUnknownOutcome,
)
from bot.providers.aws import AwsProvider
from bot.providers.base import LaunchRequest
from bot.settings import Settings
from tests.fixtures.platforms.aws import amazon_image
from tests.fixtures.platforms.ec2_proxy import Ec2Proxy

pytestmark = pytest.mark.integration


@pytest.fixture
def aws(aws_endpoint):
    return AwsProvider.from_settings(Settings(aws_endpoint_url=aws_endpoint))


@pytest.fixture
def image(aws_endpoint):
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_endpoint)
    return amazon_image(ec2)


@pytest.mark.parametrize(
    ("type_name", "model", "count"),
    [
        ("g5.xlarge", "NVIDIA A10G", 1),
        ("p4d.24xlarge", "NVIDIA A100", 8),
        ("g6e.xlarge", "NVIDIA L40S", 1),
    ],
)
def test_gpu_model_and_count_come_from_describe_instance_types(aws, type_name, model, count):
    info = aws.instance_type(type_name)
    assert info.gpu_model == model
    assert info.gpu_count == count
    assert info.gpu_mem_mib


def test_unknown_type_is_refused(aws):
    with pytest.raises(ProviderError, match="not an EC2 instance type") as caught:
        aws.instance_type("g99.superlarge")
    assert not caught.value.retryable


def test_gpu_types_are_listed(aws):
    names = {t.name for t in aws.instance_types()}
    assert {"g5.xlarge", "p5.48xlarge"} <= names
    assert "t3.micro" not in names


def test_launch_then_stop_keeps_storage_billing(aws, image):
    launched = aws.launch(LaunchRequest("g5.xlarge", count=2, name="train", image=image))
    assert len(launched) == 2
    assert {i.instance_type for i in launched} == {"g5.xlarge"}
    assert all(i.name == "train" for i in launched)
    first = launched[0].provider_id
    outcome = aws.release(first, "stop")
    assert aws.get(first).state == "stopped"
    assert "EBS" in outcome.detail or outcome.confirmed
    assert aws.capabilities.storage_bills_when_stopped


def test_launch_needs_an_image(aws):
    with pytest.raises(ProviderError, match="AMI") as caught:
        aws.launch(LaunchRequest("g5.xlarge"))
    assert not caught.value.retryable


@pytest.mark.parametrize(
    ("status", "code", "error", "retryable"),
    [
        (500, "InternalError", ProviderError, True),
        (503, "Unavailable", ProviderError, True),
        (401, "AuthFailure", ProviderAuthError, False),
        (403, "UnauthorizedOperation", ProviderAuthError, False),
        (503, "RequestLimitExceeded", ProviderRateLimited, True),
        (400, "InvalidInstanceID.NotFound", ProviderNotFound, False),
    ],
)
def test_ec2_errors_are_translated(ec2_error_server, status, code, error, retryable):
    ec2_error_server.answer(status, code)
    aws = AwsProvider.from_settings(Settings(aws_endpoint_url=ec2_error_server.url))
    with pytest.raises(error) as caught:
        aws.get("i-0123456789abcdef0")
    assert type(caught.value) is error
    assert caught.value.retryable is retryable
    assert code in str(caught.value)


def test_release_of_a_gone_instance_through_errors(ec2_error_server):
    ec2_error_server.answer(400, "InvalidInstanceID.NotFound")
    aws = AwsProvider.from_settings(Settings(aws_endpoint_url=ec2_error_server.url))
    outcome = aws.release("i-0123456789abcdef0", "terminate")
    assert outcome.confirmed
    assert outcome.already_gone


def test_unreachable_endpoint_is_retryable(monkeypatch: pytest.MonkeyPatch):
    import socket

    # Credentials present (they are not what this is about): alone, without them, botocore
    # stops before it connects.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    aws = AwsProvider.from_settings(Settings(aws_endpoint_url=f"http://127.0.0.1:{port}"))
    with pytest.raises(ProviderError) as caught:
        aws.list_instances()
    assert caught.value.retryable


@pytest.fixture
def no_credentials(aws_endpoint, monkeypatch, tmp_path):
    """moto's URL with no AWS credentials anywhere boto3 looks (environment, files, metadata)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it keeps what it found before
    return aws_endpoint


def test_missing_credentials_are_named_not_blamed_on_the_type(no_credentials):
    aws = AwsProvider.from_settings(Settings(aws_endpoint_url=no_credentials))
    with pytest.raises(ProviderAuthError) as caught:
        aws.instance_type("g5.xlarge")
    assert caught.value.message.startswith("No AWS credentials")
    assert "not an EC2 instance type" not in caught.value.user_text()
    assert "AWS_ACCESS_KEY_ID" in caught.value.hint
    assert "instance profile" in caught.value.hint
    assert not caught.value.retryable


def test_renting_without_credentials_says_so_through_the_command(no_credentials, sqlite_db):
    from bot.commands import build_registry
    from bot.commands.parser import parse
    from bot.services.access import Caller
    from tests.bot.services.support import Clock, make_runtime

    aws = AwsProvider.from_settings(Settings(aws_endpoint_url=no_credentials))
    rt = make_runtime(sqlite_db, Clock(), providers=[aws])
    spec, args = parse(
        "rent aws g5.xlarge --image ami-0abc1234 --price 1.01/h --release-in 3h",
        build_registry(),
    )
    with pytest.raises(ProviderAuthError, match="No AWS credentials") as caught:
        spec.handler(rt, Caller("UOWNER", channel_id="CTEAM"), args)
    assert "not an EC2 instance type" not in caught.value.user_text()


@pytest.mark.parametrize(
    ("status", "code", "hint"),
    [
        (401, "AuthFailure", "refused the bot's credentials"),
        (403, "UnauthorizedOperation", "grant its IAM user or role"),
    ],
)
def test_refused_credentials_are_not_an_unknown_type(ec2_error_server, status, code, hint):
    ec2_error_server.answer(status, code)
    aws = AwsProvider.from_settings(Settings(aws_endpoint_url=ec2_error_server.url))
    with pytest.raises(ProviderAuthError) as caught:
        aws.instance_type("g5.xlarge")
    assert code in caught.value.message
    assert "not an EC2 instance type" not in caught.value.message
    assert hint in caught.value.hint


def _ami_rooted_at(endpoint: str, device: str) -> str:
    """An AMI of moto's catalogue whose root device is ``device`` (Ubuntu and Windows images
    at /dev/sda1, Amazon Linux ones at /dev/xvda)."""
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    images = ec2.describe_images(Owners=["amazon", "898082745236", "137112412989"])["Images"]
    return next(i["ImageId"] for i in images if i.get("RootDeviceName") == device)


@pytest.mark.parametrize("device", ["/dev/sda1", "/dev/xvda"])
def test_disk_sizes_the_amis_own_root_device_and_leaves_nothing_after_terminate(
    aws, aws_endpoint, device
):
    image = _ami_rooted_at(aws_endpoint, device)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_endpoint)
    before = {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    (launched,) = aws.launch(LaunchRequest("g5.xlarge", image=image, disk_gb=500))
    described = ec2.describe_instances(InstanceIds=[launched.provider_id])
    instance = described["Reservations"][0]["Instances"][0]
    mappings = instance["BlockDeviceMappings"]
    assert [m["DeviceName"] for m in mappings] == [device]
    assert mappings[0]["Ebs"]["DeleteOnTermination"] is True
    (volume,) = ec2.describe_volumes(VolumeIds=[mappings[0]["Ebs"]["VolumeId"]])["Volumes"]
    assert volume["Size"] == 500

    outcome = aws.release(launched.provider_id, "terminate")

    assert outcome.mode == "terminate"
    after = {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    assert after == before, "a volume outlived its instance"


@pytest.mark.parametrize(
    "page",
    [
        b"<html><body><h1>404 page not found</h1></body></html>",
        b"<!doctype html>\n<html lang=en>\n<title>404 Not Found</title>\n<h1>Not Found</h1>\n",
    ],
)
def test_a_proxys_html_page_is_an_unknown_outcome(ec2_error_server, page):
    """A proxy's HTML 404 page is no answer of AWS's: one botocore reads as an error without
    EC2's code, one it cannot parse at all (raised outside its BotoCoreError family); either way
    the outcome is unknown, never "gone", and the call is tried again."""
    proxy = Ec2Proxy(ec2_error_server.url)
    proxy.start()
    try:
        proxy.catch_all(404, page)
        aws = AwsProvider.from_settings(Settings(aws_endpoint_url=proxy.url))
        with pytest.raises(ProviderUnknownOutcome) as caught:
            aws.release("i-0123456789abcdef0", "terminate")
        assert caught.value.retryable
        assert "not AWS's own (HTTP" in str(caught.value)
        assert set(proxy.answered_to("POST")) == {404}
    finally:
        proxy.close()
