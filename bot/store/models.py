"""Tables. Times are UTC (naive datetimes holding UTC, see ``utcnow``); money is integer micro-units
of the configured currency (1 USD = 1_000_000 micros), in 64-bit columns.

Deadlines, prompts, releases, jobs and charges are rows: the scheduler only calls ``tick(now)``
and everything it must not drop or double is guarded by a unique key here.

Time columns are annotated ``NaiveDatetime`` so SQLModel maps them to a plain ``DateTime``
(a bare ``datetime`` would become its UTC-aware type, which rejects naive values).
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import NaiveDatetime
from sqlalchemy import BigInteger, Column, Index, LargeBinary, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel

#: The largest row id: ids are INTEGER columns (32-bit on PostgreSQL); a larger number names
#: no row and must not reach a query, where it would overflow.
MAX_ROW_ID = 2**31 - 1


def utcnow() -> datetime:
    """Now in UTC, naive, as stored."""
    return datetime.now(UTC).replace(tzinfo=None)


class Person(SQLModel, table=True):
    """A Slack user the bot knows (owners, requesters)."""

    slack_id: str = Field(primary_key=True, max_length=64)
    display_name: str | None = Field(default=None, max_length=200)
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    #: The language they chose with `/gpu lang` (``en``, ``zh``); None: the workspace's.
    language: str | None = Field(default=None, max_length=8)


#: A registration is live until it is released; the unique indexes below hold over live rows.
LIVE = "state != 'released'"


#: What an instance costs per hour depends on (bot.billing), by state, and where it runs: the
#: columns of the live instances' price index.
LIVE_PRICE_COLUMNS = (
    "state",
    "provider",
    "price_micros",
    "price_per",
    "gpu_count",
    "delivered_gpu_count",
    "disk_gb",
    "storage_micros_per_gb_month",
    "host",
)


def _live_unique(name: str, *columns: str, where: str = LIVE) -> Index:
    return Index(
        name, *columns, unique=True, sqlite_where=text(where), postgresql_where=text(where)
    )


class Instance(SQLModel, table=True):
    """One registration of a rented GPU instance. ``state``: registering, active, releasing,
    awaiting_confirmation, released, lost.

    A machine has one live registration (see bot.services.access): among rows that are not
    released, the name, the address ``(host, port, ssh_user)``, the pinned host key and the
    ``(provider, provider_instance_id)`` are each unique (partial unique indexes), so two
    concurrent registrations of one machine cannot both be stored.

    ``compute_carried_*`` and ``storage_carried_*`` hold what the billing session owed under
    earlier billing rules (a re-registration with a new price): seconds of the session and
    micros owed for them. Billing goes on from there under the current rules (bot.billing).
    ``compute_session_at`` is when the current billing session began (a restart after a stop:
    each start is billed on its own); ``compute_closed_s`` and ``compute_closed_used_s`` are the
    billed and the used seconds of the sessions closed before it.
    """

    __table_args__ = (
        _live_unique("uq_instance_live_name", "name"),
        _live_unique("uq_instance_live_address", "host", "port", "ssh_user"),
        _live_unique(
            "uq_instance_live_host_key",
            "host_key_fingerprint",
            where=f"{LIVE} AND host_key_fingerprint IS NOT NULL",
        ),
        _live_unique(
            "uq_instance_live_provider_id",
            "provider",
            "provider_instance_id",
            where=f"{LIVE} AND provider_instance_id IS NOT NULL",
        ),
        # What the clock looks for, by state first, so that released instances never weigh
        # on it (bot.services.tick): deadlines and caps near, idle since, polls due.
        Index("ix_instance_state_deadline", "state", "deadline_at"),
        Index("ix_instance_state_cap", "state", "lifetime_cap_at"),
        Index("ix_instance_state_idle", "state", "idle_since"),
        Index("ix_instance_state_polled", "state", "last_polled_at"),
        Index("ix_instance_state_poll_due", "state", "poll_due_at"),
        Index("ix_instance_state_when_done", "state", "release_when_done"),
        Index("ix_instance_state_stopped_remind", "state", "stopped_remind_at"),
        Index("ix_instance_ledger_due", "ledger_settled", "ledger_due_at"),
        Index("ix_instance_ledger_released", "ledger_settled", "released_at"),
        # One person's instances (the Home, per-person views), and those of theirs the ledger
        # has not settled (their spend), without reading the team's.
        Index("ix_instance_owner_state", "owner_id", "ledger_settled", "state"),
        # The team's figures (bot.services.instances.fleet_views.fleet_summary) from the live rows'
        # index entries alone: what each costs per hour, by state, and the nearest deadlines.
        Index(
            "ix_instance_live_prices",
            *LIVE_PRICE_COLUMNS,
            sqlite_where=text(LIVE),
            postgresql_where=text(LIVE),
        ),
        Index(
            "ix_instance_live_deadline",
            "deadline_at",
            "name",
            "host",
            sqlite_where=text(LIVE),
            postgresql_where=text(LIVE),
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, max_length=64)
    owner_id: str = Field(foreign_key="person.slack_id", max_length=64)
    channel_id: str | None = Field(default=None, max_length=64)
    project: str | None = Field(default=None, max_length=100, index=True)
    state: str = Field(default="registering", max_length=32, index=True)

    # Where it runs and how the bot reaches it.
    provider: str = Field(default="manual", max_length=32)
    provider_instance_id: str | None = Field(default=None, max_length=200)
    host: str = Field(max_length=255)
    port: int = 22
    ssh_user: str = Field(max_length=64)
    ssh_key_path: str | None = Field(default=None, max_length=1000)  # before keys by name
    ssh_key_name: str | None = Field(default=None, max_length=100)  # in GPUBOT_SSH_KEY_DIR
    host_key_type: str | None = Field(default=None, max_length=64)
    host_key_b64: str | None = Field(default=None, sa_column=Column(Text))
    host_key_fingerprint: str | None = Field(default=None, max_length=128)
    python_path: str | None = Field(default=None, max_length=1000)
    agent_home: str | None = Field(default=None, max_length=1000)  # GPU_AGENT_HOME there
    agent_version: str | None = Field(default=None, max_length=32)

    # What was rented, and what was delivered.
    gpu_model: str | None = Field(default=None, max_length=64)
    gpu_count: int | None = None
    delivered_gpu_name: str | None = Field(default=None, max_length=128)
    delivered_gpu_count: int | None = None

    # Billing rules (see bot.billing).
    price_micros: int = Field(default=0, sa_type=BigInteger)
    price_per: str = Field(default="instance_hour", max_length=16)  # or gpu_hour
    # None: not said at registration, the platform's rule applies (its provider module's
    # capabilities.billing, bot.providers.registry.platform_billing).
    billing_increment: str | None = Field(default=None, max_length=8)  # second, minute, hour
    min_charge_s: int | None = None
    billing_from: str | None = Field(default=None, max_length=16)  # created, ssh_ready
    disk_gb: float | None = None
    storage_micros_per_gb_month: int = Field(default=0, sa_type=BigInteger)
    egress_micros_per_gb: int = Field(default=0, sa_type=BigInteger)
    currency: str = Field(default="USD", max_length=8)
    compute_carried_s: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    compute_carried_micros: int = Field(
        default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"}
    )
    storage_carried_s: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    storage_carried_micros: int = Field(
        default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"}
    )
    # How much of storage_carried_micros is rounding up, in 1/(1000 * 730 * 3600) micro
    # (bot.billing.STORAGE_EXACT_PER_MICRO): storage is rounded once, not per stretch.
    storage_carried_excess: int = Field(
        default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"}
    )
    # The billing session that began at the last restart after a stop, and the billed and used
    # seconds of the sessions before it (bot.billing.restart).
    compute_session_at: NaiveDatetime | None = None
    compute_closed_s: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    compute_closed_used_s: int = Field(default=0, sa_column_kwargs={"server_default": "0"})

    # Life cycle (UTC).
    created_at: NaiveDatetime = Field(default_factory=utcnow, index=True)
    ssh_ready_at: NaiveDatetime | None = None
    stopped_at: NaiveDatetime | None = None  # compute stopped, storage may still bill
    # When the owner of a stopped instance is next reminded that its disk bills (None: no
    # more reminders; bot.services.instances.deadlines.STOPPED_REMINDERS_S).
    stopped_remind_at: NaiveDatetime | None = None
    storage_deleted_at: NaiveDatetime | None = None
    released_at: NaiveDatetime | None = None
    release_mode: str | None = Field(default=None, max_length=16)  # terminate, stop

    # Deadline and policy.
    deadline_at: NaiveDatetime | None = Field(default=None, index=True)
    deadline_policy: str = Field(default="release", max_length=16)  # release, wait-for-jobs
    max_grace_s: int = 3600
    # Set by an admin; only an admin lifts it.
    lifetime_cap_at: NaiveDatetime | None = None
    idle_release_after_s: int | None = None
    release_when_done: bool = False

    # Last poll of the agent, and when the next is due (bot.services.instances.polling spreads the
    # polls over the interval; None: a poll interval after the last poll, or at once).
    last_polled_at: NaiveDatetime | None = None
    poll_due_at: NaiveDatetime | None = None
    # The ledger's schedule (bot.services.money.ledger): when a charge may next be due (None: look
    # now), when it last looked, and whether every charge of a released instance is written.
    ledger_due_at: NaiveDatetime | None = None
    ledger_checked_at: NaiveDatetime | None = None
    ledger_settled: bool = Field(default=False, sa_column_kwargs={"server_default": text("false")})
    last_poll_ok: bool | None = None
    last_status_json: str | None = Field(default=None, sa_column=Column(Text))
    last_status_at: NaiveDatetime | None = None  # when last_status_json was taken
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    idle_since: NaiveDatetime | None = None
    # What views read of last_status_json, derived when it is stored (bot.services.instances.lookup
    # status_columns): the GPUs and the spec each matched, NVML's error; the GPUs' mean
    # utilisation (whole percent) and how many GPUs it saw. None: derived from the snapshot.
    status_facts_json: str | None = Field(default=None, sa_column=Column(Text))
    status_util_pct: int | None = None
    status_gpu_count: int | None = None


class InstanceAccess(SQLModel, table=True):
    """People the owner allowed to run and cancel jobs on an instance."""

    __table_args__ = (UniqueConstraint("instance_id", "person_id"),)

    id: int | None = Field(default=None, primary_key=True)
    instance_id: int = Field(foreign_key="instance.id", index=True)
    person_id: str = Field(foreign_key="person.slack_id", max_length=64)
    granted_by: str = Field(max_length=64)
    granted_at: NaiveDatetime = Field(default_factory=utcnow)


class KeyGrant(SQLModel, table=True):
    """A person an admin allowed to use the SSH key ``key_name`` of GPUBOT_SSH_KEY_DIR."""

    __table_args__ = (UniqueConstraint("key_name", "person_id"),)

    id: int | None = Field(default=None, primary_key=True)
    key_name: str = Field(max_length=100, index=True)
    person_id: str = Field(foreign_key="person.slack_id", max_length=64, index=True)
    granted_by: str = Field(max_length=64)
    granted_at: NaiveDatetime = Field(default_factory=utcnow)


class IdentityLink(SQLModel, table=True):
    """One person's Feishu identity (``feishu:ou_...``) linked by an admin to their Slack ID:
    the bot then treats the Feishu identity as the Slack one (bot.services.identities). One
    link per Feishu identity and per Slack ID."""

    __table_args__ = (UniqueConstraint("slack_id"),)

    feishu_id: str = Field(primary_key=True, max_length=64)
    slack_id: str = Field(max_length=64)
    linked_by: str = Field(max_length=64)
    linked_at: NaiveDatetime = Field(default_factory=utcnow)


class ChatPin(SQLModel, table=True):
    """The message the bot keeps pinned in a chat (the fleet's summary in Feishu's ops group),
    updated in place."""

    chat_id: str = Field(primary_key=True, max_length=64)
    message_id: str = Field(max_length=64)
    pinned_at: NaiveDatetime = Field(default_factory=utcnow)


class Prompt(SQLModel, table=True):
    """Something the bot asked or told a person: a deadline warning, an idle prompt, a confirmation.

    ``key`` makes it unique per instance, so a restart never sends it twice (for a deadline warning
    the key names the offset and the deadline it refers to). ``sent_at`` is set once posted.

    ``first_attempt_at`` is the first time the bot tried to post it, whatever came of it (the
    deadline policy counts from there, so Slack's trouble never holds a release back);
    ``delivery`` is ``posted``, or ``unconfirmed`` when Slack's answer was lost (it may have
    been posted, so it is not posted again); ``attempts`` counts the tries.
    """

    __table_args__ = (
        UniqueConstraint("instance_id", "kind", "key"),
        # The open prompts, by when they are due: what the clock reads, however many were
        # answered before.
        Index("ix_prompt_open", "resolved_at", "due_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    instance_id: int = Field(foreign_key="instance.id", index=True)
    kind: str = Field(max_length=32)
    key: str = Field(max_length=128)
    recipient: str = Field(max_length=64)
    due_at: NaiveDatetime
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    sent_at: NaiveDatetime | None = None
    first_attempt_at: NaiveDatetime | None = None
    attempts: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    delivery: str | None = Field(default=None, max_length=16)
    channel_id: str | None = Field(default=None, max_length=64)
    message_ts: str | None = Field(default=None, max_length=64)
    resolved_at: NaiveDatetime | None = None
    resolved_by: str | None = Field(default=None, max_length=64)
    resolution: str | None = Field(default=None, max_length=64)


class Release(SQLModel, table=True):
    """A request to release an instance; ``state``: pending, in_progress, confirmed, failed,
    escalated, awaiting_owner (manual provider). Marked confirmed only when the provider says so."""

    id: int | None = Field(default=None, primary_key=True)
    instance_id: int = Field(foreign_key="instance.id", index=True)
    reason: str = Field(max_length=32)  # user, deadline, idle, jobs_done, reconcile
    mode: str = Field(default="terminate", max_length=16)
    requested_by: str = Field(max_length=64)
    requested_at: NaiveDatetime = Field(default_factory=utcnow)
    state: str = Field(default="pending", max_length=32, index=True)
    attempts: int = 0
    next_attempt_at: NaiveDatetime | None = None
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    confirmed_at: NaiveDatetime | None = None
    escalated_at: NaiveDatetime | None = None


class Launch(SQLModel, table=True):
    """One instance `/gpu rent` asked a platform for, from the launch call to its end
    (bot.services.instances.launches). The instances of one call share ``launch_key``, the token
    in the ``platform_name`` they are given; ``position`` counts them from 1.

    ``state``: launching (the call may be running), refused (the platform refused, or did not
    start this one: nothing bills), launched (the platform answered with ``provider_id``),
    checked (it runs and its SSH port answers: being registered), adopted (registered as an
    instance), orphaned (it will not be registered: to be terminated), terminated (nothing of it
    bills: terminated, found gone, or the call started nothing). ``holder`` works on the row
    until ``lease_until`` (naive UTC); past it, a row in launching, launched, checked or
    orphaned is due to orphan recovery. ``told_at``: when the renter was told that terminating
    it failed (once)."""

    __table_args__ = (
        UniqueConstraint("launch_key", "position"),
        Index("ix_launch_due", "state", "lease_until"),
        Index("ix_launch_provider_id", "provider", "provider_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    launch_key: str = Field(max_length=32)
    position: int
    provider: str = Field(max_length=32)
    instance_type: str = Field(max_length=128)
    platform_name: str = Field(default="", max_length=128)
    name: str | None = Field(default=None, max_length=64)
    renter: str = Field(max_length=64)
    provider_id: str | None = Field(default=None, max_length=200)
    state: str = Field(max_length=16)
    holder: str | None = Field(default=None, max_length=32)
    lease_until: NaiveDatetime
    started_at: NaiveDatetime
    changed_at: NaiveDatetime
    reason: str | None = Field(default=None, max_length=128)
    attempts: int = 0
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    told_at: NaiveDatetime | None = None


class Job(SQLModel, table=True):
    """A job submitted through the bot; ``agent_job_id`` is the agent's id on the instance.

    ``replied_at`` is set in the same transaction that records the completion reply, so every
    finished job gets exactly one reply.
    """

    __table_args__ = (
        UniqueConstraint("instance_id", "agent_job_id"),
        Index("ix_job_when_done", "release_when_done", "instance_id"),
        # The running jobs one person asked for (their Home), without reading the team's.
        Index("ix_job_requester_state", "requested_by", "state"),
    )

    id: int | None = Field(default=None, primary_key=True)
    instance_id: int = Field(foreign_key="instance.id", index=True)
    agent_job_id: str = Field(max_length=64)
    requested_by: str = Field(max_length=64)
    command_json: str = Field(sa_column=Column(Text))
    gpus: str | None = Field(default=None, max_length=64)
    gpu_count: int = 0
    retries: int = 0
    release_when_done: bool = False
    state: str = Field(default="queued", max_length=16, index=True)
    submitted_at: NaiveDatetime = Field(default_factory=utcnow)
    started_at: NaiveDatetime | None = None
    finished_at: NaiveDatetime | None = None
    exit_code: int | None = None
    summary_json: str | None = Field(default=None, sa_column=Column(Text))
    channel_id: str | None = Field(default=None, max_length=64)
    message_ts: str | None = Field(default=None, max_length=64)
    reply_claimed_at: NaiveDatetime | None = None
    replied_at: NaiveDatetime | None = None
    cost_micros: int | None = Field(default=None, sa_type=BigInteger)


class Charge(SQLModel, table=True):
    """Money owed for one instance over [start_at, end_at): ``kind`` compute, storage or egress.

    Unique per (instance, kind, start_at), so re-running the ledger never charges twice. A
    compute charge carries the polls of its bucket as they stood when it was written (how many,
    how many bad, the highest utilisation %), so that reports tell idle from busy hours with a
    plain GROUP BY; None where nothing was recorded.
    """

    __table_args__ = (
        UniqueConstraint("instance_id", "kind", "start_at"),
        # One instance's charges over a stretch of time, whatever their kind: what a spend
        # summary is built from, a range of instances at a time (bot.services.money.ledger).
        Index("ix_charge_instance_start", "instance_id", "start_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    instance_id: int = Field(foreign_key="instance.id", index=True)
    kind: str = Field(max_length=16)
    start_at: NaiveDatetime = Field(index=True)
    end_at: NaiveDatetime
    billed_s: int = 0
    amount_micros: int = Field(default=0, sa_type=BigInteger)
    currency: str = Field(default="USD", max_length=8)
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    polls: int | None = None
    bad_polls: int | None = None
    max_util_pct: float | None = None
    #: GPU-samples of the bucket idle, in use and not measured (bot.services.money.samples); None on
    #: charges written before they were counted (the bucket's polls then tell idle from busy).
    idle_gpu_samples: int | None = None
    busy_gpu_samples: int | None = None
    unmeasured_gpu_samples: int | None = None


class LedgerState(SQLModel, table=True):
    """What the ledger holds for one instance and kind (compute, storage), kept with the charges
    in the same transaction so that no run has to add the charges up again: where the last
    charge ended, the totals charged, and the total of the charges starting in ``month``
    (``YYYY-MM`` in the configured zone), the month of the last charge."""

    instance_id: int = Field(foreign_key="instance.id", primary_key=True)
    kind: str = Field(max_length=16, primary_key=True)
    last_end_at: NaiveDatetime
    charged_micros: int = Field(default=0, sa_type=BigInteger)
    billed_s: int = Field(default=0, sa_type=BigInteger)
    month: str = Field(max_length=7, index=True)
    month_micros: int = Field(default=0, sa_type=BigInteger)


class SpendDay(SQLModel, table=True):
    """The charges of one instance that start on one local ``day`` (days since 1970-01-01 in
    ``zone``) of ``month`` (``YYYY-MM`` in ``zone``), summed as `/gpu spend` reads them, with
    compute split into idle, not measured and (the rest) in use, ``threshold_pct`` judging the
    charges written before GPU-samples were counted: what reports group instead of the charges.

    Only whole months are kept, and only while a :class:`SpendMonth` row says so; the ledger
    adds to these rows in the transaction that writes the charges (bot.services.money.ledger)."""

    zone: str = Field(max_length=64, primary_key=True)
    threshold_pct: float = Field(primary_key=True)
    month: str = Field(max_length=7, primary_key=True)
    instance_id: int = Field(primary_key=True)
    day: int = Field(primary_key=True)
    compute_micros: int = Field(default=0, sa_type=BigInteger)
    #: Storage and any other kind.
    other_micros: int = Field(default=0, sa_type=BigInteger)
    idle_micros: int = Field(default=0, sa_type=BigInteger)
    compute_s: int = Field(default=0, sa_type=BigInteger)
    unmeasured_micros: int = Field(default=0, sa_type=BigInteger)


class SpendMonth(SQLModel, table=True):
    """``month`` (``YYYY-MM`` in ``zone``) is summed up in :class:`SpendDay` for ``zone`` and
    ``threshold_pct``, every charge of it included, and kept up to date by the ledger.

    While the month is being summed up (in short transactions, a range of instances each),
    ``summed_to_id`` is the highest instance id whose charges are in: the ledger keeps those
    up to date, the next range is summed from the charges, and reports wait for the whole.
    None: every instance is in."""

    zone: str = Field(max_length=64, primary_key=True)
    threshold_pct: float = Field(primary_key=True)
    month: str = Field(max_length=7, primary_key=True)
    built_at: NaiveDatetime = Field(default_factory=utcnow)
    summed_to_id: int | None = None


class UtilSample(SQLModel, table=True):
    """One poll of an instance: mean GPU utilisation %; ``ok`` False when the poll failed
    (the instance's idle clock then stops). Its GPUs as they were judged for money: how many
    were idle, in use, or not measured (a failed poll: all of them; see bot.services.money.samples).
    """

    __table_args__ = (Index("ix_utilsample_instance_at", "instance_id", "at"),)

    id: int | None = Field(default=None, primary_key=True)
    instance_id: int = Field(foreign_key="instance.id", index=True)
    at: NaiveDatetime = Field(index=True)
    ok: bool = True
    util_avg_pct: float | None = None
    gpu_procs: int = 0
    running_jobs: int = 0
    gpus_idle: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    gpus_busy: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    gpus_unmeasured: int = Field(default=0, sa_column_kwargs={"server_default": "0"})


class UtilHour(SQLModel, table=True):
    """The polls of one instance in one ledger bucket (the charge that starts at
    ``bucket_start``: an hour, cut at billing start, month starts and the end), rolled up as they
    are recorded (bot.services.money.samples), so that reports join charges to one row each and
    never
    read raw samples: how many polls, how many failed or read no utilisation, the highest
    utilisation % read, and the GPU-samples (one GPU in one poll) idle, in use and not measured,
    by which the bucket's compute is split (bot.services.money.ledger)."""

    instance_id: int = Field(foreign_key="instance.id", primary_key=True)
    bucket_start: NaiveDatetime = Field(primary_key=True)
    polls: int = 0
    bad_polls: int = 0
    max_util_pct: float | None = None
    idle_gpu_samples: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    busy_gpu_samples: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    unmeasured_gpu_samples: int = Field(default=0, sa_column_kwargs={"server_default": "0"})


class Budget(SQLModel, table=True):
    """A monthly budget for a user or a project."""

    __table_args__ = (UniqueConstraint("scope", "subject"),)

    id: int | None = Field(default=None, primary_key=True)
    scope: str = Field(max_length=16)  # user, project
    subject: str = Field(max_length=100)
    limit_micros: int = Field(sa_type=BigInteger)
    created_by: str = Field(max_length=64)
    created_at: NaiveDatetime = Field(default_factory=utcnow)


class BudgetAlert(SQLModel, table=True):
    """A budget alert sent: once per budget, month and threshold (50, 80, 100)."""

    __table_args__ = (UniqueConstraint("budget_id", "month", "threshold_pct"),)

    id: int | None = Field(default=None, primary_key=True)
    budget_id: int = Field(foreign_key="budget.id", index=True)
    month: str = Field(max_length=7)
    threshold_pct: int
    sent_at: NaiveDatetime = Field(default_factory=utcnow)


class Digest(SQLModel, table=True):
    """The digest of ``month`` ("YYYY-MM"): claimed before it is built, so exactly one is
    queued in the outbox; ``posted_at`` is when it was queued, ``message_ts`` where it landed
    when the first try posted it."""

    month: str = Field(primary_key=True, max_length=7)
    claimed_at: NaiveDatetime = Field(default_factory=utcnow)
    posted_at: NaiveDatetime | None = None
    channel_id: str | None = Field(default=None, max_length=64)
    message_ts: str | None = Field(default=None, max_length=64)


class OutboxMessage(SQLModel, table=True):
    """Something the bot says on its own (a completion reply, a budget alert, a digest and its
    chart, a notice, an escalation), written in the same transaction as the decision to say it.

    ``key`` names what the message is about, so deciding twice queues it once. ``delivery`` is
    None while it is due, ``posted``, ``unconfirmed`` (Slack's answer was lost: it may have been
    posted, so it never is again) or ``failed`` (Slack refused it for good). ``claimed_at`` is
    the lease of the process posting it; ``due_at`` moves back after a failed try. A row with
    ``file_name`` is a file shared in the thread of the message ``thread_of`` names.
    """

    __tablename__ = "outbox"
    __table_args__ = (
        UniqueConstraint("key"),
        Index("ix_outbox_due", "delivery", "due_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(max_length=160)
    kind: str = Field(max_length=32)
    instance_id: int | None = Field(default=None, foreign_key="instance.id", index=True)
    recipient: str = Field(max_length=64)
    thread_ts: str | None = Field(default=None, max_length=64)
    thread_of: int | None = Field(default=None, foreign_key="outbox.id")
    text: str = Field(sa_column=Column(Text, nullable=False))
    blocks_json: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    file_name: str | None = Field(default=None, max_length=128)
    file_bytes: bytes | None = Field(default=None, sa_column=Column(LargeBinary))
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    due_at: NaiveDatetime
    claimed_at: NaiveDatetime | None = None
    first_attempt_at: NaiveDatetime | None = None
    attempts: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    delivery: str | None = Field(default=None, max_length=16)
    channel_id: str | None = Field(default=None, max_length=64)
    message_ts: str | None = Field(default=None, max_length=64)
    sent_at: NaiveDatetime | None = None
    escalated_at: NaiveDatetime | None = None


class StepClaim(SQLModel, table=True):
    """Work one process must do alone in a slot of the clock (reconciling with the platforms,
    recovering rentals): the process whose insert wins does it; (step, slot) is unique."""

    __table_args__ = (UniqueConstraint("step", "slot"),)

    id: int | None = Field(default=None, primary_key=True)
    step: str = Field(max_length=32)
    slot: int = Field(sa_type=BigInteger)
    claimed_at: NaiveDatetime = Field(default_factory=utcnow)


class SeenSignature(SQLModel, table=True):
    """A Slack request signature already applied (bot.replay), kept until ``expires_at``
    (naive UTC): the process whose insert wins runs the request; the signature is the key."""

    __tablename__ = "seen_signature"

    signature: str = Field(primary_key=True, max_length=128)
    expires_at: NaiveDatetime = Field(index=True)


class AuditLog(SQLModel, table=True):
    """Who changed what, when."""

    id: int | None = Field(default=None, primary_key=True)
    at: NaiveDatetime = Field(default_factory=utcnow, index=True)
    actor: str = Field(max_length=64)
    action: str = Field(max_length=64)
    instance_id: int | None = Field(default=None, foreign_key="instance.id", index=True)
    details_json: str = Field(default="{}", sa_column=Column(Text))


class PlatformBill(SQLModel, table=True):
    """What a platform billed one of its instances over [``start_at``, ``end_at``) as its own
    bill says (bot.services.money.bills): compute and storage apart where it splits them
    (``storage_micros`` None where not), the total, in micro-units of ``currency``;
    ``fetched_at`` is when it was read. One row per (provider, instance, start)."""

    __table_args__ = (Index("ix_platformbill_provider_start", "provider", "start_at"),)

    provider: str = Field(max_length=32, primary_key=True)
    provider_instance_id: str = Field(max_length=200, primary_key=True)
    start_at: NaiveDatetime = Field(primary_key=True)
    end_at: NaiveDatetime
    compute_micros: int = Field(default=0, sa_type=BigInteger)
    storage_micros: int | None = Field(default=None, sa_type=BigInteger)
    total_micros: int = Field(default=0, sa_type=BigInteger)
    currency: str = Field(default="USD", max_length=8)
    fetched_at: NaiveDatetime


class BillFetch(SQLModel, table=True):
    """Reading one platform's bills: ``due_at`` is when it may be read next (claimed by moving
    it on), ``fetched_at`` when it was last read whole, covering [``covered_from``,
    ``covered_to``), and ``error`` why the last try failed (None when it did not)."""

    provider: str = Field(max_length=32, primary_key=True)
    due_at: NaiveDatetime
    tried_at: NaiveDatetime | None = None
    fetched_at: NaiveDatetime | None = None
    covered_from: NaiveDatetime | None = None
    covered_to: NaiveDatetime | None = None
    error: str | None = Field(default=None, sa_column=Column(Text))
