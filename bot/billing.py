"""Billing rules: what an instance costs between two moments. Pure functions, integer math only.

Money is integer micro-units of the configured currency (1 unit = 1_000_000 micros). Every
amount is rounded UP to the next whole micro-unit, once per quantity: a session's compute cost is
``ceil(billed_s * hourly_micros / 3600)``. The ledger charges hourly buckets as differences of
such cumulative totals, so its buckets add up exactly to the session's cost.

Rules:

- **Increment** (``second``, ``minute``, ``hour``): a billing session's length is rounded UP to a
  whole number of increments, once per session (``1h10m`` on an hourly platform is billed as 2h).
- **Minimum charge**: a session shorter than ``min_charge_s`` is billed as ``min_charge_s``.
- **Billing from** ``created`` (the rental's creation) or ``ssh_ready`` (the first moment the
  instance answered over SSH, as Lambda bills from passing health checks).
- **Billing session**: from the billing start until compute stops (``stopped_at``) or the
  instance is released (``released_at``), whichever is first.
- **Storage** bills per second from creation until the disk is deleted: ``storage_deleted_at``,
  or the release when the release terminated the instance. A stop keeps the disk, so a stopped
  instance keeps billing storage. A GB-month is 730 hours (8760 h / 12), the month AWS uses for
  monthly figures (EBS usage is reported in GB-hours and divided by 730 h; the AWS Pricing
  Calculator's month); so a month's storage costs the same whichever month it is.
- **A stop and a restart**: a stopped instance (``stopped_at`` set, not released) bills its disk
  only; when it runs again the session before it is closed (its increment and minimum applied)
  and a new billing session begins at the restart (``compute_session_at``, see
  :func:`restart`). Each start is a session of its own, as the platforms bill it (AWS's
  60-second minimum per start, an hourly platform's hour rounded up per start), and the time it
  stood stopped costs no compute and counts in no billed seconds. ``compute_closed_s`` and
  ``compute_closed_used_s`` hold the billed and the used seconds of the closed sessions.
- **A change of rules mid-session** (a re-registration with a new price, say) applies from that
  moment only: the seconds billed so far and what they cost under the old rules are carried
  (``compute_carried_s``/``_micros``, ``storage_carried_s``/``_micros``, see :func:`carry`), and
  the rest of the session, including its final rounding, is billed under the new rules.
- **Egress** is priced per GB (10^9 bytes) transferred, where a platform charges for it
  (:func:`egress_cost`). Nothing measures an instance's traffic, so the ledger records no egress
  charges and the spend report and digest say that egress is not metered.

Platform rules: a rule the instance's row does not say (NULL) is its platform's, a
:class:`ProviderBilling` that the platform's provider module declares (its capabilities'
``billing``; ``bot.providers.registry.platform_billing`` finds it by name) and that callers pass
to every function here that needs it. AWS EC2 bills per second with a 60-second minimum per
start; Lambda per minute from passing health checks; RunPod and Vast.ai per second; Compshare by
the hour (unverified: a setting decides); ``manual`` instances bill exactly as typed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from bot.errors import UsageError
from bot.i18n import N_, t
from bot.values import MICROS

SECONDS_PER_HOUR = 3600
#: Micros a carried stretch may differ from the current price by and still count as the same
#: price (each session's cost is rounded up to a micro; a hundredth of a cent shows nowhere).
PRICE_SLACK_MICROS = 100
#: A storage month: 730 hours (365 days * 24 h / 12).
STORAGE_MONTH_S = 730 * SECONDS_PER_HOUR
#: Decimal megabytes per gigabyte: disk sizes are kept in whole MB for integer math.
MB_PER_GB = 1000
BYTES_PER_GB = 1_000_000_000

INCREMENT_S: dict[str, int] = {"second": 1, "minute": 60, "hour": 3600}
PRICE_PER = ("instance_hour", "gpu_hour")
BILLING_FROM = ("created", "ssh_ready")


@dataclass(frozen=True)
class ProviderBilling:
    """A platform's documented billing: ``increment`` (second, minute or hour), the minimum
    charge per start in seconds, when billing starts (``created`` or ``ssh_ready``) and the
    document that says so. ``verified`` is False where no document of the platform states the
    rule and a setting decides it (said wherever a cost is quoted).

    Raises UsageError when a rule has a value no platform uses."""

    increment: str
    min_charge_s: int
    billing_from: str
    source: str
    verified: bool = True

    def __post_init__(self) -> None:
        BillingRules(
            price_micros_per_hour=0,
            increment=self.increment,
            min_charge_s=self.min_charge_s,
            billing_from=self.billing_from,
        )


@dataclass(frozen=True)
class BillingRules:
    """How one instance is billed. ``price_micros_per_hour`` is per instance-hour or per GPU-hour
    as ``price_per`` says; ``disk_mb`` is the billed disk in decimal megabytes (GB * 1000).

    Raises UsageError when a rule has a value no platform uses.
    """

    price_micros_per_hour: int
    price_per: str = "instance_hour"
    gpu_count: int = 1
    increment: str = "second"
    min_charge_s: int = 0
    billing_from: str = "created"
    storage_micros_per_gb_month: int = 0
    disk_mb: int = 0
    egress_micros_per_gb: int = 0
    currency: str = "USD"

    def __post_init__(self) -> None:
        if self.increment not in INCREMENT_S:
            raise UsageError(
                t("billing increment {increment!r} is not known", increment=self.increment),
                hint=t("Use --billing second, minute or hour."),
            )
        if self.price_per not in PRICE_PER:
            raise UsageError(
                t("price per {unit!r} is not known", unit=self.price_per), hint=t(_PRICE_PER_HINT)
            )
        if self.billing_from not in BILLING_FROM:
            raise UsageError(
                t("billing from {start!r} is not known", start=self.billing_from),
                hint=t("Billing starts at 'created' or at 'ssh_ready'."),
            )
        for name in (
            "price_micros_per_hour",
            "min_charge_s",
            "storage_micros_per_gb_month",
            "disk_mb",
            "egress_micros_per_gb",
        ):
            if getattr(self, name) < 0:
                raise UsageError(
                    t("{name} must not be negative", name=name),
                    hint=t("Give amounts of 0 or more."),
                )
        if self.gpu_count < 1:
            raise UsageError(
                t("an instance has at least one GPU"), hint=t("Use --count 1 or more.")
            )

    @property
    def increment_s(self) -> int:
        """The billing increment in seconds."""
        return INCREMENT_S[self.increment]

    @property
    def hourly_micros(self) -> int:
        """What one hour of the whole instance costs, in micros."""
        return hourly_micros(self.price_micros_per_hour, self.price_per, self.gpu_count)


class BilledInstance(Protocol):
    """The fields of bot.store.models.Instance that billing reads."""

    provider: str
    price_micros: int
    price_per: str
    billing_increment: str | None
    min_charge_s: int | None
    billing_from: str | None
    gpu_count: int | None
    delivered_gpu_count: int | None
    disk_gb: float | None
    storage_micros_per_gb_month: int
    egress_micros_per_gb: int
    currency: str
    compute_carried_s: int
    compute_carried_micros: int
    storage_carried_s: int
    storage_carried_micros: int
    storage_carried_excess: int
    compute_session_at: datetime | None
    compute_closed_s: int
    compute_closed_used_s: int
    created_at: datetime
    ssh_ready_at: datetime | None
    stopped_at: datetime | None
    storage_deleted_at: datetime | None
    released_at: datetime | None
    release_mode: str | None


#: The names of BilledInstance's fields.
BILLED_FIELDS = (
    "provider",
    "price_micros",
    "price_per",
    "billing_increment",
    "min_charge_s",
    "billing_from",
    "gpu_count",
    "delivered_gpu_count",
    "disk_gb",
    "storage_micros_per_gb_month",
    "egress_micros_per_gb",
    "currency",
    "compute_carried_s",
    "compute_carried_micros",
    "storage_carried_s",
    "storage_carried_micros",
    "storage_carried_excess",
    "compute_session_at",
    "compute_closed_s",
    "compute_closed_used_s",
    "created_at",
    "ssh_ready_at",
    "stopped_at",
    "storage_deleted_at",
    "released_at",
    "release_mode",
)


@dataclass(frozen=True)
class CostBreakdown:
    """An instance's cost at one moment, in micros."""

    compute_micros: int
    storage_micros: int

    @property
    def total_micros(self) -> int:
        """Compute and storage together."""
        return self.compute_micros + self.storage_micros


