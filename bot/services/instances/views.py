"""What the instance services return and the renderers show: frozen values, no rows, no Slack.

Times are naive UTC; every view that shows relative times carries the ``now`` it was built at
and the time zone name to show absolute times in. Money is integer micro-units; memory bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from bot.i18n import N_

if TYPE_CHECKING:
    from bot.services.money.costs import FinalCost

#: How to tell the bot what an instance's disk costs (``{name}`` the instance), said wherever
#: a stopped instance's storage price is not known.
STORAGE_HINT = N_(
    "Tell the bot what its disk costs: `/gpu policy {name} --disk 200 --storage 0.10/GB-month` "
    "(its size in GB and the platform's price per GB-month)."
)


@dataclass(frozen=True)
class InstanceView:
    """An instance as stored: who owns it, where it runs, what was rented, its deadline."""

    id: int
    name: str
    owner_id: str
    state: str
    provider: str
    provider_instance_id: str | None
    host: str
    port: int
    ssh_user: str
    project: str | None
    gpu_model: str | None
    gpu_count: int | None
    delivered_gpu_name: str | None
    delivered_gpu_count: int | None
    price_micros_per_hour: int
    currency: str
    created_at: datetime
    deadline_at: datetime | None
    lifetime_cap_at: datetime | None
    host_key_fingerprint: str | None
    python_path: str | None
    agent_version: str | None
    channel_id: str | None
    #: When compute stopped on the platform (a ``stopped`` instance); its disk may still bill.
    stopped_at: datetime | None = None
    #: What its disk costs per hour: all a stopped instance still costs.
    storage_micros_per_hour: int = 0

    @property
    def is_stopped(self) -> bool:
        """Stopped on its platform: compute off, the disk kept."""
        return self.state == "stopped"

    @property
    def storage_unknown(self) -> bool:
        """Stopped with no storage price recorded: what its disk costs is not known."""
        return self.is_stopped and self.storage_micros_per_hour <= 0

    @property
    def burn_micros_per_hour(self) -> int:
        """What it costs per hour now: its price, or only its disk while stopped."""
        return self.storage_micros_per_hour if self.is_stopped else self.price_micros_per_hour

    @property
    def is_local(self) -> bool:
        """The machine the bot runs on."""
        return self.host == "local"

    @property
    def address(self) -> str:
        """``user@host:port`` (IPv6 hosts in brackets), or ``local``."""
        if self.is_local:
            return "local"
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if self.port == 22 else f":{self.port}"
        return f"{self.ssh_user}@{host}{port}"


@dataclass(frozen=True)
class InstanceBrief:
    """The few facts about an instance that prompts and notices show (money in micro-units)."""

    name: str
    owner_id: str
    provider: str
    price_micros_per_hour: int
    currency: str = "USD"
    #: What its disk costs per hour (what it still costs while stopped).
    storage_micros_per_hour: int = 0


@dataclass(frozen=True)
class SettingsView:
    """An instance's settings: what happens at its deadline (``at_deadline`` ``release`` or
    ``wait-for-jobs``, at most ``max_grace_s`` seconds), when idle (released
    ``idle_release_after_s`` seconds after the idle prompt; None: prompt only), when its jobs are
    done; the admin's lifetime cap (naive UTC); how it is billed (``billing_increment``
    ``second``/``minute``/``hour`` and ``min_charge_s``, the platform's where not given); its
    disk in GB and what storage costs per GB-month (micro-units of ``currency``)."""

    name: str
    at_deadline: str
    max_grace_s: int
    idle_release_after_s: int | None
    release_when_done: bool
    lifetime_cap_at: datetime | None
    billing_increment: str
    min_charge_s: int
    disk_gb: float | None
    storage_micros_per_gb_month: int
    currency: str = "USD"
    #: The increment when a setting decides it, not a platform document (Compshare).
    unverified_increment: str | None = None


@dataclass(frozen=True)
class InstanceSettings:
    """`/gpu policy NAME` without options: the instance's deadline and settings, nothing
    changed; times shown in ``timezone``."""

    instance: InstanceView
    settings: SettingsView
    now: datetime
    timezone: str


@dataclass(frozen=True)
class GpuView:
    """One GPU at the last poll; None where the GPU does not report a value."""

    index: int
    name: str
    util_pct: int | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    temp_c: int | None
    power_w: float | None


@dataclass(frozen=True)
class JobBrief:
    """A job the bot knows is running on an instance."""

    id: int
    agent_job_id: str
    requested_by: str
    command: str
    started_at: datetime | None


@dataclass(frozen=True)
class ProblemView:
    """Why live data is missing: the error's class name (``Unreachable``...), message, hint."""

    kind: str
    message: str
    hint: str


