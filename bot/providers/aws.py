"""AWS EC2 through boto3: list, get, terminate or stop, launch; GPU model and count from
``describe_instance_types``. ``settings.aws_endpoint_url`` (GPUBOT_AWS_ENDPOINT_URL) points the
client elsewhere; credentials come from boto3's usual chain (AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the machine's instance profile). Missing, refused or
too narrow credentials are ProviderAuthError saying which (:data:`NO_CREDENTIALS_HINT`).

EC2 bills per second after a one-minute minimum per start, and EBS volumes keep billing while an
instance is stopped. There is no price API here (the Pricing API is a separate service): prices
are given at rent time or registration.

What AWS billed each instance comes from Cost Explorer's ``GetCostAndUsageWithResources``
(botocore's ``ce`` service model, ``ce/2017-10-25/service-2.json``; AWS Cost Explorer API
Reference, "GetCostAndUsageWithResources"): resource-level cost for the last 14 days, only for an
account that opted in to resource-level data in the Cost Explorer preferences. It bills EC2
compute per instance id; EBS volumes are resources of their own, so the storage is not split.
"""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.parsers import ResponseParserError

from bot.billing import ProviderBilling
from bot.errors import (
    ProviderAuthError,
    ProviderError,
    ProviderNotFound,
    ProviderRateLimited,
    ProviderUnknownOutcome,
)
from bot.i18n import N_, t
from bot.providers.base import (
    InstanceTypeInfo,
    LaunchRequest,
    PlatformCharge,
    ProviderCapabilities,
    ProviderInstance,
    ReleaseOutcome,
    check_mode,
)
from bot.providers.http import mask_credentials
from bot.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client

_STATES = {
    "pending": "pending",
    "running": "running",
    "shutting-down": "terminating",
    "terminated": "terminated",
    "stopping": "stopping",
    "stopped": "stopped",
}
_NOT_FOUND = ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed")
_AUTH = ("AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch")
_NOT_ALLOWED = ("UnauthorizedOperation",)
#: Where the bot's AWS credentials come from (boto3's chain).
NO_CREDENTIALS_HINT = (
    "Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the bot's environment, "
    "or give the bot's machine an instance profile; GPUBOT_AWS_REGION picks the region."
)
_REFUSED_HINT = (
    "AWS refused the bot's credentials: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
    "(or AWS_PROFILE) in the bot's environment, and the machine's clock."
)
_NOT_ALLOWED_HINT = (
    "The bot's AWS credentials work but may not do this: grant its IAM user or role the EC2 "
    "permission named above (ec2:DescribeInstances, DescribeInstanceTypes, RunInstances, "
    "StopInstances, TerminateInstances)."
)
_THROTTLED = (
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "LimitExceededException",
)
#: Cost Explorer keeps resource-level data this many days (AWS Cost Explorer API Reference,
#: GetCostAndUsageWithResources: "only available for the last 14 days").
RESOURCE_DATA_DAYS = 14
#: Cost Explorer's one endpoint region, the service EC2 instances bill under, the cost figure
#: read (the same as the invoice before credits), and the most pages read in one call.
COST_EXPLORER_REGION = "us-east-1"
EC2_COMPUTE_SERVICE = "Amazon Elastic Compute Cloud - Compute"
COST_METRIC = "UnblendedCost"
MAX_COST_PAGES = 50
#: Cost Explorer answers when resource-level data is not there yet (retry later), and what it
#: says when the account never opted in to resource-level data (no retry fixes that).
_DATA_UNAVAILABLE = "DataUnavailableException"
_NOT_OPTED_IN_HINT = N_(
    "Turn on resource-level data (EC2 instances, daily granularity) in the AWS Billing and Cost "
    "Management console: Cost Explorer preferences. AWS bills per instance only from then on."
)