def unverified_increment(instance: BilledInstance, platform: ProviderBilling) -> str | None:
    """The increment the instance is billed by when no document of its platform (``platform``)
    states it (a setting decides, e.g. GPUBOT_COMPSHARE_BILLING); None when the rule is
    documented or typed."""
    if platform.verified:
        return None
    return rules_for(instance, platform).increment


def billed_gpu_count(instance: BilledInstance) -> int:
    """The GPUs a per-GPU-hour price is paid for: the count registered, else the count the
    agent found, and at least one."""
    return max(1, instance.gpu_count or instance.delivered_gpu_count or 1)


def hourly_micros(price_micros_per_hour: int, price_per: str, gpu_count: int) -> int:
    """What one hour of a whole instance costs in micros: a per-GPU-hour price times its
    ``gpu_count``, a per-instance-hour price as it is."""
    if price_per == "gpu_hour":
        return price_micros_per_hour * gpu_count
    return price_micros_per_hour


def hourly_cost_micros(instance: BilledInstance) -> int:
    """What one hour of the instance costs in micros (compute only; see
    :func:`storage_micros_per_hour` for its disk)."""
    return hourly_micros(instance.price_micros, instance.price_per, billed_gpu_count(instance))


def rules_for(instance: BilledInstance, platform: ProviderBilling) -> BillingRules:
    """The instance's billing rules; a rule its row does not say (None) is its platform's
    (``platform``, the documented rules of ``instance.provider``)."""
    increment = instance.billing_increment or platform.increment
    min_charge_s = platform.min_charge_s if instance.min_charge_s is None else instance.min_charge_s
    billing_from = instance.billing_from or platform.billing_from
    return BillingRules(
        price_micros_per_hour=instance.price_micros,
        price_per=instance.price_per,
        gpu_count=billed_gpu_count(instance),
        increment=increment,
        min_charge_s=min_charge_s,
        billing_from=billing_from,
        storage_micros_per_gb_month=instance.storage_micros_per_gb_month,
        disk_mb=round((instance.disk_gb or 0) * MB_PER_GB),
        egress_micros_per_gb=instance.egress_micros_per_gb,
        currency=instance.currency,
    )


