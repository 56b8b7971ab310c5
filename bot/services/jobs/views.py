"""What the job services hand to the renderers: frozen views, no Slack, no SQL.

Times are naive UTC; money is integer micro-units of ``currency``; durations are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agents.protocol import JobSummary


@dataclass(frozen=True)
class JobView:
    """A job on an instance. ``id`` is the bot's job number (None for a job started on the
    instance without the bot); ``requested_by`` the Slack user who ran it; ``user`` the
    account it runs as on the instance. ``cost_micros`` is the job's share of the instance's
    price while it ran: its GPUs' share of all ``instance_gpu_count`` GPUs, or the whole
    instance's time when it held none (the instance is paid for either way)."""

    id: int | None
    agent_job_id: str
    instance_id: int
    instance_name: str
    state: str
    command: tuple[str, ...]
    requested_by: str | None = None
    user: str | None = None
    name: str | None = None
    gpus_requested: str | None = None
    gpus_assigned: tuple[int, ...] = ()
    retries: int = 0
    attempt: int = 0
    release_when_done: bool = False
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    duration_s: float | None = None
    gpu_hours: float | None = None
    cost_micros: int | None = None
    currency: str = "USD"
    summary: JobSummary | None = None
    note: str | None = None
    instance_active: bool = True
    instance_gpu_count: int | None = None
    cancelled_by: str | None = None  # the Slack user whose `/gpu cancel` stopped it
    #: Why the job has no GPU though none was refused it (the default on a machine without
    #: a usable GPU); None otherwise.
    gpus_note: str | None = None
    #: The command is not shown to this reader (``command`` is then empty): only the job's
    #: requester, the instance's owner, the people allowed on it and admins see it.
    command_hidden: bool = False
    #: When the job asked for any free GPUs and could not start as it was queued: every GPU
    #: it could not have and what holds it (processes without their commands); () otherwise.
    gpus_in_use: tuple[WhoGpuView, ...] = ()

    @property
    def ref(self) -> str:
        """How people name the job in commands: ``42`` for the bot's jobs, else
        ``INSTANCE:AGENT_ID``."""
        return str(self.id) if self.id is not None else f"{self.instance_name}:{self.agent_job_id}"

    @property
    def final(self) -> bool:
        """Whether the job has ended (succeeded, failed, cancelled or lost)."""
        return self.state in FINAL_STATES


FINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "lost"})


@dataclass(frozen=True)
class SubmitResult:
    """A queued job and whether its channel message was posted (the completion reply goes to
    that message's thread, else to the requester directly)."""

    job: JobView
    posted: bool


@dataclass(frozen=True)
class JobListView:
    """Jobs of one instance (``instance_name``) or of the whole fleet (None); ``problem`` says
    why the list comes from the bot's records rather than from the instance."""

    instance_name: str | None
    jobs: tuple[JobView, ...]
    problem: str | None = None


@dataclass(frozen=True)
class LogView:
    """The end of a job's log: ``text`` holds at most ``tail`` lines. ``job`` is the job as
    its agent had it after the log was read, or, with ``state_stale``, as the bot last saw it
    (the agent could not be asked)."""

    job: JobView
    text: str
    tail: int
    state_stale: bool = False


@dataclass(frozen=True)
class WhoProcess:
    """A process on a GPU: its account on the instance, and the Slack user and job behind it
    where the bot knows them; its share of the GPU's SMs, its host CPU use (100 = one core)
    and how long it has run, where the agent could tell."""

    pid: int
    user: str | None
    slack_user: str | None
    job_ref: str | None
    command: str | None
    used_mem_bytes: int | None
    sm_util_pct: int | None = None
    cpu_pct: float | None = None
    elapsed_s: float | None = None
    #: The command is not shown to this reader (``command`` is then None).
    command_hidden: bool = False


@dataclass(frozen=True)
class WhoReservation:
    """An agent job that holds a GPU (``starting``: none of its processes is on it yet) or
    waits for GPUs (``wanted`` says which, e.g. "any 2 free GPUs")."""

    job_ref: str
    slack_user: str | None
    user: str | None
    starting: bool = False
    wanted: str | None = None


@dataclass(frozen=True)
class WhoGpuView:
    """One GPU, its processes, the job holding it and the jobs waiting for it. Memory in
    bytes; ``unseen_mem_bytes`` is memory in use beyond what the visible processes hold
    (processes of another container), None when there is none worth telling."""

    index: int
    name: str
    processes: tuple[WhoProcess, ...]
    util_gpu_pct: int | None = None
    held_by: WhoReservation | None = None
    waiting: tuple[WhoReservation, ...] = ()
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    unseen_mem_bytes: int | None = None
    #: Whether the agent gives it to a new job asking for any free GPU (nothing holds more
    #: than a CUDA context's memory on it and it is nearly idle); None from older agents.
    free_for_jobs: bool | None = None

    @property
    def free(self) -> bool:
        """Whether a new job may have it: the agent's word where it gave one; else no
        process, no job holding it and no memory in use by processes not visible."""
        if self.free_for_jobs is not None:
            return self.free_for_jobs
        return not self.processes and self.held_by is None and self.unseen_mem_bytes is None

    @property
    def used_outside(self) -> bool:
        """Whether something other than the agent's jobs keeps it from being free: a process
        no agent job started, or memory or load on it while no job of the agent's holds it
        (on a GPU a job holds, memory no visible process holds is taken to be the job's own,
        as inside a container whose processes NVML does not list)."""
        if self.free:
            return False
        return any(p.job_ref is None for p in self.processes) or self.held_by is None


@dataclass(frozen=True)
class WhoView:
    """``/gpu who NAME``; ``waiting_any`` are queued jobs that asked for a count of GPUs."""

    instance_name: str
    gpus: tuple[WhoGpuView, ...]
    waiting_any: tuple[WhoReservation, ...] = ()


@dataclass(frozen=True)
class PollReport:
    """One poll of jobs: how many rows changed, replies posted, instances that failed."""

    updated: int = 0
    replied: int = 0
    unreachable: tuple[str, ...] = ()


@dataclass(frozen=True)
class AccessChange:
    """The result of allow/deny: ``changed`` is False when the list already said so;
    ``allowed`` is everyone on the list afterwards (Slack IDs, oldest grant first)."""

    instance_name: str
    owner_id: str
    person_id: str
    granted: bool
    changed: bool
    allowed: tuple[str, ...]
