"""The agents on the simulated machines, as the bot's fleet reaches them: ``status`` with the
GPUs busy, idle, overheating or missing; and the job commands (``run``, ``jobs --since``,
``cancel``, ``logs``) answered as ``gpu-agent`` answers them (agents.protocol's records), with
jobs queued for free GPUs, run for the time their command asks, retried, and ending as their
command says: succeeded, failed (CUDA out of memory, or flaky and retried), or never (a hang,
until someone cancels it or the machine goes). Hosts hang or drop the connection, reboot (their
unfinished jobs are lost, as the agent reports a supervisor gone), have their job store wiped
(the agent no longer knows the jobs), and lose a ``run``'s answer after queueing the job.

A job's fate is written in its command: ``python train.py --sim=FATE:SECONDS`` (FATE one of
:data:`FATES`), so the same seed gives the same jobs whichever process submits them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from agents.messages import (
    JOB_FINISHED,
    NOTE_CANCELLED,
    NOTE_CANCELLED_QUEUED,
    NOTE_SUPERVISOR_GONE,
)
from agents.protocol import (
    Diagnosis,
    GpuRequest,
    JobFailure,
    JobList,
    JobRecord,
    JobRequestError,
    JobSummary,
    StatusSnapshot,
    parse_gpus,
)
from bench.sim.platforms import Platforms
from bench.sim.world import SimClock, World
from bot.errors import CommandTimeout, FleetError, Unreachable
from bot.fleet.agent_client import AgentRefused
from bot.fleet.base import Target
from tests.agents.factories import make_status

#: How a job ends: ``ok`` succeeds, ``oom`` fails (exit 1, CUDA out of memory) at every
#: attempt, ``flaky`` fails its first attempt and succeeds the next, ``hang`` never ends.
FATES = ("ok", "oom", "flaky", "hang")
SIM_FLAG = "--sim="


@dataclass
class SimJob:
    """One job as the agent keeps it (times naive UTC, by the simulated clock)."""

    id: str
    name: str | None
    command: tuple[str, ...]
    request: GpuRequest
    retries: int
    fate: str
    run_s: int
    created_at: datetime
    updated_at: datetime
    state: str = "queued"
    attempt: int = 0
    assigned: tuple[int, ...] = ()
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    note: str | None = None
    note_template: str | None = None

    @property
    def ends_at(self) -> datetime | None:
        """When the running attempt ends; None for a hang (or a job not running)."""
        if self.state != "running" or self.started_at is None or self.fate == "hang":
            return None
        return self.started_at + timedelta(seconds=self.run_s)

    @property
    def final(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled", "lost")


@dataclass
class SimHost:
    """One machine's agent: its GPUs and job store."""

    name: str
    provider_id: str
    gpu_count: int
    jobs: dict[str, SimJob] = field(default_factory=dict)
    seq: int = 0
    #: When the agent's job store was last wiped (its jobs forgotten).
    wiped_at: datetime | None = None

    def advance(self, now: datetime) -> None:
        """Run the host's queue up to ``now``: attempts end at their time, retries start at
        once, queued jobs take the GPUs freed (first come, first served)."""
        while True:
            ending = [j for j in self.jobs.values() if j.ends_at is not None]
            if not ending:
                break
            job = min(ending, key=lambda j: (j.ends_at, j.id))
            at = job.ends_at
            assert at is not None
            if at > now:
                break
            self._end_attempt(job, at)
            self._start(at)
        self._start(now)

    def submit(self, job: SimJob, now: datetime) -> None:
        self.advance(now)
        self.jobs[job.id] = job
        self._start(now)

    def free(self) -> list[int]:
        held = {g for j in self.jobs.values() if j.state == "running" for g in j.assigned}
        return [g for g in range(self.gpu_count) if g not in held]

    def _end_attempt(self, job: SimJob, at: datetime) -> None:
        fails = job.fate == "oom" or (job.fate == "flaky" and job.attempt == 0)
        job.updated_at = at
        if fails and job.attempt < job.retries:
            job.attempt += 1
            job.started_at = at
            return
        job.state = "failed" if fails else "succeeded"
        job.exit_code = 1 if fails else 0
        job.finished_at = at

    def _start(self, at: datetime) -> None:
        for job in sorted(self.jobs.values(), key=lambda j: j.id):
            if job.state != "queued":
                continue
            free = self.free()
            wanted = self._wanted(job.request, free)
            if wanted is None:
                return  # first come, first served: the head waits for its GPUs
            job.state, job.assigned = "running", wanted
            job.started_at = job.updated_at = max(at, job.created_at)

    def _wanted(self, request: GpuRequest, free: list[int]) -> tuple[int, ...] | None:
        if request.indices:
            return request.indices if set(request.indices) <= set(free) else None
        count = self.gpu_count if request.count < 0 else request.count
        return tuple(free[:count]) if len(free) >= count else None