def elapsed_seconds(start: datetime, end: datetime) -> int:
    """Whole seconds from start to end, a started second counting in full; 0 when end <= start."""
    micros = (end - start) // timedelta(microseconds=1)
    return max(0, _ceil_div(micros, MICROS))


def billed_seconds(rules: BillingRules, session_s: int) -> int:
    """The seconds a session of ``session_s`` is billed for: rounded up to the increment, at
    least the minimum charge. A session of 0 seconds never started and bills nothing."""
    if session_s <= 0:
        return 0
    rounded = _ceil_div(session_s, rules.increment_s) * rules.increment_s
    return max(rounded, rules.min_charge_s)


def metered_cost(rules: BillingRules, seconds: int) -> int:
    """``seconds`` of the instance at its hourly price, without increments or minimum (micros)."""
    if seconds <= 0:
        return 0
    return _ceil_div(seconds * rules.hourly_micros, SECONDS_PER_HOUR)


def compute_cost(rules: BillingRules, start: datetime, end: datetime) -> int:
    """Compute cost in micros of one billing session from ``start`` to ``end``."""
    return metered_cost(rules, billed_seconds(rules, elapsed_seconds(start, end)))


def storage_cost(rules: BillingRules, start: datetime, end: datetime) -> int:
    """Micros for the disk kept from ``start`` to ``end`` (per second; a month is 730 h)."""
    return storage_cost_s(rules, elapsed_seconds(start, end))