class AwsProvider:
    """EC2 instances in one region."""

    name = "aws"
    capabilities = ProviderCapabilities(
        can_stop=True,
        can_start=True,
        storage_bills_when_stopped=True,
        billing=ProviderBilling(
            "second",
            60,
            "created",
            "EC2 On-Demand: per-second billing, 60-second minimum per start",
        ),
        can_launch=True,
        publishes_bills=True,
    )
    #: How far back the bills reach (Cost Explorer's resource-level data), in days.
    bill_history_days = RESOURCE_DATA_DAYS

    def __init__(
        self,
        *,
        region: str,
        endpoint_url: str | None = None,
        client: EC2Client | None = None,
        cost_explorer_url: str | None = None,
    ) -> None:
        self.region = region
        self.endpoint_url = endpoint_url
        self.cost_explorer_url = cost_explorer_url or endpoint_url
        self._client = client
        self._ce: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> AwsProvider:
        """Built from GPUBOT_AWS_REGION and GPUBOT_AWS_ENDPOINT_URL (Cost Explorer too); the
        clients are made on first use, so a bot without AWS credentials starts fine."""
        return cls(region=settings.aws_region, endpoint_url=settings.aws_endpoint_url)

    @property
    def client(self) -> EC2Client:
        """The EC2 client (made once; boto3 clients are thread-safe)."""
        with self._lock:
            if self._client is None:
                self._client = boto3.client(
                    "ec2",
                    region_name=self.region,
                    endpoint_url=self.endpoint_url,
                    config=Config(retries={"max_attempts": 2, "mode": "standard"}),
                )
            return self._client

    def charges(self, start: datetime, end: datetime) -> list[PlatformCharge]:
        """What AWS billed each EC2 instance per day between ``start`` and ``end`` (naive UTC),
        from Cost Explorer ``GetCostAndUsageWithResources`` (DAILY, ``UnblendedCost``, filtered
        to the service ``Amazon Elastic Compute Cloud - Compute``, grouped by ``RESOURCE_ID``,
        paged by ``NextPageToken``; days from ``start``'s to the one ``end`` falls in, ``end``
        excluded when it is midnight). Resource-level data covers the last
        :data:`RESOURCE_DATA_DAYS` days, so ``start`` is moved up to that. Raises
        ProviderError(retryable=False) when the account has not opted in to resource-level data,
        ProviderError(retryable=True) for ``DataUnavailableException``, ProviderRateLimited when
        throttled (``LimitExceededException``)."""
        first = max(start, end - timedelta(days=RESOURCE_DATA_DAYS)).date()
        last = end.date() if end.time() == time() else end.date() + timedelta(days=1)
        if first >= last:
            return []
        request: dict[str, Any] = {
            "TimePeriod": {"Start": first.isoformat(), "End": last.isoformat()},
            "Granularity": "DAILY",
            "Filter": {"Dimensions": {"Key": "SERVICE", "Values": [EC2_COMPUTE_SERVICE]}},
            "Metrics": [COST_METRIC],
            "GroupBy": [{"Type": "DIMENSION", "Key": "RESOURCE_ID"}],
        }
        found: list[PlatformCharge] = []
        for _ in range(MAX_COST_PAGES):
            with _translated("GetCostAndUsageWithResources"):
                answer = self.cost_explorer.get_cost_and_usage_with_resources(**request)
            for period in answer.get("ResultsByTime", []):
                found.extend(_cost_rows(period))
            token = answer.get("NextPageToken")
            if not token:
                return found
            request["NextPageToken"] = token
        raise ProviderError(
            t("aws: Cost Explorer kept paging past {pages} pages", pages=MAX_COST_PAGES),
            retryable=True,
        )

    @property
    def cost_explorer(self) -> Any:
        """The Cost Explorer client (made once). Cost Explorer has one endpoint, in us-east-1."""
        with self._lock:
            if self._ce is None:
                self._ce = boto3.client(
                    "ce",
                    region_name=COST_EXPLORER_REGION,
                    endpoint_url=self.cost_explorer_url,
                    config=Config(retries={"max_attempts": 1, "mode": "standard"}),
                )
            return self._ce

    def list_instances(self) -> list[ProviderInstance]:
        """Every instance in the region (terminated ones while EC2 still lists them)."""
        found: list[ProviderInstance] = []
        with _translated("describe_instances"):
            pages = self.client.get_paginator("describe_instances").paginate()
            for page in pages:
                for reservation in page.get("Reservations", []):
                    found.extend(_instance(dict(i)) for i in reservation.get("Instances", []))
        return found

    def get(self, provider_id: str) -> ProviderInstance:
        """One instance; ProviderNotFound when EC2 does not know it."""
        with _translated("describe_instances"):
            answer = self.client.describe_instances(InstanceIds=[provider_id])
        for reservation in answer.get("Reservations", []):
            for item in reservation.get("Instances", []):
                return _instance(dict(item))
        raise ProviderNotFound(t("aws: no instance {provider_id}", provider_id=provider_id))

    def start(self, provider_id: str) -> ProviderInstance:
        """Start a stopped instance (``StartInstances``); returns it as EC2 describes it then
        (pending, usually, with a new public address once running)."""
        with _translated("start_instances"):
            self.client.start_instances(InstanceIds=[provider_id])
        return self.get(provider_id)

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        """Terminate, or stop (EBS storage keeps billing). Already terminated (or stopped, for
        stop), or unknown to EC2, counts as done."""
        check_mode(self, mode)
        try:
            current = self.get(provider_id)
        except ProviderNotFound:
            return _gone(provider_id, mode)
        if current.is_gone or (mode == "stop" and current.state == "stopped"):
            return ReleaseOutcome(provider_id, mode, confirmed=True, state=current.state)
        items: list[Any]
        try:
            with _translated(f"{mode}_instances"):
                if mode == "stop":
                    stopping = self.client.stop_instances(InstanceIds=[provider_id])
                    items = list(stopping.get("StoppingInstances", []))
                else:
                    terminating = self.client.terminate_instances(InstanceIds=[provider_id])
                    items = list(terminating.get("TerminatingInstances", []))
        except ProviderNotFound:
            return _gone(provider_id, mode)
        raw = next(
            (
                str(item.get("CurrentState", {}).get("Name"))
                for item in items
                if item.get("InstanceId") == provider_id
            ),
            "unknown",
        )
        state = _STATES.get(raw, "terminating" if mode == "terminate" else "stopping")
        done = state == "terminated" or (mode == "stop" and state == "stopped")
        detail = "EBS storage keeps billing while stopped" if mode == "stop" else raw
        return ReleaseOutcome(provider_id, mode, confirmed=done, state=state, detail=detail)

    def price(self, instance_type: str) -> int | None:
        """Not available through EC2's API: None."""
        return None

    def instance_types(self) -> list[InstanceTypeInfo]:
        """Every type with GPUs, with model, count and memory."""
        found: list[InstanceTypeInfo] = []
        with _translated("describe_instance_types"):
            pages = self.client.get_paginator("describe_instance_types").paginate()
            for page in pages:
                for item in page.get("InstanceTypes", []):
                    info = _type_info(dict(item))
                    if info.gpu_count:
                        found.append(info)
        return sorted(found, key=lambda t: t.name)

    def instance_type(self, name: str) -> InstanceTypeInfo:
        """One type's GPU model and count. ProviderError(retryable=False) for an unknown type."""
        try:
            with _translated("describe_instance_types"):
                answer = self.client.describe_instance_types(InstanceTypes=[name])  # type: ignore[list-item]
        except ProviderError as exc:
            if exc.retryable or isinstance(exc, ProviderAuthError):
                raise  # credentials, throttling or the network: not the type's fault
            raise ProviderError(
                t(
                    "aws: {name!r} is not an EC2 instance type ({message})",
                    name=name,
                    message=exc.message,
                ),
                retryable=False,
                hint=t("Use a type such as g5.xlarge, g6e.xlarge or p4d.24xlarge."),
            ) from exc
        items = answer.get("InstanceTypes", [])
        if not items:
            raise ProviderError(
                t("aws: {name!r} is not an EC2 instance type", name=name), retryable=False
            )
        return _type_info(dict(items[0]))

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        """``run_instances`` with the image (AMI) and key pair given; returns them as launched
        (usually pending: the caller waits for running and SSH)."""
        if not request.image:
            raise ProviderError(
                t("aws needs an AMI to launch from."),
                retryable=False,
                hint=t("Add --image ami-... (a Deep Learning AMI has the NVIDIA driver)."),
            )
        args: dict[str, Any] = {
            "ImageId": request.image,
            "InstanceType": request.instance_type,
            "MinCount": request.count,
            "MaxCount": request.count,
        }
        if request.ssh_key_name:
            args["KeyName"] = request.ssh_key_name
        if request.name:
            args["TagSpecifications"] = [
                {"ResourceType": "instance", "Tags": [{"Key": "Name", "Value": request.name}]}
            ]
        if request.disk_gb:
            args["BlockDeviceMappings"] = [self._root_volume(request.image, request.disk_gb)]
        with _translated("run_instances"):
            answer = self.client.run_instances(**args)
        return [_instance(dict(item)) for item in answer.get("Instances", [])]

    def _root_volume(self, image: str, disk_gb: int) -> dict[str, Any]:
        """The mapping that sizes the AMI's own root device (its ``RootDeviceName``:
        ``/dev/xvda`` on Amazon Linux, ``/dev/sda1`` on Ubuntu) to ``disk_gb`` GiB, deleted with
        the instance. A mapping under another device name would add a second, empty volume
        that outlives the instance and bills (EC2 User Guide, "Block device mappings" and
        "Preserve data when an instance is terminated": ``DeleteOnTermination`` defaults to
        false for volumes that are not the AMI's root)."""
        with _translated("describe_images"):
            images = self.client.describe_images(ImageIds=[image]).get("Images", [])
        root = str(images[0].get("RootDeviceName") or "") if images else ""
        if not root:
            raise ProviderError(
                t("aws: the AMI {image} names no root device to size", image=image),
                retryable=False,
                hint=t("Launch from an EBS-backed AMI, or leave out --disk."),
            )
        return {
            "DeviceName": root,
            "Ebs": {"VolumeSize": int(disk_gb), "DeleteOnTermination": True},
        }


