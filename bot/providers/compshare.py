"""优云智算 Compshare (UCloud), through its documented HTTP API: list, stop and terminate.

Every call is a form-encoded POST to ``settings.compshare_api_url`` (``https://api.compshare.cn``)
as the official SDK sends it (``ucloud-sdk-python3``, ``ucloud/core/client/_client.py``
``_build_http_request``) carrying ``Action``, ``PublicKey`` and ``Signature``: the SHA1 hex
digest of every parameter sorted by name, written ``NameValue`` one after another (booleans as
true/false, whole floats without their decimals, lists as ``Name.0``, ``Name.1`` ...), followed
by the private key (UCloud's signature document; ``ucloud/core/auth/_cfg.py`` ``verify_ac``).
``DescribeCompShareInstance`` is sent without ``Region`` ("获取用户所有地域下主机资源信息列表",
the SDK's docstring; ``compshare-cli`` omits it too) and each instance's ``Region`` and ``Zone``
(the region read from ``Zone`` less its ``-NN`` suffix when ``Region`` is absent) are sent with
its Stop, Start and Terminate. Answers carry ``RetCode`` (0: success) and
``Message``; HTTP errors from the gateway become the usual provider errors (bot.providers.http).

Actions: ``DescribeCompShareInstance`` (paged by ``Offset`` and ``Limit``, at most 100, and an
``Offset`` past ``TotalCount`` is an error), ``StopCompShareInstance`` (only a Running instance;
it goes Stopping, then Stopped) and ``TerminateCompShareInstance`` (only a Stopped instance;
``ReleaseUDisk`` true deletes its data disks too). Terminating a running instance therefore
takes two steps: a release call stops it, looks again for Stopped (``STOP_LOOKS`` times at
most, ``STOP_LOOK_S`` seconds apart) and terminates it in the same call once it is, so the
bot's meter stops seconds after the platform's compute bill does; an instance still Stopping
after the looks is reported ``terminating`` and a later call (the release engine looks again)
terminates it. A stop looks again the same way before it reports. One instance takes one
operation at a time (a second one answers ``InstanceOperationInProgress``): a refused stop or
terminate is looked up again, and counts as under way when the instance moved on.

States (``State``): Initializing, Install and Starting are pending; Running, Rebooting and
Resizing running; Stopping; Stopped; ``Install Fail`` crashed (the machine exists, and may
bill); an empty state (the platform timed out asking) counts as running.

Prices are in CNY: ``InstancePrice`` is read as the hourly price of instances billed by the
hour (``ChargeType`` Dynamic "按小时预付费" or Postpay "按小时后付费(支持关机不收费)", the
SDK's ``create_comp_share_instance`` docstring) and left out for Year, Month and Day ones.
Billing while stopped: ``PostPayPowerOffBillingResource`` (a ``DiskPriceInfo`` list: the disks
billed while powered off, each ``IsBoot``, ``ChargeType``, ``Price``) is read for a stopped
instance. The billed disks' sizes (``DiskSet`` ``Size``, GB, matched by ``IsBoot``) become
``disk_gb``, and their prices a price per GB-month: the SDK gives ``Price`` no unit, so it is
read as ``InstancePrice`` is, CNY per hour for the hourly charge types (unverified; a 100 GB
system disk at 0.05 comes to 0.365 CNY per GB-month). ``ReleaseTime`` ("释放时间, 关机时候返回")
is when the platform releases a stopped instance itself.
The billing increment is ``settings.compshare_billing`` (``GPUBOT_COMPSHARE_BILLING``, second
or hour, default hour: no document found states it; the price guide in
``bot/data/prices_cny.json`` says per second; the SDK's ChargeType docstrings say Dynamic and
Postpay are "按小时" and that Postpay "支持关机不收费" in some zones only).

Refusals no retry can fix (``FATAL_CODES``: arrears, missing real-name verification) are
non-retryable ProviderErrors, so a release fails at once and is escalated.

Why not the official SDK itself (``ucloud-sdk-python3``): its typed
``terminate_comp_share_instance`` drops ``ReleaseUDisk``, which the current documents list;
its HTTP errors keep the status but not ``Retry-After``; it logs every answer at INFO level,
instance passwords included, through a handler it adds at import; and it ships no type
information. The signature is a documented dozen lines, and this way Compshare shares the
bot's HTTP client with the other platforms (User-Agent, redirects kept on the API's host,
error translation).
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from bot.billing import ProviderBilling
from bot.errors import ProviderAuthError, ProviderError, ProviderNotFound, ProviderRateLimited
from bot.i18n import N_, t
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

_STATES = {
    "Initializing": "pending",
    "Install": "pending",
    "Starting": "pending",
    "Running": "running",
    "Rebooting": "running",
    "Resizing": "running",
    "Stopping": "stopping",
    "Stopped": "stopped",
    "Install Fail": "crashed",
    "": "running",
}
#: The largest page of DescribeCompShareInstance.
PAGE_LIMIT = 100
#: The most pages read for one list (10 000 instances).
MAX_PAGES = 100
#: Hours in the storage month prices per GB-month are given for (bot.billing.STORAGE_MONTH_S).
STORAGE_MONTH_H = 730
#: Charge types whose ``InstancePrice`` is an hourly price.
HOURLY_CHARGE_TYPES = frozenset({"Dynamic", "Postpay"})
CURRENCY = "CNY"
#: UCloud's common return codes (its API overview), by what they mean for the bot.
_RATE_LIMITED = frozenset({153})
_TRY_AGAIN = frozenset({110, 130, 150})
_AUTH = frozenset({170, 171, 172, 174, 294, 295, 299})
#: Codes above this are the service's own; UCloud's SDK treats those as worth retrying.
_MAX_COMMON_CODE = 2000
#: Service codes no retry can fix, with the reason shown to the owner: Compshare's own answers
#: for an account in arrears (226601) and one without real-name verification (226606), as
#: compshare-cli and the platform report them. Keys, signatures and throttling are UCloud's
#: common codes, handled apart (``_AUTH``, ``_RATE_LIMITED``).
FATAL_CODES: dict[int, str] = {
    226601: N_("the Compshare account is in arrears: top it up in the console"),
    226606: N_("the Compshare account has no real-name verification: complete it in the console"),
}
#: After a Stop: how many looks for Stopped (the first at once) and the real seconds between
#: them, so one release call waits at most (STOP_LOOKS - 1) * STOP_LOOK_S seconds besides its
#: HTTP calls before it leaves the rest to the release engine's next attempt.
STOP_LOOKS = 4
STOP_LOOK_S = 2.0
_ZONE_SUFFIX = re.compile(r"-\d+$")
_SSH_PORT = re.compile(r"(?:^|\s)-p\s*(\d{1,5})(?:\s|$)")


class CompshareApi:
    """Signed calls to the Compshare API: ``call(action, params)`` returns the answer when its
    RetCode is 0 and raises the provider errors otherwise."""

    def __init__(
        self,
        api: JsonApi,
        *,
        public_key: str,
        private_key: str,
        region: str,
        project_id: str | None = None,
    ) -> None:
        self.api = api
        self.public_key = public_key
        self._private_key = private_key
        self.region = region
        self.project_id = project_id

    def __repr__(self) -> str:
        return f"CompshareApi(base_url={self.api.base_url!r}, region={self.region!r})"

    def call(
        self,
        action: str,
        params: Mapping[str, Any] | None = None,
        *,
        region: str | None = None,
    ) -> dict[str, Any]:
        """Send one action, form-encoded (``Region`` only when given). Raises ProviderAuthError
        (bad keys), ProviderRateLimited (RetCode 153), ProviderError (any other refusal;
        ``retryable`` as UCloud's SDK judges it, except ``FATAL_CODES``)."""
        body: dict[str, Any] = {"Action": action}
        if region:
            body["Region"] = region
        if self.project_id:
            body["ProjectId"] = self.project_id
        body.update(flatten(params or {}))
        body["PublicKey"] = self.public_key
        form = {name: encode_value(value) for name, value in body.items()}
        form["Signature"] = signature(form, self._private_key)
        answer = self.api.request("POST", "/", form=form)
        if not isinstance(answer, dict):
            raise ProviderError(
                t("compshare: {action} answered with something that is not JSON", action=action)
            )
        return _checked(action, answer)


def signature(params: Mapping[str, Any], private_key: str) -> str:
    """UCloud's request signature: SHA1 over the sorted ``NameValue`` pairs and the private
    key (``Signature`` itself left out)."""
    text = "".join(
        f"{name}{encode_value(value)}"
        for name, value in sorted(params.items())
        if name != "Signature"
    )
    return hashlib.sha1((text + private_key).encode()).hexdigest()  # noqa: S324 (UCloud's scheme)


def encode_value(value: Any) -> str:
    """A parameter as the signature writes it: true/false, whole floats as integers."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return str(int(value))
    return str(value)


def flatten(params: Mapping[str, Any]) -> dict[str, Any]:
    """Lists as ``Name.0``, ``Name.1`` ... as UCloud's API takes them."""
    flat: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, list | tuple):
            for index, item in enumerate(value):
                flat[f"{name}.{index}"] = item
        elif value is not None:
            flat[name] = value
    return flat