class SimFleet:
    """The fleet as the bot's services use it: ``agent(target)`` and ``fan_out(targets, fn)``,
    answered by :class:`SimAgent` for each host."""

    closed = False

    def __init__(self, world: World, clock: SimClock, cloud: Platforms) -> None:
        self.world = world
        self.clock = clock
        self.cloud = cloud
        self.hosts: dict[str, SimHost] = {}

    def add_host(self, name: str, provider_id: str, gpu_count: int) -> None:
        self.hosts[name] = SimHost(name, provider_id, gpu_count)

    def agent(self, target: Target, *, timeout_s: float | None = None) -> SimAgent:
        return SimAgent(self, target)

    def fan_out(
        self,
        targets: Sequence[Target],
        fn: Callable[[SimAgent], Any],
        *,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        for target in targets:
            try:
                answers[target.name] = fn(self.agent(target))
            except FleetError as exc:
                answers[target.name] = exc
        return answers

    def forget(self, name: str) -> None:
        return None

    def misbehave(self, now: datetime) -> None:
        """Now and then a host reboots (its unfinished jobs are lost) or its job store is
        wiped (the agent forgets its jobs)."""
        busy = sorted(
            h.name for h in self.hosts.values() if any(not j.final for j in h.jobs.values())
        )
        if busy and self.world.fires("job_host_reboot", 0.001):
            host = self.hosts[self.world.rng.choice(busy)]
            host.advance(now)
            for job in host.jobs.values():
                if not job.final:
                    job.state, job.finished_at, job.updated_at = "lost", now, now
                    job.note = job.note_template = NOTE_SUPERVISOR_GONE
            self.world.log(now, f"[{host.name}] host rebooted: its unfinished jobs are lost")
        if busy and self.world.fires("job_store_wiped", 0.0003):
            host = self.hosts[self.world.rng.choice(busy)]
            host.jobs.clear()
            host.wiped_at = now
            self.world.log(now, f"[{host.name}] the agent's job store was wiped")

    def host(self, name: str) -> SimHost:
        """The host answering for ``name``. Raises Unreachable when the machine has ended on
        the platform (nothing answers SSH there any more)."""
        host = self.hosts.get(name)
        if host is None:
            raise Unreachable(f"{name}: no route to host", instance=name)
        machine = self.cloud.machines.get(host.provider_id)
        if machine is None or machine.ended_at is not None:
            raise Unreachable(f"{name}: connection refused", instance=name)
        return host


class SimAgent:
    """``gpu-agent`` on one host: every call may hang (CommandTimeout) or drop (Unreachable)
    first, as SSH does."""

    def __init__(self, fleet: SimFleet, target: Target) -> None:
        self.fleet = fleet
        self.target = target
        self.world = fleet.world

    def status(self) -> StatusSnapshot:
        name = self.target.name
        world = self.world
        self._reach()
        n = self.fleet.host(name).gpu_count
        if world.fires("gpu_idle", 0.01):
            return make_status(n=n, util_gpu_pct=0)
        if world.fires("gpu_overheat", 0.005):
            return make_status(
                n=n, util_gpu_pct=85, temp_c=94, clock_event_reasons=("hw_thermal_slowdown",)
            )
        if world.fires("gpu_gone", 0.003):
            return make_status(gpus=[])
        return make_status(n=n, util_gpu_pct=85, clock_event_reasons=())

    def run(
        self,
        command: Sequence[str],
        *,
        gpus: str | None = None,
        name: str | None = None,
        retries: int = 0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> JobRecord:
        now = self.fleet.clock()
        hung = self._reach(queue_first=True)
        host = self.fleet.host(self.target.name)
        try:
            request = parse_gpus(gpus)
        except JobRequestError as exc:
            raise self._refused("gpus_not_understood", str(exc), exit_code=2) from exc
        if any(i >= host.gpu_count for i in request.indices):
            message = f"GPU {max(request.indices)} does not exist on this machine"
            raise self._refused("gpu_missing", message, exit_code=2)
        if request.count > host.gpu_count:
            message = f"this machine has {host.gpu_count} GPUs"
            raise self._refused("gpus_too_many", message, exit_code=2)
        fate, run_s = _fate(command)
        host.seq += 1
        job = SimJob(
            id=f"{now:%Y%m%d-%H%M%S}-{host.seq:04d}",
            name=name,
            command=tuple(command),
            request=request,
            retries=retries,
            fate=fate,
            run_s=run_s,
            created_at=now,
            updated_at=now,
        )
        host.submit(job, now)
        if hung is not None:
            raise hung  # queued, but the answer never came back
        if self.world.fires("job_run_lost_answer", 0.02):
            self.world.log(now, f"[{host.name}] the run's answer was lost after queueing it")
            raise Unreachable("connection reset after sending", instance=host.name)
        return record_of(job)

    def jobs(self, *, since: str | None = None) -> JobList:
        self._reach()
        host = self.fleet.host(self.target.name)
        host.advance(self.fleet.clock())
        cutoff = _naive(since) if since else None
        records = [
            record_of(j)
            for j in sorted(host.jobs.values(), key=lambda j: j.id)
            if cutoff is None or j.updated_at >= cutoff
        ]
        return JobList(jobs=tuple(records))

    def cancel(self, job_id: str) -> JobRecord:
        now = self.fleet.clock()
        self._reach()
        host = self.fleet.host(self.target.name)
        host.advance(now)
        job = host.jobs.get(job_id)
        if job is None:
            raise self._refused("job_not_found", f"no job {job_id!r}", exit_code=1)
        if job.final:
            message = JOB_FINISHED.format(job=job_id, state=job.state)
            raise self._refused("job_finished", message, exit_code=1)
        note = NOTE_CANCELLED_QUEUED if job.state == "queued" else NOTE_CANCELLED
        job.state, job.finished_at, job.updated_at = "cancelled", now, now
        job.note = job.note_template = note
        host.advance(now)
        return record_of(job)

    def logs(self, job_id: str, *, tail: int | None = None) -> str:
        self._reach()
        job = self.fleet.host(self.target.name).jobs.get(job_id)
        if job is None:
            raise self._refused("job_not_found", f"no job {job_id!r}", exit_code=1)
        return f"{' '.join(job.command)}\n"

    def _reach(self, *, queue_first: bool = False) -> FleetError | None:
        """SSH's misbehaviour before the command runs: a hang (CommandTimeout) or a dropped
        connection (Unreachable). With ``queue_first``, a hang is returned, not raised: the
        command ran but its answer never came (the caller raises it after acting)."""
        name = self.target.name
        if self.world.fires("ssh_hang", 0.02):
            hang = CommandTimeout(f"{name}: no answer within the timeout", instance=name)
            if queue_first and self.world.rng.random() < 0.5:
                return hang
            raise hang
        if self.world.fires("ssh_drop", 0.005):
            raise Unreachable(f"{name}: connection reset", instance=name)
        return None

    def _refused(self, code: str, message: str, *, exit_code: int) -> AgentRefused:
        failure = JobFailure(code=code, message=message, exit_code=exit_code)
        return AgentRefused(
            f"gpu-agent exit code {exit_code}: gpu-agent: error: {message}",
            failure=failure,
            instance=self.target.name,
        )


def record_of(job: SimJob) -> JobRecord:
    """The agent's record of ``job`` (times ISO 8601 UTC)."""
    summary = None
    if job.final and job.started_at is not None and job.finished_at is not None:
        diagnoses: tuple[Diagnosis, ...] = ()
        if job.state == "failed":
            diagnoses = (Diagnosis(code="cuda_oom", message="CUDA ran out of memory."),)
        duration = (job.finished_at - job.started_at).total_seconds()
        summary = JobSummary(duration_s=duration, cpu_avg_pct=None, gpus=(), diagnoses=diagnoses)
    record = JobRecord(
        id=job.id,
        name=job.name,
        state=job.state,
        command=job.command,
        user="sim",
        gpus_requested=job.request.text,
        gpus_assigned=job.assigned if job.state != "queued" else (),
        retries=job.retries,
        attempt=job.attempt,
        created_at=_iso(job.created_at) or "",
        started_at=_iso(job.started_at),
        finished_at=_iso(job.finished_at),
        exit_code=job.exit_code,
        summary=summary,
        updated_at=_iso(job.updated_at),
    )
    if job.note is not None:
        record = replace(record, note=job.note, note_template=job.note_template)
    return record


def _fate(command: Sequence[str]) -> tuple[str, int]:
    for part in command:
        if part.startswith(SIM_FLAG):
            fate, _, seconds = part[len(SIM_FLAG) :].partition(":")
            return fate, int(seconds)
    return "ok", 60


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC).isoformat(timespec="milliseconds")


def _naive(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment
