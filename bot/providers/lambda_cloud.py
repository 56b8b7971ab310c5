"""Lambda Cloud (REST, Bearer key): list, get, terminate, prices and launch.

Endpoints (relative to ``settings.lambda_api_url``): ``GET /instances``, ``GET /instances/{id}``,
``GET /instance-types``, ``POST /instance-operations/launch``,
``POST /instance-operations/terminate``. Lambda cannot stop instances, only terminate them;
it bills per minute. The documented API host is ``https://cloud.lambda.ai/api/v1`` (formerly
``cloud.lambdalabs.com``).

States: Lambda's ``InstanceStatus`` is booting, active, unhealthy (running, billed),
terminating, terminated and preempted (taken back by Lambda: gone, like terminated).
"""

from __future__ import annotations

from typing import Any

from bot.billing import ProviderBilling
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
    "booting": "pending",
    "active": "running",
    "unhealthy": "running",
    "terminating": "terminating",
    "terminated": "terminated",
    "preempted": "terminated",
}
CENTS_TO_MICROS = MICROS // 100


class LambdaProvider:
    """Lambda Cloud's on-demand instances."""

    name = "lambda"
    capabilities = ProviderCapabilities(
        can_stop=False,
        storage_bills_when_stopped=False,
        billing=ProviderBilling(
            "minute", 0, "ssh_ready", "Lambda Cloud: per minute from passing health checks"
        ),
        can_launch=True,
        reports_instance_price=True,
    )

    def __init__(self, api: JsonApi) -> None:
        self.api = api

    @classmethod
    def from_settings(cls, settings: Settings) -> LambdaProvider:
        """Built from GPUBOT_LAMBDA_API_URL and GPUBOT_LAMBDA_API_KEY."""
        return cls(
            JsonApi.bearer(
                "lambda",
                settings.lambda_api_url,
                settings.lambda_api_key,
                not_found=is_not_found_document,
            )
        )

    def list_instances(self) -> list[ProviderInstance]:
        """Every instance the account holds."""
        return [self._instance(item) for item in _data(self.api.get("/instances"), list)]

    def get(self, provider_id: str) -> ProviderInstance:
        """One instance; ProviderNotFound when Lambda does not know it."""
        return self._instance(_data(self.api.get(f"/instances/{_quote(provider_id)}"), dict))

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        """Terminate (the only mode Lambda has); terminated or unknown counts as done."""
        check_mode(self, mode)
        try:
            current = self.get(provider_id)
        except ProviderNotFound:
            return _gone(provider_id, mode)
        if current.is_gone:
            return _gone(provider_id, mode)
        try:
            answer = self.api.post(
                "/instance-operations/terminate", {"instance_ids": [provider_id]}
            )
        except ProviderNotFound:
            return _gone(provider_id, mode)
        terminated = _data(answer, dict).get("terminated_instances", [])
        for item in terminated if isinstance(terminated, list) else []:
            if isinstance(item, dict) and item.get("id") == provider_id:
                state = _STATES.get(str(item.get("status")), "terminating")
                return ReleaseOutcome(
                    provider_id, mode, confirmed=state == "terminated", state=state
                )
        return ReleaseOutcome(provider_id, mode, confirmed=False, state="terminating")

    def price(self, instance_type: str) -> int | None:
        """``price_cents_per_hour`` of a type, in micro-units per hour."""
        for info in self.instance_types():
            if info.name == instance_type:
                return info.price_micros_per_hour
        return None

    def instance_types(self) -> list[InstanceTypeInfo]:
        """The types Lambda offers, with GPU model, count and price."""
        types = _data(self.api.get("/instance-types"), dict)
        found: list[InstanceTypeInfo] = []
        for name, entry in sorted(types.items()):
            spec = entry.get("instance_type", {}) if isinstance(entry, dict) else {}
            specs = spec.get("specs", {}) if isinstance(spec, dict) else {}
            cents = spec.get("price_cents_per_hour")
            found.append(
                InstanceTypeInfo(
                    name=str(spec.get("name") or name),
                    gpu_model=spec.get("gpu_description") or spec.get("description"),
                    gpu_count=_int(specs.get("gpus")),
                    price_micros_per_hour=int(cents) * CENTS_TO_MICROS
                    if isinstance(cents, int | float)
                    else None,
                )
            )
        return found

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        """Launch ``count`` instances of a type in a region, with an SSH key Lambda holds."""
        if not request.region or not request.ssh_key_name:
            raise ProviderError(
                t("Lambda needs a region and the name of an SSH key registered with Lambda."),
                retryable=False,
                hint=t("Add --region us-east-1 --ssh-key NAME."),
            )
        body: dict[str, Any] = {
            "region_name": request.region,
            "instance_type_name": request.instance_type,
            "ssh_key_names": [request.ssh_key_name],
            "quantity": request.count,
        }
        if request.name:
            body["name"] = request.name
        ids = _data(self.api.post("/instance-operations/launch", body), dict).get(
            "instance_ids", []
        )
        if not isinstance(ids, list) or not ids:
            raise ProviderError(t("lambda: the launch answered without instance ids"))
        return [self.get(str(i)) for i in ids]

    def _instance(self, item: Any) -> ProviderInstance:
        if not isinstance(item, dict) or "id" not in item:
            raise ProviderError(t("lambda: an instance without an id in the answer"))
        raw = str(item.get("status") or "unknown")
        itype = item.get("instance_type") or {}
        specs = itype.get("specs", {}) if isinstance(itype, dict) else {}
        cents = itype.get("price_cents_per_hour") if isinstance(itype, dict) else None
        return ProviderInstance(
            provider_id=str(item["id"]),
            state=_STATES.get(raw, "pending"),
            raw_state=raw,
            instance_type=itype.get("name") if isinstance(itype, dict) else None,
            name=item.get("name"),
            host=item.get("ip"),
            ssh_port=22,
            gpu_model=itype.get("gpu_description") if isinstance(itype, dict) else None,
            gpu_count=_int(specs.get("gpus")) if isinstance(specs, dict) else None,
            price_micros_per_hour=int(cents) * CENTS_TO_MICROS
            if isinstance(cents, int | float)
            else None,
        )


#: Lambda's error code for an object it does not know (its API reference's error documents).
NOT_FOUND_CODE = "global/object-does-not-exist"


def is_not_found_document(document: Any) -> bool:
    """True for Lambda's own not-found document, ``{"error": {"code":
    "global/object-does-not-exist", ...}}``; any other 404 proves nothing."""
    error = document.get("error") if isinstance(document, dict) else None
    return isinstance(error, dict) and error.get("code") == NOT_FOUND_CODE


def _data(answer: Any, kind: type) -> Any:
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, kind):
        raise ProviderError(t("lambda: the answer has no 'data' of the expected shape"))
    return data


def _gone(provider_id: str, mode: str) -> ReleaseOutcome:
    return ReleaseOutcome(provider_id, mode, confirmed=True, already_gone=True, state="terminated")


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def _quote(provider_id: str) -> str:
    from urllib.parse import quote

    return quote(provider_id, safe="")
