"""The EC2 provider: GPU info from describe_instance_types, launch, stop, and error translation
(moto in server mode; an EC2 error stand-in for the answers moto cannot give)."""

from __future__ import annotations

import boto3
import pytest

from bot.errors import ProviderAuthError, ProviderError, ProviderNotFound, ProviderRateLimited
from bot.providers.aws import AwsProvider
from bot.providers.base import LaunchRequest
from bot.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def aws(aws_endpoint):
    return AwsProvider.from_settings(Settings(aws_endpoint_url=aws_endpoint))


@pytest.fixture
def image(aws_endpoint):
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_endpoint)
    return ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]


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


def test_unreachable_endpoint_is_retryable():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    aws = AwsProvider.from_settings(Settings(aws_endpoint_url=f"http://127.0.0.1:{port}"))
    with pytest.raises(ProviderError) as caught:
        aws.list_instances()
    assert caught.value.retryable
