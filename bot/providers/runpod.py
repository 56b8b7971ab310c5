"""RunPod (REST ``/v1``, Bearer key): pods listed, stopped or terminated, and created.

Endpoints (relative to ``settings.runpod_api_url``): ``GET /pods``, ``GET /pods/{id}``,
``POST /pods``, ``POST /pods/{id}/stop``, ``DELETE /pods/{id}``. A stopped pod keeps billing
for its volume disk; billing is per second.

States: REST v1 documents ``desiredStatus`` RUNNING, EXITED (stopped: the pod is halted, its
volume kept) and TERMINATED; the older GraphQL schema adds CREATED, RESTARTING, PAUSED and
DEAD, and REST v2 PROVISIONING, STARTING and ERROR (an unrecoverable container error). DEAD and
ERROR are ``crashed``: the pod is not stopped on purpose and may still hold its GPU.
``costPerHr`` is documented both as a number and as a string ("0.74"); both are read.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from bot.errors import ProviderError, ProviderNotFound
from bot.i18n import t
from bot.providers.base import (
    InstanceTypeInfo,
    LaunchRequest,
    ProviderCapabilities,
    ProviderInstance,
    ReleaseOutcome,
    check_mode,
)
from bot.providers.http import JsonApi
from bot.settings import Settings
from bot.values import MICROS

_STATES = {
    "RUNNING": "running",
    "CREATED": "pending",
    "PROVISIONING": "pending",
    "STARTING": "pending",
    "RESTARTING": "pending",
    "EXITED": "stopped",
    "STOPPED": "stopped",
    "PAUSED": "stopped",
    "DEAD": "crashed",
    "ERROR": "crashed",
    "TERMINATED": "terminated",
}
DEFAULT_IMAGE = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"


class RunpodProvider:
    """RunPod pods."""

    name = "runpod"
    capabilities = ProviderCapabilities(
        can_stop=True,
        storage_bills_when_stopped=True,
        billing_increment="second",
        min_charge_s=0,
        can_launch=True,
        reports_instance_price=True,
    )

    def __init__(self, api: JsonApi) -> None:
        self.api = api

    @classmethod
    def from_settings(cls, settings: Settings) -> RunpodProvider:
        """Built from GPUBOT_RUNPOD_API_URL and GPUBOT_RUNPOD_API_KEY."""
        return cls(JsonApi.bearer("runpod", settings.runpod_api_url, settings.runpod_api_key))

    def list_instances(self) -> list[ProviderInstance]:
        """Every pod of the account."""
        answer = self.api.get("/pods")
        if not isinstance(answer, list):
            raise ProviderError(t("runpod: GET /pods did not answer with a list"))
        return [_pod(item) for item in answer]

    def get(self, provider_id: str) -> ProviderInstance:
        """One pod; ProviderNotFound when RunPod does not know it."""
        return _pod(self.api.get(f"/pods/{quote(provider_id, safe='')}"))

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        """Stop (``POST /pods/{id}/stop``) or terminate (``DELETE /pods/{id}``); a pod already
        in that state, or unknown, counts as done."""
        check_mode(self, mode)
        path = f"/pods/{quote(provider_id, safe='')}"
        try:
            current = self.get(provider_id)
            if current.is_gone or (mode == "stop" and current.state == "stopped"):
                return ReleaseOutcome(provider_id, mode, confirmed=True, state=current.state)
            if mode == "stop":
                self.api.post(f"{path}/stop")
            else:
                self.api.delete(path)
            after = self.get(provider_id)
        except ProviderNotFound:
            return ReleaseOutcome(
                provider_id, mode, confirmed=True, already_gone=True, state="terminated"
            )
        done = after.is_gone or (mode == "stop" and after.state == "stopped")
        return ReleaseOutcome(provider_id, mode, confirmed=done, state=after.state)

    def price(self, instance_type: str) -> int | None:
        """Not published through this API: RunPod reports ``costPerHr`` per pod instead."""
        return None

    def instance_types(self) -> list[InstanceTypeInfo]:
        """None listed through this API."""
        return []

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        """Create ``count`` pods with the GPU type ``instance_type`` and SSH exposed."""
        pods: list[ProviderInstance] = []
        for index in range(request.count):
            name = request.name or "gpubot"
            body: dict[str, Any] = {
                "name": name if request.count == 1 else f"{name}-{index + 1}",
                "imageName": request.image or DEFAULT_IMAGE,
                "gpuTypeIds": [request.instance_type],
                "gpuCount": 1,
                "ports": ["22/tcp"],
                "supportPublicIp": True,
            }
            if request.disk_gb:
                body["containerDiskInGb"] = request.disk_gb
            pods.append(_pod(self.api.post("/pods", body)))
        return pods


def _pod(item: Any) -> ProviderInstance:
    if not isinstance(item, dict) or "id" not in item:
        raise ProviderError(t("runpod: a pod without an id in the answer"))
    raw = str(item.get("desiredStatus") or "CREATED")
    gpu = item.get("gpu") if isinstance(item.get("gpu"), dict) else {}
    ports = item.get("portMappings") if isinstance(item.get("portMappings"), dict) else {}
    ssh_port = ports.get("22") if ports else None
    name = item.get("name")
    return ProviderInstance(
        provider_id=str(item["id"]),
        state=_STATES.get(raw.upper(), "pending"),
        raw_state=raw,
        instance_type=gpu.get("id") if gpu else None,
        name=name,
        host=item.get("publicIp") or None,
        ssh_port=int(ssh_port)
        if isinstance(ssh_port, int | str) and str(ssh_port).isdigit()
        else 22,
        gpu_model=gpu.get("displayName") if gpu else None,
        gpu_count=gpu.get("count") if gpu and isinstance(gpu.get("count"), int) else None,
        price_micros_per_hour=_micros(item.get("costPerHr")),
        launched_at=_iso(item.get("lastStartedAt")),
        tags=(("name", name),) if isinstance(name, str) and name else (),
    )


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
    """An ISO 8601 time as naive UTC; None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        return at
    return at.astimezone(UTC).replace(tzinfo=None)