def storage_cost_s(rules: BillingRules, seconds: int) -> int:
    """Micros for the disk kept ``seconds`` long (a month is 730 h)."""
    return _ceil_div(_storage_exact(rules, seconds), STORAGE_EXACT_PER_MICRO)


#: Storage is counted exactly in units of 1/STORAGE_EXACT_PER_MICRO micro (MB * micros per
#: GB-month * seconds), and rounded up to a micro only once, over the whole disk's life.
STORAGE_EXACT_PER_MICRO = MB_PER_GB * STORAGE_MONTH_S


def _storage_exact(rules: BillingRules, seconds: int) -> int:
    """What the disk costs for ``seconds`` in exact units (see STORAGE_EXACT_PER_MICRO)."""
    if seconds <= 0 or rules.disk_mb == 0:
        return 0
    return rules.disk_mb * rules.storage_micros_per_gb_month * seconds


def compute_totals(
    instance: BilledInstance, platform: ProviderBilling, seconds: int, *, final: bool
) -> tuple[int, int]:
    """(billed seconds, micros) the instance's compute owes ``seconds`` after billing started:
    the sessions closed at earlier stops, what the current session carried from earlier rules,
    and the rest of the current session under the current rules. ``final`` applies the
    increment and the minimum charge to the current session (it ends there). Moments before
    the current session began owe what the closed sessions owe. ``platform``: the rules of
    the instance's platform (see :func:`rules_for`)."""
    rules = rules_for(instance, platform)
    offset = session_offset_s(instance, platform)
    session_s = max(0, seconds - offset)
    billed = billed_seconds(rules, session_s) if final else session_s
    carried_s = min(max(0, instance.compute_carried_s - offset), billed)
    return (
        instance.compute_closed_s + billed,
        instance.compute_carried_micros + metered_cost(rules, billed - carried_s),
    )


def session_offset_s(instance: BilledInstance, platform: ProviderBilling) -> int:
    """Seconds from the billing start to the start of the current billing session (the last
    restart); 0 when the instance never ran again after a stop."""
    start = billing_start(instance, platform)
    if start is None or instance.compute_session_at is None:
        return 0
    return elapsed_seconds(start, instance.compute_session_at)


def used_seconds(instance: BilledInstance, platform: ProviderBilling, seconds: int) -> int:
    """The seconds the instance ran (every session, stopped time left out) ``seconds`` after
    billing started."""
    return instance.compute_closed_used_s + max(0, seconds - session_offset_s(instance, platform))


def at_one_price(instance: BilledInstance, platform: ProviderBilling) -> bool:
    """Whether every compute second carried so far (closed sessions, and stretches before a
    change of rules) cost what the current price makes of it, within :data:`PRICE_SLACK_MICROS`
    of rounding; False when an earlier stretch had another price (or none)."""
    rules = rules_for(instance, platform)
    carried_s = instance.compute_closed_s + max(
        0, instance.compute_carried_s - session_offset_s(instance, platform)
    )
    expected = metered_cost(rules, carried_s)
    return abs(expected - instance.compute_carried_micros) <= PRICE_SLACK_MICROS


def storage_totals(instance: BilledInstance, seconds: int) -> tuple[int, int]:
    """(seconds, micros) the disk owes after ``seconds`` of storage, carried part included:
    the stretches at earlier sizes and prices and the current one summed exactly, rounded up
    to a micro once (so a disk that changed price owes what its platform's per-second rates
    make of the whole, not a micro more per stretch). Storage bills alike on every platform."""
    rules = _storage_rules(instance)
    carried_s = min(instance.storage_carried_s, max(0, seconds))
    rest = _storage_exact(rules, seconds - carried_s) - instance.storage_carried_excess
    return seconds, instance.storage_carried_micros + max(
        0, _ceil_div(rest, STORAGE_EXACT_PER_MICRO)
    )


