"""Vast.ai (REST, Bearer key): instances listed, stopped or destroyed.

Endpoints (relative to ``settings.vast_api_url``): ``GET /api/v1/instances/`` (paged: ``limit``
at most 25, and the ``next_token`` of the previous page until it is empty),
``GET /api/v0/instances/{id}/``, ``PUT /api/v0/instances/{id}/`` with ``{"state": "stopped"}``,
``DELETE /api/v0/instances/{id}/``. Storage keeps billing while an instance is stopped; renting
goes through Vast's offers, so ``launch`` is not offered here (rent there, then register).

States, from Vast's instance documents: ``actual_status`` is the container (``null`` and
``loading`` while it starts, ``running``, ``frozen`` (paused, GPU still charged), ``stopped``
(disk charges only), ``exited`` (the process exited unexpectedly: a crash, not a stop),
``rebooting``, ``unknown``, ``offline``); ``intended_status`` is what the user asked for and
``cur_state`` the machine contract (``running``, ``stopped``, or ``unloaded`` once destroyed).
An ``exited`` container whose contract still runs is ``crashed``: the GPU stays allocated, so
the meter keeps running.

Disk and storage, from Vast's instance documents (show instance): ``disk_space`` is the disk
allocated in GB, ``storage_cost`` its price in $/GB/month (as the search fields say),
``storage_total_cost`` what the whole disk costs per hour (the ``diskHour`` of the instance's
pricing), and ``dph_total`` the total per hour, disk included (the documents' example:
``dph_base`` 1 + ``storage_total_cost`` 0.002074 = ``dph_total`` 1.002074, which is 10 GB at
0.1493 $/GB/month over a 720-hour month). Where both are given the compute price is
``dph_total`` less ``storage_total_cost``, and the disk's price per 730-hour GB-month is
``storage_total_cost`` per GB times 730 h, so the bot's hourly storage is Vast's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from bot.billing import STORAGE_MONTH_S
from bot.errors import ProviderError, ProviderNotFound
from bot.i18n import t
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
from bot.values import MICROS

_ACTUAL = {
    None: "pending",
    "created": "pending",
    "loading": "pending",
    "running": "running",
    "frozen": "running",
    "rebooting": "running",
    "unknown": "running",
    "offline": "running",
    "stopped": "stopped",
    "exited": "crashed",
    "destroyed": "terminated",
    "deleted": "terminated",
}
#: Vast's largest page of the instance list.
PAGE_LIMIT = 25
#: The most pages read for one list (25 000 instances): a platform that keeps answering with a
#: next page is not followed for ever.
MAX_PAGES = 1000


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
        """Every instance of the account, page by page. Raises ProviderError when a page has
        no instance list, or the pages never end (a token seen before, or ``MAX_PAGES``)."""
        found: list[ProviderInstance] = []
        token: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            query = {"limit": str(PAGE_LIMIT)}
            if token:
                query["next_token"] = token
            answer = self.api.get("/api/v1/instances/", query=query)
            items = answer.get("instances") if isinstance(answer, dict) else None
            if not isinstance(items, list):
                raise ProviderError(t("vast: the instance list has no 'instances'"))
            found.extend(_instance(item) for item in items)
            token = _next_token(answer)
            if token is None:
                return found
            if token in seen:
                raise ProviderError(
                    t("vast: the instance list repeats a page token"), retryable=True
                )
            seen.add(token)
        raise ProviderError(
            t("vast: the instance list has more than {MAX_PAGES} pages", MAX_PAGES=MAX_PAGES)
        )

    def get(self, provider_id: str) -> ProviderInstance:
        """One instance; ProviderNotFound when Vast does not know it."""
        answer = self.api.get(f"/api/v0/instances/{quote(provider_id, safe='')}/")
        item = answer.get("instances") if isinstance(answer, dict) else None
        if item is None:
            raise ProviderNotFound(t("vast: no instance {provider_id}", provider_id=provider_id))
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
        raise ProviderError(
            t("vast: {what} refused: {detail}", what=what, detail=detail), retryable=True
        )


def _instance(item: Any) -> ProviderInstance:
    if not isinstance(item, dict) or "id" not in item:
        raise ProviderError(t("vast: an instance without an id in the answer"))
    raw = item.get("actual_status")
    host, port = _ssh_address(item)
    dph = item.get("dph_total")
    label = item.get("label")
    disk_gb, storage_per_hour = _disk(item)
    price = _number(dph)
    if price is not None and storage_per_hour is not None:
        price = max(0.0, price - storage_per_hour)
    storage = None
    if disk_gb is not None and storage_per_hour is not None:
        storage = round(storage_per_hour / disk_gb * STORAGE_MONTH_S / 3600 * MICROS)
    return ProviderInstance(
        provider_id=str(item["id"]),
        state=state_of(item),
        raw_state=str(raw),
        instance_type=item.get("gpu_name"),
        name=label if isinstance(label, str) else None,
        host=host,
        ssh_port=port,
        gpu_model=item.get("gpu_name"),
        gpu_count=item.get("num_gpus") if isinstance(item.get("num_gpus"), int) else None,
        price_micros_per_hour=None if price is None else round(price * MICROS),
        launched_at=_epoch(item.get("start_date")),
        tags=(("label", label),) if isinstance(label, str) and label else (),
        disk_gb=disk_gb,
        storage_micros_per_gb_month=storage,
    )


def _number(value: Any) -> float | None:
    """A JSON number as a float; None for anything else (booleans too)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _disk(item: dict[str, Any]) -> tuple[float | None, float | None]:
    """(``disk_space`` in GB, ``storage_total_cost`` in $/h): each None unless a number, the
    size above 0 and the cost 0 or more; the cost is None without a size."""
    size = _number(item.get("disk_space"))
    if size is None or size <= 0:
        return None, None
    cost = _number(item.get("storage_total_cost"))
    return size, (cost if cost is not None and cost >= 0 else None)


def state_of(item: dict[str, Any]) -> str:
    """The normalised state of one instance document (see the module docstring)."""
    raw = item.get("actual_status")
    contract = item.get("cur_state")
    intended = item.get("intended_status")
    if contract == "unloaded":
        return "terminated"
    state = _ACTUAL.get(raw, "running") if raw is None or isinstance(raw, str) else "running"
    if state == "crashed" and contract == "stopped":
        return "stopped"
    if intended == "stopped" and state in ("pending", "running", "crashed"):
        return "stopping"
    return state


def _next_token(answer: dict[str, Any]) -> str | None:
    token = answer.get("next_token")
    return token if isinstance(token, str) and token else None


def _epoch(value: Any) -> datetime | None:
    """Seconds since the epoch as naive UTC; None for anything else."""
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        return None
    try:
        return datetime.fromtimestamp(float(value), UTC).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError):
        return None


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
