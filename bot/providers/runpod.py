"""RunPod (REST v2, Bearer key): pods listed, created, stopped, started or terminated; the GPU
catalogue; the pod billing history.

Sources: RunPod's v2 OpenAPI document (``api-reference-v2/openapi.json`` in the runpod/docs
repository, server ``https://api.runpod.io``) and ``api-reference-v2/migrate-from-v1.mdx``,
which retires REST v1 (``rest.runpod.io/v1``) on 15 November 2026. Endpoints, relative to
``settings.runpod_api_url`` (``https://api.runpod.io/v2``):

- ``GET /pods``: ``{"pods": [Pod, ...]}`` (``ListPodsResponse``; no paging in v2);
- ``GET /pods/{id}``: a ``Pod``; ``POST /pods``: ``CreatePodRequest`` → 201 and the ``Pod``;
- ``POST /pods/{id}/action`` with ``{"action": "stop" | "start"}`` (``PodActionRequest``):
  200 and the updated pod; 409 for an action the pod's status does not allow (its ``actions``
  list says which do); ``DELETE /pods/{id}``: 204, the pod permanently deleted;
- ``GET /catalog/gpus?include=AVAILABILITY&product=POD``: ``{"gpus": [GpuType, ...]}``, list
  prices per GPU and hour (``price.secure``, ``price.community``);
- ``GET /billing/pods?startTime&endTime&bucketSize``: ``{"records": [PodBillingRecord, ...]}``
  with ``podId``, ``startTime``/``endTime`` and ``gpuAmount``, ``cpuAmount``, ``diskAmount``,
  ``totalAmount`` in USD.

States (``PodStatus``): PROVISIONING and STARTING are ``pending``, RUNNING ``running``, EXITED
``stopped`` (compute released, disk kept), ERROR ``crashed`` (an unrecoverable container error
on a pod that keeps its machine), TERMINATED ``terminated``. A pod's ``cost`` is its price in USD
per hour (0.0 when EXITED or TERMINATED).

Errors are RFC 9457 problem documents (``ErrorResponse``: ``title``, ``status``, ``detail``) as
``application/problem+json``; a 404 is "gone" only when it is such a document with status 404
(:func:`is_not_found_document`). 429s carry ``Retry-After`` and the ``RateLimit`` headers.

Storage, from ``accounts-billing/billing.mdx`` ("Storage pricing summary"), billed per second:
the container disk (``disk``) $0.10 per GB-month while the pod runs and nothing once it is
stopped; the volume (``mounts.persistent.size``) $0.10 per GB-month running and $0.20 stopped.
A pod reports the disk it bills now and at what price (:func:`storage_now`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from bot.billing import ProviderBilling
from bot.errors import ProviderError, ProviderNotFound
from bot.i18n import t
from bot.providers.base import (
    InstanceTypeInfo,
    LaunchRequest,
    PlatformCharge,
    ProviderCapabilities,
    ProviderInstance,
    ReleaseOutcome,
    check_mode,
)
from bot.providers.http import JsonApi
from bot.settings import Settings
from bot.values import MICROS

_STATES = {
    "PROVISIONING": "pending",
    "STARTING": "pending",
    "RUNNING": "running",
    "EXITED": "stopped",
    "ERROR": "crashed",
    "TERMINATED": "terminated",
}
DEFAULT_IMAGE = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"
#: Where a persistent volume is mounted when a launch asks for one.
VOLUME_PATH = "/workspace"
#: The smallest persistent volume RunPod makes (``PersistentMount.size`` minimum).
MIN_VOLUME_GB = 10
#: Storage prices in USD micro-units per GB-month (billing.mdx, "Storage pricing summary").
CONTAINER_DISK_RUNNING_MICROS = 100_000
VOLUME_RUNNING_MICROS = 100_000
VOLUME_STOPPED_MICROS = 200_000
#: The most billing records read for one period (a day's buckets for thousands of pods).
MAX_BILLING_RECORDS = 200_000


@dataclass(frozen=True)
class PodBill:
    """One billing bucket of one pod, from ``GET /billing/pods``: [``start``, ``end``) naive
    UTC, amounts in USD micro-units (compute is ``gpuAmount`` + ``cpuAmount``)."""

    pod_id: str
    start: datetime
    end: datetime
    compute_micros: int
    disk_micros: int
    total_micros: int


class RunpodProvider:
    """RunPod pods, through REST v2."""

    name = "runpod"
    capabilities = ProviderCapabilities(
        can_stop=True,
        can_start=True,
        storage_bills_when_stopped=True,
        billing=ProviderBilling("second", 0, "created", "RunPod: compute and storage per second"),
        can_launch=True,
        reports_instance_price=True,
        publishes_bills=True,
        storage_follows_state=True,
    )

    def __init__(self, api: JsonApi) -> None:
        self.api = api

    @classmethod
    def from_settings(cls, settings: Settings) -> RunpodProvider:
        """Built from GPUBOT_RUNPOD_API_URL and GPUBOT_RUNPOD_API_KEY."""
        return cls(
            JsonApi.bearer(
                "runpod",
                settings.runpod_api_url,
                settings.runpod_api_key,
                not_found=is_not_found_document,
            )
        )

    def list_instances(self) -> list[ProviderInstance]:
        """Every pod of the account (``{"pods": [...]}``)."""
        answer = self.api.get("/pods")
        pods = answer.get("pods") if isinstance(answer, dict) else None
        if not isinstance(pods, list):
            raise ProviderError(t("runpod: GET /pods did not answer with a pod list"))
        return [_pod(item) for item in pods]

    def get(self, provider_id: str) -> ProviderInstance:
        """One pod; ProviderNotFound only on RunPod's own not-found problem document."""
        return _pod(self.api.get(_path(provider_id)))

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        """Stop (the ``stop`` action) or terminate (``DELETE /pods/{id}``). A pod already in that
        state counts as done; one RunPod itself says it does not know counts as gone."""
        check_mode(self, mode)
        try:
            current = self.get(provider_id)
            if current.is_gone or (mode == "stop" and current.state == "stopped"):
                return ReleaseOutcome(provider_id, mode, confirmed=True, state=current.state)
            if mode == "stop":
                self.api.post(f"{_path(provider_id)}/action", {"action": "stop"})
            else:
                self.api.delete(_path(provider_id))
        except ProviderNotFound:
            return ReleaseOutcome(
                provider_id, mode, confirmed=True, already_gone=True, state="terminated"
            )
        try:
            after = self.get(provider_id)
        except ProviderNotFound:  # deleted by this call: RunPod no longer knows it
            return ReleaseOutcome(provider_id, mode, confirmed=True, state="terminated")
        done = after.is_gone or (mode == "stop" and after.state == "stopped")
        return ReleaseOutcome(provider_id, mode, confirmed=done, state=after.state)

    def start(self, provider_id: str) -> ProviderInstance:
        """Start a stopped pod again (the ``start`` action); returns the pod as RunPod says."""
        return _pod(self.api.post(f"{_path(provider_id)}/action", {"action": "start"}))

    def price(self, instance_type: str) -> int | None:
        """The catalogue's secure-cloud list price of one GPU of ``instance_type`` (a GPU type
        id such as ``NVIDIA GeForce RTX 4090``) per hour; None where it lists none."""
        for info in self.instance_types():
            if info.name == instance_type:
                return info.price_micros_per_hour
        return None

    def instance_types(self) -> list[InstanceTypeInfo]:
        """The GPU types of the catalogue (``GET /catalog/gpus``), one GPU each."""
        answer = self.api.get("/catalog/gpus", query={"include": "AVAILABILITY", "product": "POD"})
        gpus = answer.get("gpus") if isinstance(answer, dict) else None
        if not isinstance(gpus, list):
            raise ProviderError(t("runpod: the GPU catalogue has no 'gpus' list"))
        return [_gpu_type(item) for item in gpus if isinstance(item, dict) and item.get("id")]

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        """Create ``count`` pods of the GPU type ``instance_type`` with SSH published. The
        container disk is ``disk_gb`` (RunPod's default otherwise); no volume is made unless
        ``extra`` names ``volume_gb`` (RunPod bills a volume even while the pod is stopped)."""
        pods: list[ProviderInstance] = []
        extra = dict(request.extra)
        volume_gb = _whole(extra.get("volume_gb"))
        for index in range(request.count):
            name = request.name or "gpubot"
            body: dict[str, Any] = {
                "name": name if request.count == 1 else f"{name}-{index + 1}",
                "image": request.image or DEFAULT_IMAGE,
                "gpu": {"id": request.instance_type, "count": 1},
                "ports": ["22/tcp"],
                "startSsh": True,
            }
            if request.disk_gb:
                body["disk"] = int(request.disk_gb)
            if volume_gb:
                body["mounts"] = {
                    "persistent": {"size": max(volume_gb, MIN_VOLUME_GB), "path": VOLUME_PATH}
                }
            if request.region:
                body["dataCenterIds"] = [request.region]
            pods.append(_pod(self.api.post("/pods", body)))
        return pods

    def pod_bills(self, start: datetime, end: datetime) -> list[PodBill]:
        """The billing history of every pod between ``start`` and ``end`` (naive UTC), in day
        buckets (RunPod snaps the window to them). Raises ProviderError on a malformed answer."""
        query = {
            "startTime": _rfc3339(start),
            "endTime": _rfc3339(end),
            "bucketSize": "day",
        }
        answer = self.api.get("/billing/pods", query=query)
        records = answer.get("records") if isinstance(answer, dict) else None
        if not isinstance(records, list):
            raise ProviderError(t("runpod: the pod billing history has no 'records' list"))
        return [_bill(item) for item in records[:MAX_BILLING_RECORDS]]

    def charges(self, start: datetime, end: datetime) -> list[PlatformCharge]:
        """What RunPod billed each pod between ``start`` and ``end``: its buckets added up,
        compute and disk apart."""
        totals: dict[str, PlatformCharge] = {}
        for bill in self.pod_bills(start, end):
            seen = totals.get(bill.pod_id)
            totals[bill.pod_id] = PlatformCharge(
                provider_id=bill.pod_id,
                start=min(bill.start, seen.start) if seen else bill.start,
                end=max(bill.end, seen.end) if seen else bill.end,
                compute_micros=bill.compute_micros + (seen.compute_micros if seen else 0),
                storage_micros=bill.disk_micros + ((seen.storage_micros or 0) if seen else 0),
                total_micros=bill.total_micros + (seen.total_micros if seen else 0),
                currency="USD",
            )
        return sorted(totals.values(), key=lambda charge: charge.provider_id)