def carry(instance: BilledInstance, platform: ProviderBilling, at: datetime) -> dict[str, int]:
    """The carried fields to store before the instance's billing rules change at ``at``: what
    its sessions owe up to ``at`` under the rules in force (no increment rounding: the session
    goes on). Apply them together with the new rules.

    A change within the first second of billing (nothing carried before it: the console's
    `local`, stored without a price and registered at one a moment later) carries nothing:
    no whole second passed under the old rules, so the new ones bill from the start. Counting
    that started second in full would carry a second at the old price, and the session would
    read as partly at an earlier price and cost a second less than its increments say."""
    values = {
        "compute_carried_s": instance.compute_carried_s,
        "compute_carried_micros": instance.compute_carried_micros,
    }
    start = billing_start(instance, platform)
    if start is not None:
        end = _earlier(compute_end(instance), at)
        seconds = elapsed_seconds(start, end)
        fresh = instance.compute_carried_s == 0 and instance.compute_session_at is None
        if seconds > 0 and not (fresh and _same_moment(start, end)):
            _, micros = compute_totals(instance, platform, seconds, final=False)
            values.update(compute_carried_s=seconds, compute_carried_micros=micros)
    storage_at = _earlier(storage_end(instance), at)
    if instance.storage_carried_s == 0 and _same_moment(instance.created_at, storage_at):
        return values | {
            "storage_carried_s": 0,
            "storage_carried_micros": instance.storage_carried_micros,
            "storage_carried_excess": instance.storage_carried_excess,
        }
    storage_s = elapsed_seconds(instance.created_at, storage_at)
    _, storage_micros = storage_totals(instance, storage_s)
    carried_s = min(instance.storage_carried_s, storage_s)
    exact = (
        instance.storage_carried_micros * STORAGE_EXACT_PER_MICRO
        - instance.storage_carried_excess
        + _storage_exact(_storage_rules(instance), storage_s - carried_s)
    )
    values.update(
        storage_carried_s=storage_s,
        storage_carried_micros=storage_micros,
        storage_carried_excess=storage_micros * STORAGE_EXACT_PER_MICRO - exact,
    )
    return values


def storage_micros_per_hour(instance: BilledInstance) -> int:
    """What the instance's disk costs per hour, in micros (rounded up): what a stopped
    instance still costs."""
    return storage_cost_s(_storage_rules(instance), SECONDS_PER_HOUR)


def restart(instance: BilledInstance, platform: ProviderBilling, at: datetime) -> dict[str, object]:
    """The fields to store when a stopped instance runs again from ``at``: the session before
    it is closed (its increment and minimum applied) and what every closed session owes is
    carried (``compute_carried_*``, the seconds counted from the billing start up to ``at``),
    with their billed and used seconds (``compute_closed_*``); a new billing session begins at
    ``at`` (``compute_session_at``), with the increment and the minimum of its own. The time it
    stood stopped costs nothing and is billed for no seconds. Charges already written stay
    right: what is owed just before ``at`` and just after it is the same."""
    start = billing_start(instance, platform)
    end = compute_end(instance)
    values: dict[str, object] = {"stopped_at": None}
    if start is None or end is None:
        return values
    seconds = elapsed_seconds(start, end)
    billed, owed = compute_totals(instance, platform, seconds, final=True)
    values.update(
        compute_carried_s=elapsed_seconds(start, at),
        compute_carried_micros=owed,
        compute_session_at=at,
        compute_closed_s=billed,
        compute_closed_used_s=used_seconds(instance, platform, seconds),
    )
    return values


def egress_cost(rules: BillingRules, egress_bytes: int) -> int:
    """Cost in micros of ``egress_bytes`` sent out of the platform."""
    if egress_bytes <= 0:
        return 0
    return _ceil_div(egress_bytes * rules.egress_micros_per_gb, BYTES_PER_GB)


def billing_start(instance: BilledInstance, platform: ProviderBilling) -> datetime | None:
    """When compute billing starts; None while an ``ssh_ready`` instance has not been reached."""
    if (instance.billing_from or platform.billing_from) == "ssh_ready":
        return instance.ssh_ready_at
    return instance.created_at