class CompshareProvider:
    """Compshare GPU instances in one region."""

    name = "compshare"
    capabilities = ProviderCapabilities(
        can_stop=True,
        storage_bills_when_stopped=True,
        billing=ProviderBilling(
            "hour",
            0,
            "created",
            "Compshare (UCloud), unverified: the official SDK's (ucloud-sdk-python3, ucompshare) "
            "ChargeType docstrings: Dynamic 按小时预付费, Postpay 按小时后付费 (支持关机不收费, "
            "some zones only); PostPayPowerOffBillingResource lists the disks billed while "
            "powered off. A 2026 price guide says per second; no Compshare page states the "
            "increment, so GPUBOT_COMPSHARE_BILLING (second|hour, default hour) decides: a "
            "registration through the provider stores the setting's increment where it is not "
            "this default. Prices in CNY.",
            verified=False,
        ),
        can_launch=False,
        reports_instance_price=True,
        can_start=True,
    )

    def __init__(
        self,
        api: CompshareApi,
        *,
        billing_increment: str = "hour",
        pause: Callable[[float], None] = time.sleep,
    ) -> None:
        """``pause`` waits between the looks after a Stop (seconds; ``time.sleep``)."""
        self.api = api
        self._pause = pause
        documented = CompshareProvider.capabilities
        self.capabilities = replace(
            documented, billing=replace(documented.billing, increment=billing_increment)
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> CompshareProvider:
        """Built from GPUBOT_COMPSHARE_API_URL, _PUBLIC_KEY, _PRIVATE_KEY, _PROJECT_ID and
        _BILLING (_REGION is only the fallback region of an instance whose zone says none)."""
        return cls(
            CompshareApi(
                JsonApi("compshare", settings.compshare_api_url, headers={}),
                public_key=settings.compshare_public_key or "",
                private_key=settings.compshare_private_key or "",
                region=settings.compshare_region,
                project_id=settings.compshare_project_id,
            ),
            billing_increment=settings.compshare_billing,
        )

    def list_instances(self) -> list[ProviderInstance]:
        """Every instance in every region, page by page (``Limit`` 100, ``Offset`` never past
        ``TotalCount``; the SDK's ``describe_comp_share_instance`` docstring), at most
        ``MAX_PAGES`` pages."""
        found: list[ProviderInstance] = []
        offset = 0
        for _ in range(MAX_PAGES):
            answer = self.api.call(
                "DescribeCompShareInstance", {"Offset": offset, "Limit": PAGE_LIMIT}
            )
            items = _items(answer)
            found.extend(_instance(item) for item in items)
            offset += len(items)
            total = answer.get("TotalCount")
            if not items or not isinstance(total, int) or offset >= total:
                return found
        raise ProviderError(
            t("compshare: the instance list has more than {MAX_PAGES} pages", MAX_PAGES=MAX_PAGES)
        )

    def get(self, provider_id: str) -> ProviderInstance:
        """One instance; ProviderNotFound when Compshare does not list it."""
        return _instance(self._describe(provider_id))

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        """Stop, or terminate with its data disks: a running instance is stopped first, looked
        at until it is Stopped (bounded: ``STOP_LOOKS``) and then terminated; one still
        Stopping is reported ``terminating`` (or, for a stop, ``stopping``) for a later call.
        Already stopped (for stop), or unknown, counts as done."""
        check_mode(self, mode)
        try:
            item = self._describe(provider_id)
        except ProviderNotFound:
            return ReleaseOutcome(
                provider_id, mode, confirmed=True, already_gone=True, state="terminated"
            )
        current = _instance(item)
        if mode == "stop" and current.state == "stopped":
            return ReleaseOutcome(provider_id, mode, confirmed=True, state="stopped")
        try:
            if current.state not in ("stopped", "stopping"):
                self._act("StopCompShareInstance", item)
            if current.state != "stopped":
                item = self._looked_until_stopped(provider_id)
            if mode == "terminate" and _instance(item).state == "stopped":
                self._act("TerminateCompShareInstance", item, ReleaseUDisk=True)
                item = self._describe(provider_id)  # refused, but the instance moved on
            after = _instance(item)
        except ProviderNotFound:
            return ReleaseOutcome(provider_id, mode, confirmed=True, state="terminated")
        except _Terminated as answered:
            return ReleaseOutcome(
                provider_id, mode, confirmed=True, state="terminated", detail=answered.detail
            )
        if mode == "stop":
            done = after.state == "stopped"
            return ReleaseOutcome(provider_id, mode, confirmed=done, state=after.state)
        return ReleaseOutcome(
            provider_id,
            mode,
            confirmed=False,
            state="terminating",
            detail=f"{after.raw_state}: Compshare terminates an instance only once it is stopped",
        )

    def price(self, instance_type: str) -> int | None:
        """Not looked up by type: each instance reports its own price."""
        return None

    def instance_types(self) -> list[InstanceTypeInfo]:
        """None listed here."""
        return []

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        """Not offered: rent on Compshare, then adopt the instance."""
        raise no_launch(self.name)

    def start(self, provider_id: str) -> ProviderInstance:
        """Start a Stopped instance (``StartCompShareInstance``, the SDK's client); returns it
        as Describe lists it afterwards."""
        item = self._describe(provider_id)
        self._act("StartCompShareInstance", item)
        return self.get(provider_id)

    def _describe(self, provider_id: str) -> dict[str, Any]:
        """The instance as a successful Describe of its id lists it; ProviderNotFound only when
        that answer (RetCode 0) lists a set without it."""
        answer = self.api.call("DescribeCompShareInstance", {"UHostIds": [provider_id], "Limit": 1})
        for item in _items(answer):
            if str(item.get("UHostId")) == provider_id:
                return item
        raise ProviderNotFound(t("compshare: no instance {provider_id}", provider_id=provider_id))

    def _looked_until_stopped(self, provider_id: str) -> dict[str, Any]:
        """The instance as Describe lists it once it is no longer Stopping, or after
        ``STOP_LOOKS`` looks, ``STOP_LOOK_S`` seconds apart."""
        item = self._describe(provider_id)
        for _ in range(STOP_LOOKS - 1):
            if _instance(item).state != "stopping":
                return item
            self._pause(STOP_LOOK_S)
            item = self._describe(provider_id)
        return item

    def _act(self, action: str, item: dict[str, Any], **params: Any) -> None:
        """Stop or terminate one instance. A refusal (not of the keys or the rate) is looked up
        again: when the instance is gone or its state moved on, the operation is under way
        (one already running answers InstanceOperationInProgress) and this returns."""
        provider_id = str(item.get("UHostId"))
        body = {"UHostId": provider_id, "Zone": item.get("Zone"), **params}
        try:
            answer = self.api.call(action, body, region=self._region_of(item))
        except (ProviderAuthError, ProviderRateLimited, ProviderNotFound):
            raise
        except ProviderError as exc:
            if isinstance(exc, CompshareAccountError):
                raise
            before = item.get("State")
            if _instance(self._describe(provider_id)).raw_state == str(before or ""):
                raise
            return
        if action == "TerminateCompShareInstance":
            raise _Terminated(f"InRecycle={answer.get('InRecycle')}")

    def _region_of(self, item: dict[str, Any]) -> str:
        """The instance's ``Region``, else its ``Zone`` less the ``-NN`` suffix, else the
        configured region."""
        return _region_of(item) or self.api.region


class _Terminated(Exception):
    """TerminateCompShareInstance answered RetCode 0: the platform's own confirmation."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class CompshareAccountError(ProviderError):
    """A refusal in ``FATAL_CODES``: the account must be fixed in the console; never retried."""

    retryable = False

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message, retryable=False)
        self.code = code


def _region_of(item: dict[str, Any]) -> str | None:
    region = item.get("Region")
    if isinstance(region, str) and region:
        return region
    zone = item.get("Zone")
    if isinstance(zone, str) and _ZONE_SUFFIX.search(zone):
        return _ZONE_SUFFIX.sub("", zone)
    return None


def _checked(action: str, answer: dict[str, Any]) -> dict[str, Any]:
    code = answer.get("RetCode")
    if code == 0:
        return answer
    message = str(answer.get("Message") or "no message")[:300]
    text = f"compshare: {action} refused (RetCode {code}): {message}"
    number = code if isinstance(code, int) else -1
    if number in _AUTH:
        raise ProviderAuthError(
            text,
            hint=t(
                "Check GPUBOT_COMPSHARE_PUBLIC_KEY and "
                "GPUBOT_COMPSHARE_PRIVATE_KEY (the API key pair from the "
                "Compshare console) and the API's IP allow-list."
            ),
        )
    if number in FATAL_CODES:
        raise CompshareAccountError(
            number,
            t(
                "compshare: {action} refused (RetCode {code}): {reason}. Retrying will not help.",
                action=action,
                code=number,
                reason=t(FATAL_CODES[number]),
            ),
        )
    if number in _RATE_LIMITED:
        raise ProviderRateLimited(text)
    if number in _TRY_AGAIN:
        raise ProviderError(text, retryable=True)
    raise ProviderError(text, retryable=number > _MAX_COMMON_CODE)


def _items(answer: dict[str, Any]) -> list[dict[str, Any]]:
    items = answer.get("UHostSet")
    if items is None:
        return []
    if not isinstance(items, list):
        raise ProviderError(t("compshare: the instance list has no 'UHostSet'"))
    return [item for item in items if isinstance(item, dict)]


def _instance(item: dict[str, Any]) -> ProviderInstance:
    provider_id = item.get("UHostId")
    if not provider_id:
        raise ProviderError(t("compshare: an instance without a UHostId in the answer"))
    raw = item.get("State")
    raw_state = raw if isinstance(raw, str) else ""
    gpu_type = item.get("GpuType")
    gpus = item.get("GPU")
    name = item.get("Name")
    return ProviderInstance(
        provider_id=str(provider_id),
        state=_STATES.get(raw_state, "running"),
        raw_state=raw_state,
        instance_type=item.get("MachineType") or None,
        name=name if isinstance(name, str) and name else None,
        host=_public_ip(item.get("IPSet")),
        ssh_port=_ssh_port(item.get("SshLoginCommand")),
        gpu_model=str(gpu_type) if gpu_type else None,
        gpu_count=gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else None,
        price_micros_per_hour=_hourly_price(item),
        currency=CURRENCY,
        launched_at=_epoch(item.get("CreateTime")),
        **(_powered_off_storage(item) if raw_state == "Stopped" else {}),
        tags=tuple(
            (key.lower(), str(item[key]))
            for key in ("Name", "Tag", "Remark")
            if isinstance(item.get(key), str) and item[key]
        ),
    )


def _public_ip(ip_set: Any) -> str | None:
    """The first public IPv4 address of ``IPSet``, else the first address at all."""
    entries = [e for e in ip_set if isinstance(e, dict) and e.get("IP")] if ip_set else []
    for entry in entries:
        if entry.get("Type") != "Private" and entry.get("IPMode", "IPv4") == "IPv4":
            return str(entry["IP"])
    return str(entries[0]["IP"]) if entries else None


def _ssh_port(command: Any) -> int:
    """The port of ``SshLoginCommand`` (``ssh -p 2222 root@...``), else 22."""
    match = _SSH_PORT.search(command) if isinstance(command, str) else None
    port = int(match.group(1)) if match else 22
    return port if 1 <= port <= 65535 else 22


def _hourly_price(item: dict[str, Any]) -> int | None:
    price = item.get("InstancePrice")
    if item.get("ChargeType") not in HOURLY_CHARGE_TYPES or isinstance(price, bool):
        return None
    if not isinstance(price, int | float) or not math.isfinite(price) or price < 0:
        return None
    return round(float(price) * MICROS)


def _powered_off_storage(item: dict[str, Any]) -> dict[str, Any]:
    """What a stopped instance still bills, as ProviderInstance fields: ``disk_gb`` (the sizes
    of the disks ``PostPayPowerOffBillingResource`` lists, matched to ``DiskSet`` by
    ``IsBoot``), ``storage_micros_per_gb_month`` (their hourly ``Price`` sum over 730 hours,
    per GB) and ``platform_release_at`` (``ReleaseTime``); empty when it lists none."""
    billed = [d for d in item.get("PostPayPowerOffBillingResource") or [] if isinstance(d, dict)]
    if not billed:
        return {}
    boot_kinds = {bool(d.get("IsBoot")) for d in billed}
    sizes = [
        d["Size"]
        for d in item.get("DiskSet") or []
        if isinstance(d, dict)
        and _is_boot(d.get("IsBoot")) in boot_kinds
        and isinstance(d.get("Size"), int)
        and not isinstance(d.get("Size"), bool)
        and d["Size"] > 0
    ]
    disk_gb = float(sum(sizes)) if sizes else None
    fields: dict[str, Any] = {
        "disk_gb": disk_gb,
        "platform_release_at": _epoch(item.get("ReleaseTime")),
    }
    hourly = _disk_hourly_micros(billed, item.get("ChargeType"))
    if disk_gb and hourly is not None:
        fields["storage_micros_per_gb_month"] = round(hourly * STORAGE_MONTH_H / disk_gb)
    return fields


def _disk_hourly_micros(billed: list[dict[str, Any]], instance_charge: Any) -> int | None:
    """The billed disks' prices together, in micro-CNY per hour: None when one is missing, not
    a finite non-negative number, or of a charge type that is not hourly."""
    total = 0
    for disk in billed:
        price = disk.get("Price")
        if isinstance(price, bool) or not isinstance(price, int | float):
            return None
        if not math.isfinite(price) or price < 0:
            return None
        if (disk.get("ChargeType") or instance_charge) not in HOURLY_CHARGE_TYPES:
            return None
        total += round(float(price) * MICROS)
    return total


def _is_boot(value: Any) -> bool:
    """``DiskSet``'s ``IsBoot``, a string ("True"/"False") in the SDK's model, as a bool."""
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _epoch(value: Any) -> datetime | None:
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        return None
    try:
        return datetime.fromtimestamp(float(value), UTC).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError):
        return None