class _translated:
    """Turns botocore errors into provider errors."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, ProviderError):
            return
        if isinstance(exc, ClientError):
            raise _client_error(self.what, exc) from exc
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
            raise ProviderAuthError(
                t("No AWS credentials: the bot could not call {what}.", what=self.what),
                hint=NO_CREDENTIALS_HINT,
            ) from exc
        # An answer botocore cannot read (a proxy's HTML page) is no answer of AWS's: the
        # call's outcome is unknown (botocore raises it outside its BotoCoreError family).
        if isinstance(exc, ResponseParserError):
            raise _unknown(self.what, 0, str(exc)) from exc
        if isinstance(exc, BotoCoreError):
            raise ProviderError(
                t("aws: {what} failed: {exc}", what=self.what, exc=exc), retryable=True
            ) from exc


def _client_error(what: str, exc: ClientError) -> ProviderError:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    message = f"aws: {what}: {code}: {error.get('Message', '')}".rstrip(": ")
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if not code and status != 429:
        # An error without AWS's error code (a proxy's page) is not AWS refusing.
        return _unknown(what, status, str(error.get("Message", "")))
    if code in _NOT_FOUND:
        return ProviderNotFound(message)
    if code in _NOT_ALLOWED:
        return ProviderAuthError(message, hint=_NOT_ALLOWED_HINT)
    if code in _AUTH or status in (401, 403):
        return ProviderAuthError(message, hint=_REFUSED_HINT)
    if code in _THROTTLED or status == 429:
        return ProviderRateLimited(message)
    if code == _DATA_UNAVAILABLE:
        return ProviderError(message, retryable=True)
    if _not_opted_in(code, str(error.get("Message", ""))):
        return ProviderError(
            t("aws: this account has not opted in to resource-level cost data"),
            retryable=False,
            hint=t(_NOT_OPTED_IN_HINT),
        )
    return ProviderError(message, retryable=status >= 500 or status == 0)


def _unknown(what: str, status: int, answer: str) -> ProviderUnknownOutcome:
    """An answer that is not AWS's own: the request may or may not have happened."""
    return ProviderUnknownOutcome(
        t(
            "aws: {what} got an answer that is not AWS's own (HTTP {status}): the outcome is "
            "unknown",
            what=what,
            status=status or "?",
        ),
        status=status or None,
        answer=mask_credentials(answer[:200]),
    )