def is_not_found_document(document: Any) -> bool:
    """True for RunPod's own not-found answer: an RFC 9457 problem document (``ErrorResponse``)
    with ``status`` 404 and its ``title``. Any other 404 proves nothing."""
    return (
        isinstance(document, dict)
        and document.get("status") == 404
        and isinstance(document.get("title"), str)
        and "detail" in document
    )


def storage_now(
    state: str, container_gb: float | None, volume_gb: float | None
) -> tuple[float | None, int | None]:
    """(GB billed now, USD micro-units per GB-month) for a pod in ``state``: container disk and
    volume at the running rate while it holds compute, the volume alone at the stopped rate once
    stopped, nothing once terminated. Both rates are $0.10 running, so one price serves."""
    container = container_gb or 0.0
    volume = volume_gb or 0.0
    if state == "terminated":
        return None, None
    if state == "stopped":
        return (volume, VOLUME_STOPPED_MICROS) if volume else (None, None)
    total = container + volume
    if not total:
        return None, None
    return total, CONTAINER_DISK_RUNNING_MICROS


def _path(provider_id: str) -> str:
    return f"/pods/{quote(provider_id, safe='')}"


def _pod(item: Any) -> ProviderInstance:
    if not isinstance(item, dict) or "id" not in item:
        raise ProviderError(t("runpod: a pod without an id in the answer"))
    raw = str(item.get("status") or "")
    if raw.upper() not in _STATES:
        raise ProviderError(
            t(
                "runpod: pod {id} has a status the bot does not know: {status}",
                id=item["id"],
                status=raw[:40] or "none",
            )
        )
    state = _STATES[raw.upper()]
    gpu: dict[str, Any] = item["gpu"] if isinstance(item.get("gpu"), dict) else {}
    host, port = _ssh(item)
    name = item.get("name")
    container_gb = _number(item.get("disk"))
    volume_gb = _volume_gb(item.get("mounts"))
    disk_gb, storage = storage_now(state, container_gb, volume_gb)
    count = gpu.get("count") if isinstance(gpu.get("count"), int) else (1 if gpu else None)
    return ProviderInstance(
        provider_id=str(item["id"]),
        state=state,
        raw_state=raw,
        instance_type=gpu.get("id") if gpu else None,
        name=name if isinstance(name, str) else None,
        host=host,
        ssh_port=port,
        gpu_model=gpu.get("id") if gpu else None,
        gpu_count=count,
        price_micros_per_hour=_micros(item.get("cost")) if state != "stopped" else None,
        launched_at=_iso(item.get("createdAt")),
        tags=(("name", name),) if isinstance(name, str) and name else (),
        disk_gb=disk_gb,
        storage_micros_per_gb_month=storage,
    )


