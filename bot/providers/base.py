"""What the bot needs from a GPU platform: one Protocol, its value types and its errors.

Every provider method raises bot.errors.ProviderError subclasses and nothing else:
ProviderAuthError (401/403), ProviderNotFound (404), ProviderRateLimited (429, with
``retry_after_s``) and ProviderError (5xx and network trouble, ``retryable``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from bot.billing import ProviderBilling
from bot.errors import ProviderError
from bot.i18n import t

#: Normalised instance states, whatever the platform calls them. ``stopped``: compute stopped on
#: purpose, the disk kept (it may still bill); ``crashed``: the workload died on its own (a
#: container that exited) while the machine stays allocated, so the platform may still bill
#: compute; ``terminated``: gone.
PROVIDER_STATES = (
    "pending",
    "running",
    "stopping",
    "stopped",
    "crashed",
    "terminating",
    "terminated",
)
#: States in which the platform no longer bills compute.
COMPUTE_OFF_STATES = frozenset({"stopped", "terminated"})
#: States in which an instance holds compute the account pays for.
COMPUTE_ON_STATES = frozenset({"pending", "running", "stopping", "crashed"})
RELEASE_MODES = ("terminate", "stop")


@dataclass(frozen=True)
class ProviderCapabilities:
    """What a platform can do and how it bills.

    ``billing`` is how the platform bills (increment, minimum per start, from when, and the
    document that says so): the one home of those facts, read by billing for any rule an
    instance's row does not say (bot.providers.registry.platform_billing).
    ``api_release`` is False where releasing needs a person (the manual provider);
    ``can_list`` False where the platform has no API to list instances;
    ``reports_instance_price`` True where each listed instance carries its own price.
    """

    can_stop: bool
    storage_bills_when_stopped: bool
    billing: ProviderBilling
    can_launch: bool
    can_list: bool = True
    api_release: bool = True
    reports_instance_price: bool = False
    #: True where the platform bills the disk by the instance's state (RunPod: the container
    #: disk only while running, the volume at another rate once stopped), so the disk and the
    #: price it reports at each stop and start replace the instance's.
    storage_follows_state: bool = False
    #: True where the bot can start a stopped instance again (the provider is then also a
    #: :class:`Startable`).
    can_start: bool = False
    #: True where the platform publishes what it billed per instance in a form the bot reads
    #: (the provider is then also a :class:`BillSource`).
    publishes_bills: bool = False


@dataclass(frozen=True)
class ProviderInstance:
    """One instance as the platform reports it. ``state`` is one of PROVIDER_STATES and
    ``raw_state`` the platform's own word; ``host`` is the address to reach SSH on.

    ``price_micros_per_hour`` is in ``currency`` (the platform's, ISO 4217), compute only where
    the platform prices the disk apart (``disk_gb`` and ``storage_micros_per_gb_month``, set
    where the platform says them); ``launched_at`` is
    naive UTC where the platform says when it started; ``tags`` are the platform's labels that
    say whose it is (AWS tags, a Vast label, a Compshare business group), as (key, value)."""

    provider_id: str
    state: str
    raw_state: str
    instance_type: str | None = None
    name: str | None = None
    host: str | None = None
    ssh_port: int = 22
    gpu_model: str | None = None
    gpu_count: int | None = None
    price_micros_per_hour: int | None = None
    currency: str = "USD"
    launched_at: datetime | None = None
    tags: tuple[tuple[str, str], ...] = ()
    #: The disk the platform bills storage for, in GB (10^9 bytes), where it says.
    disk_gb: float | None = None
    #: What that disk costs per GB-month of 730 hours in micro-units of ``currency``, where the
    #: platform says (the price it bills now: a stopped instance's where it is stopped).
    storage_micros_per_gb_month: int | None = None
    #: When the platform says it last stopped or was terminated (naive UTC), where it says:
    #: the meter of an instance stopped or terminated outside the bot stops there.
    ended_at: datetime | None = None
    #: When the platform itself will release a stopped instance (naive UTC), where it says.
    platform_release_at: datetime | None = None

    @property
    def is_gone(self) -> bool:
        """True when the platform says the instance is terminated."""
        return self.state == "terminated"

    @property
    def bills_compute(self) -> bool:
        """True while the platform holds compute for it (pending, running, stopping, crashed)."""
        return self.state in COMPUTE_ON_STATES


@dataclass(frozen=True)
class InstanceTypeInfo:
    """A rentable type: GPU model and count, price in micro-units per hour where published."""

    name: str
    gpu_model: str | None
    gpu_count: int | None
    gpu_mem_mib: int | None = None
    price_micros_per_hour: int | None = None


@dataclass(frozen=True)
class ReleaseOutcome:
    """What a release call achieved. ``confirmed`` only when the platform reports the instance
    stopped or terminated (or gone); otherwise the caller checks again later."""

    provider_id: str
    mode: str
    confirmed: bool
    already_gone: bool = False
    state: str = "terminating"
    detail: str = ""


@dataclass(frozen=True)
class LaunchRequest:
    """What to rent: ``instance_type`` in the platform's naming, ``count`` instances.

    ``ssh_key_name`` names a key already registered with the platform (where it has one),
    ``region`` and ``image`` are the platform's own identifiers; None means its default.
    """

    instance_type: str
    count: int = 1
    name: str | None = None
    ssh_key_name: str | None = None
    region: str | None = None
    image: str | None = None
    disk_gb: int | None = None
    extra: tuple[tuple[str, str], ...] = field(default_factory=tuple)


class Provider(Protocol):
    """A GPU platform. ``release`` is idempotent: releasing what is already gone succeeds."""

    name: str
    capabilities: ProviderCapabilities

    def list_instances(self) -> list[ProviderInstance]:
        """Every instance the account holds (recently terminated ones may be included)."""
        ...

    def get(self, provider_id: str) -> ProviderInstance:
        """One instance. Raises ProviderNotFound when the platform does not know it."""
        ...

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        """Terminate (or stop, where ``capabilities.can_stop``) an instance."""
        ...

    def price(self, instance_type: str) -> int | None:
        """The published price of a type in micro-units per hour, or None when not published."""
        ...

    def instance_types(self) -> list[InstanceTypeInfo]:
        """The rentable types the platform lists (empty where it lists none)."""
        ...

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        """Rent instances; raises ProviderError(retryable=False) where ``can_launch`` is False."""
        ...


@dataclass(frozen=True)
class PlatformCharge:
    """What a platform billed one instance over [``start``, ``end``) (naive UTC), in micro-units
    of ``currency``: compute and storage apart where the platform splits them
    (``storage_micros`` None where it does not), and the total it billed."""

    provider_id: str
    start: datetime
    end: datetime
    compute_micros: int
    storage_micros: int | None
    total_micros: int
    currency: str = "USD"


class Startable(Protocol):
    """A platform that starts a stopped instance again (``capabilities.can_start``)."""

    def start(self, provider_id: str) -> ProviderInstance:
        """Ask the platform to start the stopped instance; returns it as the platform reports
        it afterwards (starting or running). Raises ProviderNotFound, ProviderError
        subclasses (an unknown outcome where the platform's answer was not its own)."""
        ...


class BillSource(Protocol):
    """A platform that publishes per-instance bills (``capabilities.publishes_bills``)."""

    def charges(self, start: datetime, end: datetime) -> list[PlatformCharge]:
        """What the platform billed each instance between ``start`` and ``end`` (naive UTC), as
        the platform cuts it (hours or days). Raises ProviderError subclasses."""
        ...


def check_mode(provider: Provider, mode: str) -> None:
    """Raise ProviderError(retryable=False) when ``mode`` is not one the provider supports."""
    if mode not in RELEASE_MODES:
        raise ProviderError(
            t("Unknown release mode {mode!r}.", mode=mode),
            retryable=False,
            hint=t("Use terminate or stop."),
        )
    if mode == "stop" and not provider.capabilities.can_stop:
        raise ProviderError(
            t("{name} cannot stop instances, only terminate them.", name=provider.name),
            retryable=False,
            hint=t("Release with mode terminate."),
        )


def no_launch(provider_name: str) -> ProviderError:
    """The error for a provider that cannot rent instances through an API."""
    return ProviderError(
        t("{provider_name} cannot rent instances through an API.", provider_name=provider_name),
        retryable=False,
        hint=t("Rent on the platform, then adopt the instance with /gpu register."),
    )