@dataclass(frozen=True)
class InstanceRow:
    """One instance in the fleet overview: stored facts plus what the poll found.

    ``live`` is False when the instance was not asked (not active) or the poll failed
    (``problem`` says why); ``cost_micros`` is the cost so far (compute and storage)."""

    instance: InstanceView
    live: bool
    gpus: tuple[GpuView, ...]
    problem: ProblemView | None
    running_jobs: tuple[JobBrief, ...]
    cost_micros: int
    polled_at: datetime | None
    #: Why NVML failed at the last poll: the agent's message (the driver's own English) and
    #: its code (``protocol.NVML_ERROR_CODES``, the kind the bot says in words).
    nvml_problem: str | None = None
    nvml_code: str | None = None
    #: How the GPUs of the last poll differ from the rented ones, for as long as they do.
    mismatch: Mismatch | None = None


@dataclass(frozen=True)
class FleetOverview:
    """Every instance that is not released, with live status where it could be had."""

    rows: tuple[InstanceRow, ...]
    now: datetime
    timezone: str

    @property
    def hourly_burn_micros(self) -> int:
        """What the listed instances cost per hour together (a stopped one its disk)."""
        return sum(row.instance.burn_micros_per_hour for row in self.rows)

    @property
    def cost_micros(self) -> int:
        """What the listed instances cost so far together."""
        return sum(row.cost_micros for row in self.rows)


@dataclass(frozen=True)
class InstanceLine:
    """An instance in one line of a listing: what it is, what it costs per hour now (a stopped
    one its disk; ``storage_unknown`` when that is not known) and its GPUs at the last poll
    (``util_pct`` their mean utilisation, None when unknown; ``mismatch`` how they differ from
    the rented ones). Money in micro-units of ``currency``, times naive UTC."""

    id: int
    name: str
    owner_id: str
    state: str
    gpu_model: str | None
    gpu_count: int | None
    util_pct: int | None
    deadline_at: datetime | None
    burn_micros_per_hour: int
    storage_unknown: bool
    price_micros_per_hour: int
    currency: str
    mismatch: Mismatch | None


@dataclass(frozen=True)
class DeadlineBrief:
    """An instance whose deadline is near (naive UTC; a stopped one's is when its disk goes)."""

    id: int
    name: str
    owner_id: str
    state: str
    deadline_at: datetime


@dataclass(frozen=True)
class FleetSummary:
    """The team's unreleased instances in a few figures, read by bounded aggregate queries
    (their number does not change its cost to read much): how many there are (``by_state``:
    (state, count) by state), what they cost per hour together (a stopped one its disk;
    micro-units, currencies not told apart, as the overview adds them), how many stopped ones
    have no storage price (not counted), and the ``nearest`` deadlines, soonest first."""

    count: int
    by_state: tuple[tuple[str, int], ...]
    burn_micros_per_hour: int
    storage_unknown: int
    nearest: tuple[DeadlineBrief, ...]
    now: datetime


@dataclass(frozen=True)
class ListView:
    """`/gpu list` for one person (``user_id``) at ``now``: their unreleased instances in full
    (``mine``, by name), the team in figures (``summary``) and, where asked for, one page of
    the others' instances (``page`` of ``pages``, one line each, by name; ``paged`` False: no
    page was asked for and ``others`` is empty). What it costs follows ``mine`` and the page,
    not the team. Money in micro-units of ``currency``, times naive UTC."""

    user_id: str
    mine: tuple[InstanceRow, ...]
    summary: FleetSummary
    others: tuple[InstanceLine, ...]
    paged: bool
    page: int
    pages: int
    page_size: int
    now: datetime
    timezone: str
    currency: str

    @property
    def others_count(self) -> int:
        """How many of the team's unreleased instances are someone else's."""
        return max(0, self.summary.count - len(self.mine))


