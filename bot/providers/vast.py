"""Vast.ai (REST, Bearer key): instances listed, stopped or destroyed.

Endpoints (relative to ``settings.vast_api_url``): ``GET /api/v1/instances/`` (paged: ``limit``
at most 25; the answer's ``next_token`` goes back as ``after_token`` until it is empty, as the
official client does: ``vastai/api/instances.py`` ``show_instances``, ``vast.py``
``_fetch_all_instances_v1``), ``GET /api/v0/instances/{id}/`` (``{"instances": null}`` for an
instance Vast does not know or no longer has: the official ``show instance``),
``GET /api/v0/instances/{id}/``, ``PUT /api/v0/instances/{id}/`` with ``{"state": "stopped"}``,
``DELETE /api/v0/instances/{id}/``. Vast limits each endpoint's rate and answers a plain-text
429 without Retry-After: such an answer is waited out (``RATE_LIMIT_WAITS_S``) and the changing
call is followed by a pause before its confirming look (``CONFIRM_PAUSE_S``), never GET,
DELETE, GET back to back. ``GET /api/v0/charges/`` lists the account's charges (the official
``show_invoices_v1`` in ``vastai/api/billing.py``, CLI ``show invoices-v1 --charges``): see
``VastProvider.charges``. A 404 is "gone" only when its JSON is Vast's own ``{"instances":
null}`` (``is_not_found``); a proxy's HTML 404 is an unknown outcome. Storage keeps billing
while an instance is stopped; renting goes through Vast's offers, so ``launch`` is not offered
here (rent there, then register).

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

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import quote

from bot.billing import STORAGE_MONTH_S, ProviderBilling
from bot.errors import ProviderError, ProviderNotFound, ProviderRateLimited
from bot.i18n import t
from bot.providers.base import (
    InstanceTypeInfo,
    LaunchRequest,
    PlatformCharge,
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
#: How long to wait before each retry of a rate-limited call (seconds); then it is given up.
RATE_LIMIT_WAITS_S = (1.0, 2.0, 4.0)
#: The pause between a stop or destroy and the look that confirms it (seconds).
CONFIRM_PAUSE_S = 0.5
#: The most pages read for one list (25 000 instances): a platform that keeps answering with a
#: next page is not followed for ever.
MAX_PAGES = 1000


#: The largest page of the charges list (the official client caps ``limit`` at 100).
CHARGES_PAGE_LIMIT = 100


@dataclass(frozen=True)
class VastCharge:
    """One instance's charge over ``start``..``end`` (naive UTC), in micro-dollars."""

    instance_id: str
    amount_micros: int
    start: datetime | None
    end: datetime | None
    description: str


class VastProvider:
    """Vast.ai instances."""

    name = "vast"
    capabilities = ProviderCapabilities(
        can_stop=True,
        can_start=True,
        storage_bills_when_stopped=True,
        billing=ProviderBilling(
            "second", 0, "created", "Vast.ai: per second; storage while stopped"
        ),
        can_launch=False,
        reports_instance_price=True,
        publishes_bills=True,
    )

    def __init__(self, api: JsonApi, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.api = api
        self.sleep = sleep

    @classmethod
    def from_settings(cls, settings: Settings) -> VastProvider:
        """Built from GPUBOT_VAST_API_URL and GPUBOT_VAST_API_KEY."""
        return cls(
            JsonApi.bearer(
                "vast", settings.vast_api_url, settings.vast_api_key, not_found=is_not_found
            )
        )

    def list_instances(self) -> list[ProviderInstance]:
        """Every instance of the account, page by page. Raises ProviderError when a page has
        no instance list, or the pages never end (a token seen before, or ``MAX_PAGES``)."""
        query = {"limit": str(PAGE_LIMIT)}
        pages = self._pages("/api/v1/instances/", query, "instances")
        return [_instance(item) for answer in pages for item in answer["instances"]]

    def get(self, provider_id: str) -> ProviderInstance:
        """One instance; ProviderNotFound when Vast does not know it."""
        path = f"/api/v0/instances/{quote(provider_id, safe='')}/"
        answer = self._call(lambda: self.api.get(path))
        if not isinstance(answer, dict) or "instances" not in answer:
            raise ProviderError(
                t(
                    "vast: the answer for instance {provider_id} has no 'instances'",
                    provider_id=provider_id,
                )
            )
        item = answer["instances"]
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
            answer = self._call(
                (lambda: self.api.put(path, {"state": "stopped"}))
                if mode == "stop"
                else (lambda: self.api.delete(path))
            )
            _check_success(answer, f"{mode} {provider_id}")
            self.sleep(CONFIRM_PAUSE_S)
            after = self.get(provider_id)
        except ProviderNotFound:
            return ReleaseOutcome(
                provider_id, mode, confirmed=True, already_gone=True, state="terminated"
            )
        done = after.is_gone or (mode == "stop" and after.state == "stopped")
        return ReleaseOutcome(provider_id, mode, confirmed=done, state=after.state)

    def start(self, provider_id: str) -> ProviderInstance:
        """Start a stopped instance (PUT state running, as the official client's
        ``start_instance``); returns it as Vast shows it after the confirming pause."""
        path = f"/api/v0/instances/{quote(provider_id, safe='')}/"
        answer = self._call(lambda: self.api.put(path, {"state": "running"}))
        _check_success(answer, f"start {provider_id}")
        self.sleep(CONFIRM_PAUSE_S)
        return self.get(provider_id)

    def charges(self, start: datetime, end: datetime) -> list[PlatformCharge]:
        """What Vast charged each instance from ``start`` to ``end`` (naive UTC), its charge
        rows added up (:meth:`instance_charges`); Vast's rows do not split the disk from the
        compute, so ``storage_micros`` is None and the whole amount is the total."""
        totals: dict[str, PlatformCharge] = {}
        for row in self.instance_charges(start, end):
            seen = totals.get(row.instance_id)
            row_start, row_end = row.start or start, row.end or end
            total = row.amount_micros + (seen.total_micros if seen else 0)
            totals[row.instance_id] = PlatformCharge(
                provider_id=row.instance_id,
                start=min(row_start, seen.start) if seen else row_start,
                end=max(row_end, seen.end) if seen else row_end,
                compute_micros=total,
                storage_micros=None,
                total_micros=total,
                currency="USD",
            )
        return sorted(totals.values(), key=lambda charge: charge.provider_id)

    def instance_charges(self, start: datetime, end: datetime) -> list[VastCharge]:
        """The account's instance charges for the days from ``start`` to ``end`` (naive UTC).

        ``GET /api/v0/charges/`` as the official client's ``show_invoices_v1``
        (``vastai/api/billing.py``; CLI ``show invoices-v1 --charges``) asks it: each query
        value JSON, ``select_filters`` ``{"day": {"gte", "lte"}, "type": {"in": ["instance"]}}``
        in epoch seconds, ``limit`` at most 100, the answer's ``next_token`` sent back as
        ``after_token``; rows in ``results`` with ``type``, ``source`` (``instance-<id>``),
        ``amount`` in dollars, ``start``/``end`` epoch seconds. Raises ProviderError for an
        answer without ``results`` or pages that never end.

        Vast's ``lte`` takes a row whose day is equal to it (the client's ``--end-date``
        includes that day), so the period's end, exclusive here, is asked as the second
        before it: a period ending at midnight does not take the next day's row."""
        filters = {
            "day": {"gte": _seconds(start), "lte": _seconds(end) - 1},
            "type": {"in": ["instance"]},
        }
        query = {
            "select_filters": json.dumps(filters),
            "latest_first": "false",
            "limit": str(CHARGES_PAGE_LIMIT),
            "format": "table",
        }
        found: list[VastCharge] = []
        for answer in self._pages("/api/v0/charges/", query, "results"):
            found.extend(c for c in map(_charge, answer["results"]) if c is not None)
        return found

    def _pages(self, path: str, query: dict[str, str], key: str) -> list[dict[str, Any]]:
        """Every page of a list paged by ``next_token`` sent back as ``after_token``."""
        pages: list[dict[str, Any]] = []
        seen: set[str] = set()
        token: str | None = None
        for _ in range(MAX_PAGES):
            params = dict(query, after_token=token) if token else query
            answer = self._call(partial(self.api.get, path, query=params))
            if not isinstance(answer, dict) or not isinstance(answer.get(key), list):
                raise ProviderError(t("vast: the answer of {path} has no list", path=path))
            pages.append(answer)
            token = _next_token(answer)
            if token is None:
                return pages
            if token in seen:
                raise ProviderError(
                    t("vast: the list {path} repeats a page token", path=path), retryable=True
                )
            seen.add(token)
        raise ProviderError(
            t(
                "vast: the list {path} has more than {MAX_PAGES} pages",
                path=path,
                MAX_PAGES=MAX_PAGES,
            )
        )

    def _call(self, request: Callable[[], Any]) -> Any:
        """``request()``, waited out and tried again on a 429 that says nothing of when
        (``RATE_LIMIT_WAITS_S``); a 429 that names its wait, or the last one, is raised."""
        for wait_s in RATE_LIMIT_WAITS_S:
            try:
                return request()
            except ProviderRateLimited as exc:
                if exc.retry_after_s is not None:
                    raise
                self.sleep(wait_s)
        return request()

    def price(self, instance_type: str) -> int | None:
        """Prices belong to offers, not types: None."""
        return None

    def instance_types(self) -> list[InstanceTypeInfo]:
        """None: Vast rents offers of individual machines."""
        return []

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        """Not offered: rent an offer on Vast, then register the instance."""
        raise no_launch(self.name)


def is_not_found(document: Any) -> bool:
    """Whether a 404's JSON is Vast's own answer for an instance it does not have:
    ``{"instances": null}``, the document the official client's ``show_instance``
    (``vastai/api/instances.py``) reads as "not found or no longer exists". Any other 404 (a
    proxy's HTML page, an error document) says nothing about the instance."""
    return isinstance(document, dict) and "instances" in document and document["instances"] is None


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


def _charge(row: Any) -> VastCharge | None:
    """One instance charge row; None for any other kind of row (volume, serverless)."""
    if not isinstance(row, dict) or row.get("type") != "instance":
        return None
    source = row.get("source")
    amount = _number(row.get("amount"))
    if not isinstance(source, str) or amount is None:
        raise ProviderError(t("vast: a charge without a source or an amount"))
    description = row.get("description")
    return VastCharge(
        instance_id=source.rpartition("-")[2],
        amount_micros=round(amount * MICROS),
        start=_epoch(row.get("start")),
        end=_epoch(row.get("end")),
        description=description if isinstance(description, str) else "",
    )


def _seconds(moment: datetime) -> int:
    """A naive UTC moment as whole seconds since the epoch."""
    return int(moment.replace(tzinfo=UTC).timestamp())


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