def compute_end(instance: BilledInstance) -> datetime | None:
    """When compute billing stopped (stop or release, the earlier); None while it runs."""
    ends = [at for at in (instance.stopped_at, instance.released_at) if at is not None]
    return min(ends) if ends else None


def storage_end(instance: BilledInstance) -> datetime | None:
    """When storage billing stopped: the disk deleted, or a release that was not a stop."""
    if instance.storage_deleted_at is not None:
        return instance.storage_deleted_at
    if instance.released_at is not None and instance.release_mode != "stop":
        return instance.released_at
    return None


def cost_breakdown(
    instance: BilledInstance, platform: ProviderBilling, at: datetime
) -> CostBreakdown:
    """What the instance costs up to ``at``: the session cut at ``at`` if it still runs then.

    A session cut short is billed as if it ended at ``at`` (increment and minimum applied), which
    is what releasing it at ``at`` would cost.
    """
    compute = 0
    start = billing_start(instance, platform)
    if start is not None:
        seconds = elapsed_seconds(start, _earlier(compute_end(instance), at))
        if seconds > 0:
            compute = compute_totals(instance, platform, seconds, final=True)[1]
    storage_s = elapsed_seconds(instance.created_at, _earlier(storage_end(instance), at))
    storage = storage_totals(instance, storage_s)[1]
    return CostBreakdown(compute_micros=compute, storage_micros=storage)


def cost_so_far(instance: BilledInstance, platform: ProviderBilling, now: datetime) -> int:
    """Compute and storage cost in micros up to ``now`` (what releasing it now would cost)."""
    return cost_breakdown(instance, platform, now).total_micros


def projected_cost(instance: BilledInstance, platform: ProviderBilling, until: datetime) -> int:
    """Compute and storage cost in micros if the instance keeps running until ``until`` (its
    deadline, say); an instance already stopped or released costs what it cost."""
    return cost_breakdown(instance, platform, until).total_micros


def job_cost(
    instance: BilledInstance,
    platform: ProviderBilling,
    job_start: datetime,
    job_end: datetime,
    gpu_count: int | None,
) -> int:
    """A job's share in micros: its run time at the instance's hourly price, times the share of
    the instance's GPUs it held (``gpu_count`` of 0 or None means all of them). No increments:
    the session's rounding belongs to the instance, not to a job."""
    rules = rules_for(instance, platform)
    seconds = elapsed_seconds(job_start, job_end)
    if seconds == 0:
        return 0
    held = rules.gpu_count if not gpu_count or gpu_count > rules.gpu_count else gpu_count
    return _ceil_div(seconds * rules.hourly_micros * held, SECONDS_PER_HOUR * rules.gpu_count)


def parse_increment(text: str) -> str:
    """``second``/``s``, ``minute``/``min``/``m``, ``hour``/``h`` as an increment name."""
    names = {
        "s": "second",
        "sec": "second",
        "second": "second",
        "seconds": "second",
        "m": "minute",
        "min": "minute",
        "minute": "minute",
        "minutes": "minute",
        "h": "hour",
        "hr": "hour",
        "hour": "hour",
        "hours": "hour",
    }
    name = names.get(text.strip().lower())
    if name is None:
        raise UsageError(
            t("{text!r} is not a billing increment", text=text),
            hint=t("Use --billing second, minute or hour."),
        )
    return name


_PRICE_PER_HINT = N_("Prices are per instance-hour or per GPU-hour.")


def _storage_rules(instance: BilledInstance) -> BillingRules:
    """The rules storage is billed by: the instance's disk and its price (the same on every
    platform, per second)."""
    return BillingRules(
        price_micros_per_hour=instance.price_micros,
        price_per=instance.price_per,
        storage_micros_per_gb_month=instance.storage_micros_per_gb_month,
        disk_mb=round((instance.disk_gb or 0) * MB_PER_GB),
        currency=instance.currency,
    )


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def _same_moment(start: datetime, end: datetime) -> bool:
    """Whether ``end`` falls within the first second from ``start`` (no whole second passed)."""
    return end - start < timedelta(seconds=1)


def _earlier(first: datetime | None, second: datetime) -> datetime:
    return second if first is None or second < first else first
