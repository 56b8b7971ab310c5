"""Vast.ai (REST, Bearer key): instances listed, stopped or destroyed.

Endpoints (relative to ``settings.vast_api_url``): ``GET /api/v1/instances/``,
``GET /api/v0/instances/{id}/``, ``PUT /api/v0/instances/{id}/`` with ``{"state": "stopped"}``,
``DELETE /api/v0/instances/{id}/``. Storage keeps billing while an instance is stopped; renting
goes through Vast's offers, so ``launch`` is not offered here (rent there, then register).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from bot.errors import ProviderError, ProviderNotFound
from bot.providers.base import (
    InstanceTypeInfo,
    LaunchRequest,
    ProviderCapabilities,
    ProviderInstance,
    ReleaseOutcome,
    check_mode,
    no_launch,
)
from bot.providers.http import JsonApi
from bot.settings import Settings

_STATES = {
    None: "pending",
    "created": "pending",
    "loading": "pending",
    "running": "running",
    "frozen": "running",
    "rebooting": "running",
    "unknown": "running",
    "offline": "running",
    "exited": "stopped",
    "stopped": "stopped",
    "destroyed": "terminated",
    "deleted": "terminated",
}


class VastProvider:
    """Vast.ai instances."""

    name = "vast"
    capabilities = ProviderCapabilities(
        can_stop=True,
        storage_bills_when_stopped=True,
        billing_increment="second",
        min_charge_s=0,
        can_launch=False,
        reports_instance_price=True,
    )

    def __init__(self, api: JsonApi) -> None:
        self.api = api

    @classmethod
    def from_settings(cls, settings: Settings) -> VastProvider:
        """Built from GPUBOT_VAST_API_URL and GPUBOT_VAST_API_KEY."""
        return cls(JsonApi.bearer("vast", settings.vast_api_url, settings.vast_api_key))

    def list_instances(self) -> list[ProviderInstance]:
        """Every instance of the account."""
        answer = self.api.get("/api/v1/instances/")
        items = answer.get("instances") if isinstance(answer, dict) else None
        if not isinstance(items, list):
            raise ProviderError("vast: the instance list has no 'instances'")
        return [_instance(item) for item in items]

    def get(self, provider_id: str) -> ProviderInstance:
        """One instance; ProviderNotFound when Vast does not know it."""
        answer = self.api.get(f"/api/v0/instances/{quote(provider_id, safe='')}/")
        item = answer.get("instances") if isinstance(answer, dict) else None
        if item is None:
            raise ProviderNotFound(f"vast: no instance {provider_id}")
        return _instance(item)

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        """Stop (PUT state stopped) or destroy (DELETE); done already, or unknown, counts as
        done. Vast answers ``{"success": false}`` with 200 for some refusals: those fail."""
        check_mode(self, mode)
        path = f"/api/v0/instances/{quote(provider_id, safe='')}/"
        try:
            current = self.get(provider_id)
            if current.is_gone or (mode == "stop" and current.state == "stopped"):
                return ReleaseOutcome(provider_id, mode, confirmed=True, state=current.state)
            answer = (
                self.api.put(path, {"state": "stopped"})
                if mode == "stop"
                else self.api.delete(path)
            )
            _check_success(answer, f"{mode} {provider_id}")
            after = self.get(provider_id)
        except ProviderNotFound:
            return ReleaseOutcome(
                provider_id, mode, confirmed=True, already_gone=True, state="terminated"
            )
        done = after.is_gone or (mode == "stop" and after.state == "stopped")
        return ReleaseOutcome(provider_id, mode, confirmed=done, state=after.state)

    def price(self, instance_type: str) -> int | None:
        """Prices belong to offers, not types: None."""
        return None

    def instance_types(self) -> list[InstanceTypeInfo]:
        """None: Vast rents offers of individual machines."""
        return []

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        """Not offered: rent an offer on Vast, then register the instance."""
        raise no_launch(self.name)


def _check_success(answer: Any, what: str) -> None:
    if isinstance(answer, dict) and answer.get("success") is False:
        detail = answer.get("msg") or answer.get("error") or "refused"
        raise ProviderError(f"vast: {what} refused: {detail}", retryable=True)


def _instance(item: Any) -> ProviderInstance:
    if not isinstance(item, dict) or "id" not in item:
        raise ProviderError("vast: an instance without an id in the answer")
    raw = item.get("actual_status")
    state = _STATES.get(raw, "running") if raw is None or isinstance(raw, str) else "running"
    if item.get("intended_status") == "stopped" and state == "running":
        state = "stopping"
    host, port = _ssh_address(item)
    dph = item.get("dph_total")
    return ProviderInstance(
        provider_id=str(item["id"]),
        state=state,
        raw_state=str(raw),
        instance_type=item.get("gpu_name"),
        name=item.get("label"),
        host=host,
        ssh_port=port,
        gpu_model=item.get("gpu_name"),
        gpu_count=item.get("num_gpus") if isinstance(item.get("num_gpus"), int) else None,
        price_micros_per_hour=round(float(dph) * 1_000_000)
        if isinstance(dph, int | float)
        else None,
    )


def _ssh_address(item: dict[str, Any]) -> tuple[str | None, int]:
    """Direct SSH (public IP and the host port mapped to 22) where offered, else Vast's proxy."""
    ports = item.get("ports")
    mapped = ports.get("22/tcp") if isinstance(ports, dict) else None
    if item.get("public_ipaddr") and isinstance(mapped, list) and mapped:
        host_port = mapped[0].get("HostPort") if isinstance(mapped[0], dict) else None
        if host_port is not None and str(host_port).isdigit():
            return str(item["public_ipaddr"]).strip(), int(host_port)
    ssh_port = item.get("ssh_port")
    if item.get("ssh_host") and isinstance(ssh_port, int):
        return str(item["ssh_host"]), ssh_port
    return None, 22