def _not_opted_in(code: str, message: str) -> bool:
    """Cost Explorer's refusal of resource-level data to an account without the opt-in: a
    validation or access error that speaks of resource-level data."""
    words = message.lower()
    return code in ("ValidationException", "AccessDeniedException") and (
        "resource" in words and ("opt" in words or "enable" in words)
    )


def _cost_rows(period: dict[str, Any]) -> list[PlatformCharge]:
    """One ``ResultsByTime`` entry as a charge per EC2 instance (keys that are not ``i-`` ids,
    such as ``NoResourceId``, are left out)."""
    span = period.get("TimePeriod", {})
    start = datetime.fromisoformat(str(span.get("Start")))
    end = datetime.fromisoformat(str(span.get("End")))
    rows: list[PlatformCharge] = []
    for group in period.get("Groups", []):
        keys = group.get("Keys") or [""]
        resource = str(keys[0])
        if not resource.startswith("i-"):
            continue
        metric = group.get("Metrics", {}).get(COST_METRIC, {})
        micros = _micros(metric.get("Amount"))
        rows.append(
            PlatformCharge(
                provider_id=resource,
                start=start,
                end=end,
                compute_micros=micros,
                storage_micros=None,
                total_micros=micros,
                currency=str(metric.get("Unit") or "USD"),
            )
        )
    return rows