@dataclass(frozen=True)
class ProcessView:
    """A process holding GPU memory."""

    gpu_index: int
    pid: int
    user: str | None
    command: str | None
    used_mem_bytes: int | None
    job_id: str | None


@dataclass(frozen=True)
class InstanceDetail:
    """One instance in detail: the overview row and what else the poll said."""

    row: InstanceRow
    now: datetime
    timezone: str
    hostname: str | None
    driver_version: str | None
    cuda_version: str | None
    processes: tuple[ProcessView, ...]
    compute_cost_micros: int
    storage_cost_micros: int
    settings: SettingsView | None = None
    #: A stopped instance the bot can start on its platform (a Start button).
    can_start: bool = False


@dataclass(frozen=True)
class CheckView:
    """One health check: ``status`` pass, warn, fail or skip; ``hint`` what to do about it.

    ``summary`` and ``hint`` are the agent's English; the templates, when the agent sent them,
    are what they were formatted from, with their parameters (text), for other languages."""

    id: str
    status: str
    summary: str
    hint: str
    summary_template: str | None = None
    summary_params: Mapping[str, str] = field(default_factory=dict)
    hint_template: str | None = None
    hint_params: Mapping[str, str] = field(default_factory=dict)
    #: A finding of several parts, as the agent sent them (agents.protocol.HealthCheck).
    summary_parts: tuple[object, ...] = ()
    hint_parts: tuple[object, ...] = ()


@dataclass(frozen=True)
class HealthView:
    """The health checklist of one instance; ``status`` is the worst check's."""

    instance: InstanceView
    status: str
    checks: tuple[CheckView, ...]
    full: bool


@dataclass(frozen=True)
class Mismatch:
    """What was delivered differs from what was rented (fewer cards, another model, less
    memory); ``problems`` says each difference in words."""

    expected_model: str | None
    expected_count: int | None
    delivered_names: tuple[str, ...]
    problems: tuple[str, ...]


@dataclass(frozen=True)
class RegisterResult:
    """A registration: the stored instance, the pinned host key, the quick health check and any
    mismatch between the rented and the delivered GPUs."""

    instance: InstanceView
    host_key_fingerprint: str | None
    agent_version: str
    health: HealthView
    gpus: tuple[GpuView, ...]
    mismatch: Mismatch | None
    re_registered: bool
    now: datetime
    timezone: str
    settings: SettingsView | None = None
    #: The deadline is the default one (none was given): its length in seconds, else None.
    default_deadline_s: int | None = None


@dataclass(frozen=True)
class ReleaseAsk:
    """Before a release: what the instance cost so far and what runs on it. Nothing changed."""

    instance: InstanceView
    manual: bool
    cost_micros: int
    running_jobs: tuple[JobBrief, ...]
    #: ``terminate`` (release) or ``stop`` (the disk kept).
    mode: str = "terminate"


@dataclass(frozen=True)
class ReleaseView:
    """After a confirmed release request: the Release row's state (``confirmed``,
    ``awaiting_owner`` for a manual platform, ``pending``/``escalated`` while retrying);
    ``final_cost`` once it is confirmed (what the session cost, and why)."""

    instance: InstanceView
    release_id: int
    state: str
    manual: bool
    last_error: str | None
    mode: str = "terminate"
    final_cost: FinalCost | None = None


@dataclass(frozen=True)
class UnregisteredView:
    """An instance a platform account holds that no registration holds: what the platform says
    about it. ``price_micros_per_hour`` is in ``currency`` (the platform's); ``launched_at``
    None where the platform does not say; ``tags`` (key, value) say whose it may be."""

    provider: str
    provider_id: str
    name: str | None
    state: str
    raw_state: str
    gpu_model: str | None
    gpu_count: int | None
    price_micros_per_hour: int | None
    currency: str
    launched_at: datetime | None
    tags: tuple[tuple[str, str], ...]
    now: datetime
    timezone: str