def _ssh(item: dict[str, Any]) -> tuple[str | None, int]:
    """The direct SSH endpoint (``ssh.direct``: the public IP and the port published for
    ``22/tcp``), else the ``runtime.ports`` entry for private port 22; (None, 22) while the pod
    has none (provisioning or stopped). RunPod's proxy carries no SFTP, so it is not used."""
    ssh: dict[str, Any] = item["ssh"] if isinstance(item.get("ssh"), dict) else {}
    direct = ssh.get("direct")
    if isinstance(direct, dict) and direct.get("host") and isinstance(direct.get("port"), int):
        return str(direct["host"]), int(direct["port"])
    runtime: dict[str, Any] = item["runtime"] if isinstance(item.get("runtime"), dict) else {}
    for port in runtime.get("ports") or []:
        if not isinstance(port, dict) or port.get("private") != 22:
            continue
        if port.get("ip") and isinstance(port.get("public"), int):
            return str(port["ip"]), int(port["public"])
    return None, 22


def _volume_gb(mounts: Any) -> float | None:
    persistent = mounts.get("persistent") if isinstance(mounts, dict) else None
    return _number(persistent.get("size")) if isinstance(persistent, dict) else None


def _gpu_type(item: dict[str, Any]) -> InstanceTypeInfo:
    price: dict[str, Any] = item["price"] if isinstance(item.get("price"), dict) else {}
    memory = item.get("memory")
    return InstanceTypeInfo(
        name=str(item["id"]),
        gpu_model=str(item.get("name") or item["id"]),
        gpu_count=1,
        gpu_mem_mib=int(memory) * 1024 if isinstance(memory, int) else None,
        price_micros_per_hour=_micros(price.get("secure")),
    )


def _bill(item: Any) -> PodBill:
    if not isinstance(item, dict) or not isinstance(item.get("podId"), str):
        raise ProviderError(t("runpod: a billing record without a podId"))
    start, end = _iso(item.get("startTime")), _iso(item.get("endTime"))
    if start is None or end is None:
        raise ProviderError(t("runpod: a billing record without its time range"))
    compute = (_micros(item.get("gpuAmount")) or 0) + (_micros(item.get("cpuAmount")) or 0)
    return PodBill(
        pod_id=item["podId"],
        start=start,
        end=end,
        compute_micros=compute,
        disk_micros=_micros(item.get("diskAmount")) or 0,
        total_micros=_micros(item.get("totalAmount")) or 0,
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _whole(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and int(value) > 0 else None


def _micros(value: Any) -> int | None:
    """Dollars (a number, or a number as text) as micro-units; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return round(float(value) * MICROS)


def _iso(value: Any) -> datetime | None:
    """An RFC 3339 time as naive UTC; None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        return at
    return at.astimezone(UTC).replace(tzinfo=None)


def _rfc3339(at: datetime) -> str:
    return at.replace(tzinfo=None).isoformat(timespec="seconds") + "Z"