def _micros(amount: object) -> int:
    """A Cost Explorer amount (a decimal string) in micro-units, rounded half up."""
    try:
        value = Decimal(str(amount)) * 1_000_000
    except InvalidOperation as exc:
        raise ProviderError(
            t("aws: Cost Explorer sent an amount that is not a number: {amount}", amount=amount),
            retryable=False,
        ) from exc
    return int(value.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def _instance(item: dict[str, Any]) -> ProviderInstance:
    raw = str(item.get("State", {}).get("Name", "pending"))
    tags = tuple(
        (str(t.get("Key")), str(t.get("Value", "")))
        for t in item.get("Tags", [])
        if isinstance(t, dict) and t.get("Key")
    )
    name = next((value for key, value in tags if key == "Name"), None)
    launched = item.get("LaunchTime")
    if isinstance(launched, datetime) and launched.tzinfo is not None:
        launched = launched.astimezone(UTC).replace(tzinfo=None)
    return ProviderInstance(
        provider_id=str(item["InstanceId"]),
        state=_STATES.get(raw, "pending"),
        raw_state=raw,
        instance_type=item.get("InstanceType"),
        name=name,
        host=item.get("PublicIpAddress") or item.get("PrivateIpAddress"),
        ssh_port=22,
        launched_at=launched if isinstance(launched, datetime) else None,
        tags=tags,
        ended_at=_ended_at(item)
        if raw in ("stopping", "stopped", "shutting-down", "terminated")
        else None,
    )


#: ``StateTransitionReason`` of an instance a user stopped or terminated, as EC2 writes it:
#: "User initiated (2026-12-04 10:00:00 GMT)" (EC2 API reference, ``Instance``).
_TRANSITION_AT = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")


def _ended_at(item: dict[str, Any]) -> datetime | None:
    """When EC2 says the instance was stopped or terminated (naive UTC), where it says."""
    reason = item.get("StateTransitionReason")
    match = _TRANSITION_AT.search(reason) if isinstance(reason, str) else None
    if match is None:
        return None
    try:
        return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None


def _type_info(item: dict[str, Any]) -> InstanceTypeInfo:
    gpus = item.get("GpuInfo", {}).get("Gpus", [])
    model = None
    count = None
    mem = None
    if gpus:
        first = gpus[0]
        model = " ".join(p for p in (first.get("Manufacturer"), first.get("Name")) if p)
        count = sum(int(g.get("Count", 0)) for g in gpus)
        mem = first.get("MemoryInfo", {}).get("SizeInMiB")
    return InstanceTypeInfo(
        name=str(item.get("InstanceType")), gpu_model=model, gpu_count=count, gpu_mem_mib=mem
    )


def _gone(provider_id: str, mode: str) -> ReleaseOutcome:
    return ReleaseOutcome(provider_id, mode, confirmed=True, already_gone=True, state="terminated")
