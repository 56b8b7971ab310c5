"""Detached jobs on the instance: the job store, the FIFO GPU queue, cancel, lost jobs and ``who``.

Standard library only, Python 3.9, Linux (``/proc``). State lives under ``GPU_AGENT_HOME``
(default ``~/.gpu-agent``)::

    lock                     flock'ed by everything that changes a job
    seq                      the last submission number (the queue's FIFO order)
    active/<id>              an empty file for every job that is not final yet
    jobs/<id>/meta.json      the job: JobRecord fields plus private ones, replaced atomically
    jobs/<id>/log            the job's stdout and stderr, all attempts
    jobs/<id>/supervisor.log the supervisor's own errors

Every job has a supervisor process (agents.supervisor) in its own session, so it outlives the
SSH session that submitted it. A supervisor whose process is gone (checked by pid and start
time, so a reused pid is not mistaken for it) is noticed by the next command: its job becomes
``lost`` and stops holding GPUs. Times are ISO 8601 UTC strings; durations in seconds.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import (
    Any,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from agents.protocol import (
    FINAL_JOB_STATES,
    JobList,
    JobRecord,
    JobSummary,
    WhoGpu,
    WhoJob,
    WhoReport,
    from_dict,
)

ENV_HOME = "GPU_AGENT_HOME"
#: Seconds between samples of a running job's GPUs and CPU (default 5).
ENV_SAMPLE_S = "GPU_AGENT_SAMPLE_S"
#: Seconds between SIGTERM and SIGKILL when a job is cancelled (default 10).
ENV_GRACE_S = "GPU_AGENT_CANCEL_GRACE_S"
#: Seconds a queued job waits between looks at the queue (default 1).
ENV_QUEUE_POLL_S = "GPU_AGENT_QUEUE_POLL_S"

DEFAULT_SAMPLE_S = 5.0
DEFAULT_GRACE_S = 10.0
DEFAULT_QUEUE_POLL_S = 1.0
MAX_RETRIES = 100
LOG_TAIL_LINES = 50
LOG_TAIL_MAX_CHARS = 8000

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED_ENV = frozenset(
    {"CUDA_VISIBLE_DEVICES", "GPUBOT_JOB_ID", "GPUBOT_JOB_DIR", "GPUBOT_ATTEMPT"}
)
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from agents.supervisor import main; sys.exit(main(sys.argv[2:]))"
)
_HAS_PROC = os.path.exists("/proc/self/stat")
_LAUNCHED: List[subprocess.Popen] = []  # type: ignore[type-arg]


class JobError(Exception):
    """A job command failed; ``str(err)`` says why and what to do. Exit code 1."""

    exit_code = 1


class JobRequestError(JobError):
    """The request itself is wrong (bad --gpus, missing command, unknown directory). Exit code 2."""

    exit_code = 2


class JobNotFound(JobError):
    """No job has this id (or more than one starts with it)."""


# --- GPU requests and the queue -------------------------------------------------------------


@dataclass(frozen=True)
class GpuRequest:
    """GPUs a job wants: ``count`` of them (0: none), exactly ``indices`` when given."""

    count: int = 0
    indices: Tuple[int, ...] = ()

    @property
    def text(self) -> Optional[str]:
        """The request as ``--gpus`` takes it (``all`` for every GPU); None for no GPUs."""
        if self.indices:
            return ",".join(str(i) for i in self.indices) + ("," if len(self.indices) == 1 else "")
        if self.count < 0:
            return "all"
        return str(self.count) if self.count else None


def parse_gpus(text: Optional[str]) -> GpuRequest:
    """``--gpus``: ``N`` (any N free GPUs), ``0,1`` (exactly these; ``3,`` is GPU 3 alone),
    ``all``, or None/``0`` for none. Raises JobRequestError."""
    if text is None:
        return GpuRequest()
    raw = text.strip().lower()
    if raw == "all":
        return GpuRequest(count=-1)
    if raw.isdigit():
        return GpuRequest(count=int(raw))
    parts = [p.strip() for p in raw.split(",")]
    if "," in raw and parts[-1] == "":
        parts = parts[:-1]
    if not parts or not all(p.isdigit() for p in parts):
        raise JobRequestError(
            f"--gpus {text!r} is not understood: give a count (--gpus 2), GPU indices "
            "(--gpus 0,1; --gpus 3, for GPU 3 alone) or all"
        )
    indices = tuple(int(p) for p in parts)
    if len(set(indices)) != len(indices):
        raise JobRequestError(f"--gpus {text!r} names a GPU twice")
    return GpuRequest(count=len(indices), indices=tuple(sorted(indices)))


def resolve_request(request: GpuRequest, available: Sequence[int], why: str) -> GpuRequest:
    """Check ``request`` against the GPU indices this machine has; ``all`` becomes exact indices.

    ``why`` explains an empty ``available``. Raises JobError when it can never be met.
    """
    if request.count == 0:
        return request
    if not available:
        raise JobError(
            f"this job asks for GPUs but no NVIDIA GPU can be used here ({why}); "
            "run `gpu-agent health` to see why, or run the job without --gpus"
        )
    if request.count < 0:
        return GpuRequest(count=len(available), indices=tuple(sorted(available)))
    missing = [i for i in request.indices if i not in available]
    if missing:
        raise JobRequestError(
            f"--gpus names GPU {', '.join(map(str, missing))}, but this machine has GPUs "
            f"{', '.join(map(str, sorted(available)))}"
        )
    if request.count > len(available):
        raise JobRequestError(
            f"--gpus {request.count} asks for more GPUs than this machine has ({len(available)})"
        )
    return request


def plan_starts(
    queue: Sequence[Tuple[str, GpuRequest]], gpus: Sequence[int], busy: Iterable[int]
) -> Dict[str, Tuple[int, ...]]:
    """Which queued jobs may start now, and on which GPUs. Pure.

    ``queue`` is in FIFO order, ``gpus`` every GPU index, ``busy`` those running jobs hold.
    A later job never takes a GPU an earlier waiting job needs: an exact request that cannot
    start reserves its GPUs; a request for any N that cannot start holds back every GPU job
    behind it. Jobs without GPUs start at once.
    """
    taken: Set[int] = set(busy)
    reserved: Set[int] = set()
    hold_gpu_jobs = False
    plan: Dict[str, Tuple[int, ...]] = {}
    for job_id, request in queue:
        if request.count == 0:
            plan[job_id] = ()
            continue
        if hold_gpu_jobs:
            continue
        if request.indices:
            if all(i in gpus and i not in taken and i not in reserved for i in request.indices):
                plan[job_id] = request.indices
                taken.update(request.indices)
            else:
                reserved.update(request.indices)
            continue
        free = [g for g in sorted(gpus) if g not in taken and g not in reserved]
        if len(free) < request.count:
            hold_gpu_jobs = True
            continue
        chosen = tuple(free[: request.count])
        plan[job_id] = chosen
        taken.update(chosen)
    return plan


# --- the store ------------------------------------------------------------------------------


class JobStore:
    """The jobs under one GPU_AGENT_HOME. Change a job only inside ``with store.locked():``."""

    def __init__(self, home: str) -> None:
        self.home = os.path.abspath(os.path.expanduser(home))
        self.jobs_dir = os.path.join(self.home, "jobs")
        self.active_dir = os.path.join(self.home, "active")
        self.lock_path = os.path.join(self.home, "lock")
        self.seq_path = os.path.join(self.home, "seq")

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> JobStore:
        """The store named by GPU_AGENT_HOME (default ~/.gpu-agent)."""
        env = os.environ if env is None else env
        return cls(env.get(ENV_HOME) or os.path.join("~", ".gpu-agent"))

    def ensure(self) -> None:
        """Create the directories (private to the user)."""
        for path in (self.home, self.jobs_dir, self.active_dir):
            os.makedirs(path, mode=0o700, exist_ok=True)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's exclusive lock (fcntl.flock) for the block."""
        import fcntl

        self.ensure()
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def job_dir(self, job_id: str) -> str:
        return os.path.join(self.jobs_dir, job_id)

    def log_path(self, job_id: str) -> str:
        return os.path.join(self.jobs_dir, job_id, "log")

    def read(self, job_id: str) -> Dict[str, Any]:
        """A job's metadata. Raises JobNotFound."""
        try:
            with open(os.path.join(self.jobs_dir, job_id, "meta.json"), encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError as exc:
            raise JobNotFound(f"no job {job_id!r} on this machine") from exc
        except ValueError as exc:
            raise JobError(f"job {job_id!r} has unreadable metadata: {exc}") from exc
        if not isinstance(data, dict):
            raise JobError(f"job {job_id!r} has unreadable metadata")
        return data

    def write(self, meta: Dict[str, Any]) -> None:
        """Replace a job's metadata atomically (temporary file, fsync, rename), stamping
        ``updated_at``."""
        meta["updated_at"] = iso_now()
        path = os.path.join(self.jobs_dir, meta["id"], "meta.json")
        _write_atomic(path, json.dumps(meta, sort_keys=True, indent=1).encode("utf-8"))

    def finish(self, meta: Dict[str, Any]) -> None:
        """Write a job that reached a final state and drop it from the active set."""
        self.write(meta)
        with suppress(FileNotFoundError):
            os.unlink(os.path.join(self.active_dir, meta["id"]))

    def all_ids(self) -> List[str]:
        try:
            return sorted(n for n in os.listdir(self.jobs_dir) if not n.startswith("."))
        except FileNotFoundError:
            return []

    def active_ids(self) -> List[str]:
        try:
            return sorted(os.listdir(self.active_dir))
        except FileNotFoundError:
            return []

    def active_metas(self) -> List[Dict[str, Any]]:
        """Metadata of every job not yet final, in FIFO order."""
        metas = []
        for job_id in self.active_ids():
            try:
                metas.append(self.read(job_id))
            except JobNotFound:
                _unlink_quietly(os.path.join(self.active_dir, job_id))
        return sorted(metas, key=lambda m: m.get("seq", 0))

    def create(self, meta: Dict[str, Any]) -> str:
        """Give ``meta`` a new unique id and FIFO number, write it and mark it active (locked)."""
        seq = self._next_seq()
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        for _ in range(50):
            job_id = f"{stamp}-{secrets.token_hex(2)}"
            try:
                os.mkdir(self.job_dir(job_id), 0o700)
            except FileExistsError:
                continue
            meta.update(id=job_id, seq=seq)
            self.write(meta)
            with open(os.path.join(self.active_dir, job_id), "wb"):
                pass
            return job_id
        raise JobError("could not pick a new job id; try again")

    def resolve(self, ref: str) -> str:
        """The id of the job ``ref`` names: its id, a unique prefix of it, or a unique name."""
        ids = self.all_ids()
        if ref in ids:
            return ref
        matches = [i for i in ids if i.startswith(ref)] if ref else []
        if not matches:
            matches = [i for i in ids if _safe_name(self, i) == ref]
        if len(matches) == 1:
            return matches[0]
        if matches:
            shown = ", ".join(matches[:5])
            raise JobNotFound(f"{ref!r} matches {len(matches)} jobs ({shown}); give more of the id")
        raise JobNotFound(f"no job {ref!r} on this machine; `gpu-agent jobs` lists them")

    def _next_seq(self) -> int:
        try:
            with open(self.seq_path, encoding="utf-8") as fh:
                current = int(fh.read().strip() or "0")
        except (FileNotFoundError, ValueError):
            current = 0
        _write_atomic(self.seq_path, str(current + 1).encode("ascii"))
        return current + 1


# --- /proc ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """A process from /proc/<pid>/stat; ``cpu_ticks`` counts its and its waited-for children's
    user+system time in clock ticks; ``start_ticks`` is its start time after boot."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    cpu_ticks: int
    start_ticks: int

    @property
    def running(self) -> bool:
        """False for a zombie or dead process."""
        return self.state not in ("Z", "X", "x")


def proc_stat(pid: int) -> Optional[ProcStat]:
    """The process ``pid`` from /proc, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    try:
        rest = raw[raw.rindex(")") + 2 :].split()
        return ProcStat(
            pid=pid,
            state=rest[0],
            ppid=int(rest[1]),
            pgrp=int(rest[2]),
            session=int(rest[3]),
            cpu_ticks=sum(int(v) for v in rest[11:15]),
            start_ticks=int(rest[19]),
        )
    except (ValueError, IndexError):
        return None


def pid_alive(pid: Optional[int], start_ticks: Optional[int]) -> bool:
    """Whether ``pid`` runs and is the process that started at ``start_ticks`` (not a reuse)."""
    if not pid:
        return False
    if not _HAS_PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    stat = proc_stat(pid)
    if stat is None or not stat.running:
        return False
    return start_ticks is None or stat.start_ticks == start_ticks


def session_members(sid: Optional[int], leader_start: Optional[int]) -> List[ProcStat]:
    """Live processes in session ``sid`` (a job's session: its first process's pid).

    While any process uses a session id, Linux does not hand that number out again, so the
    members are the job's own, unless the leader's pid now belongs to a newer process.
    """
    if not sid:
        return []
    leader = proc_stat(sid)
    if leader is not None and leader_start is not None and leader.start_ticks != leader_start:
        return []
    members = []
    for pid in _all_pids():
        stat = proc_stat(pid)
        if stat is not None and stat.session == sid and stat.running:
            members.append(stat)
    return members


def signal_session(sid: Optional[int], leader_start: Optional[int], signum: int) -> int:
    """Send ``signum`` to the job's process group and every other process of its session.
    Returns how many processes were signalled."""
    members = session_members(sid, leader_start)
    if not members:
        return 0
    if sid is not None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signum)
    for member in members:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(member.pid, signum)
    return len(members)


def stop_session(
    sid: Optional[int], leader_start: Optional[int], grace_s: float, reap: bool = False
) -> None:
    """SIGTERM the session, wait up to ``grace_s`` for it to empty, then SIGKILL what is left.
    With ``reap``, collect exited children meanwhile (the supervisor is their parent)."""
    if not signal_session(sid, leader_start, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap:
            reap_children()
        if not session_members(sid, leader_start):
            return
        time.sleep(0.05)
    signal_session(sid, leader_start, signal.SIGKILL)
    if reap:
        for _ in range(40):
            reap_children()
            if not session_members(sid, leader_start):
                return
            time.sleep(0.05)


def reap_children() -> List[Tuple[int, int, float]]:
    """Collect every exited child: (pid, wait status, CPU seconds of it and its waited-for
    children) for each."""
    reaped = []
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        reaped.append((pid, status, usage.ru_utime + usage.ru_stime))
    return reaped


def process_user(pid: int) -> Optional[str]:
    """The user name owning ``pid`` (its uid when there is no name); None when unknown."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    return user_name(uid)


def user_name(uid: Optional[int] = None) -> str:
    """The login name of ``uid`` (default: this process's user)."""
    import pwd

    uid = os.getuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _all_pids() -> List[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


# --- the commands ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRequest:
    """``gpu-agent run``: the command as argv (never given to a shell) and its options."""

    command: Tuple[str, ...]
    gpus: GpuRequest = GpuRequest()
    name: Optional[str] = None
    retries: int = 0
    env: Tuple[Tuple[str, str], ...] = ()
    cwd: Optional[str] = None


def submit(
    store: JobStore,
    request: RunRequest,
    *,
    available_gpus: Optional[Sequence[int]] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> JobRecord:
    """Queue a job and start its detached supervisor; returns the job as queued.

    ``available_gpus`` are the GPU indices (default: asked from NVML when GPUs are wanted).
    Raises JobRequestError for a bad request, JobError when it cannot be queued.
    """
    environ = os.environ if environ is None else environ
    cwd = _check_request(request, environ)
    gpus = request.gpus
    if gpus.count != 0:
        found, why = (list(available_gpus), "") if available_gpus is not None else gpu_indices()
        gpus = resolve_request(gpus, found, why)
    meta: Dict[str, Any] = {
        "name": request.name,
        "state": "queued",
        "command": list(request.command),
        "user": user_name(),
        "gpus_requested": request.gpus.text,
        "want_count": gpus.count,
        "want_indices": list(gpus.indices),
        "gpus_assigned": [],
        "retries": request.retries,
        "attempt": 0,
        "created_at": iso_now(),
        "started_at": None,
        "finished_at": None,
        "exit_code": None,
        "summary": None,
        "note": None,
        "cwd": cwd,
        "env": dict(request.env),
    }
    with store.locked():
        reap_lost(store)
        job_id = store.create(meta)
        try:
            pid, start = _launch_supervisor(store, job_id)
        except OSError as exc:
            meta.update(
                state="failed",
                finished_at=iso_now(),
                note=f"could not start the job's supervisor: {exc}",
            )
            store.finish(meta)
            raise JobError(f"could not start the job's supervisor: {exc}") from exc
        meta.update(supervisor_pid=pid, supervisor_start=start)
        store.write(meta)
    return record_of(meta)


def list_jobs(store: JobStore, since: Optional[datetime] = None) -> JobList:
    """Every job (FIFO order), or those changed at or after ``since``; notices lost jobs first."""
    with store.locked():
        reap_lost(store)
    records = []
    for job_id in store.all_ids():
        try:
            meta = store.read(job_id)
        except JobError:
            continue
        if since is not None and parse_iso(meta.get("updated_at") or "") < since:
            continue
        records.append((meta.get("seq", 0), record_of(meta)))
    records.sort(key=lambda pair: pair[0])
    return JobList(jobs=tuple(r for _, r in records))


def get_job(store: JobStore, ref: str) -> JobRecord:
    """One job by id, id prefix or name. Raises JobNotFound."""
    with store.locked():
        reap_lost(store)
    return record_of(store.read(store.resolve(ref)))


def read_log(store: JobStore, ref: str, tail: Optional[int] = None) -> str:
    """A job's log (stdout and stderr of every attempt), or its last ``tail`` lines."""
    job_id = store.resolve(ref)
    path = store.log_path(job_id)
    if not os.path.exists(path):
        return ""
    if tail is None:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    return tail_lines(path, tail)


def cancel(
    store: JobStore, ref: str, *, grace_s: Optional[float] = None, by: Optional[str] = None
) -> JobRecord:
    """Cancel a job: a queued one never runs; a running one gets SIGTERM on its whole process
    group and session, SIGKILL after ``grace_s``. Returns the job once final.

    Raises JobNotFound, or JobError when the job has already finished.
    """
    grace = env_seconds(ENV_GRACE_S, DEFAULT_GRACE_S) if grace_s is None else grace_s
    with store.locked():
        reap_lost(store)
        job_id = store.resolve(ref)
        meta = store.read(job_id)
        if meta["state"] in FINAL_JOB_STATES:
            raise JobError(f"job {job_id} has already finished ({meta['state']})")
        meta["cancel_requested_at"] = iso_now()
        meta["cancel_requested_by"] = by or user_name()
        if meta["state"] == "queued":
            meta.update(state="cancelled", finished_at=iso_now(), note="cancelled while queued")
            store.finish(meta)
            return record_of(meta)
        store.write(meta)
    stop_session(meta.get("job_pid"), meta.get("job_start"), grace)
    return _await_final(store, job_id, grace)


def who(store: JobStore) -> WhoReport:
    """Every GPU and every process on it, with the job it belongs to where an agent job started
    it (its process is in the job's session), each process's SM and CPU use, and the agent's
    reservations: the running job a GPU is assigned to (also while it is starting and holds
    no memory yet) and the queued jobs waiting for it. Raises JobError when NVML cannot be
    used."""
    from agents import nvml

    snapshot = nvml.collect_status()
    if snapshot.nvml_error is not None:
        raise JobError(f"{snapshot.nvml_error.message}. {snapshot.nvml_error.hint}")
    with store.locked():
        reap_lost(store)
        active = store.active_metas()
    owners = jobs_of_pids(store, [p.pid for p in snapshot.processes], active)
    held, waiting, waiting_any = reservations(active)
    gpus = []
    for gpu in snapshot.gpus:
        procs = tuple(
            replace(p, user=p.user or process_user(p.pid), job_id=owners.get(p.pid))
            for p in snapshot.processes
            if p.gpu_index == gpu.index
        )
        gpus.append(
            WhoGpu(
                index=gpu.index,
                name=gpu.name,
                processes=procs,
                util_gpu_pct=gpu.util_gpu_pct,
                mem_used_bytes=gpu.mem_used_bytes,
                mem_total_bytes=gpu.mem_total_bytes,
                held_by=held.get(gpu.index),
                waiting=tuple(waiting.get(gpu.index, ())),
            )
        )
    return WhoReport(gpus=tuple(gpus), waiting_any=tuple(waiting_any))


def reservations(
    metas: Iterable[Mapping[str, Any]],
) -> Tuple[Dict[int, WhoJob], Dict[int, List[WhoJob]], List[WhoJob]]:
    """The GPUs unfinished jobs hold or wait for. Pure.

    Returns (GPU index -> the running job assigned to it, GPU index -> queued jobs that asked
    for it by index, queued jobs that asked for a count of GPUs), each in FIFO order.
    """
    held: Dict[int, WhoJob] = {}
    waiting: Dict[int, List[WhoJob]] = {}
    waiting_any: List[WhoJob] = []
    for meta in sorted(metas, key=lambda m: m.get("seq", 0)):
        state = meta.get("state")
        if state == "running":
            job = _who_job(meta, tuple(int(g) for g in meta.get("gpus_assigned") or ()))
            for index in job.gpus:
                held.setdefault(index, job)
        elif state == "queued" and int(meta.get("want_count") or 0) != 0:
            indices = tuple(int(g) for g in meta.get("want_indices") or ())
            job = _who_job(meta, indices)
            if indices:
                for index in indices:
                    waiting.setdefault(index, []).append(job)
            else:
                waiting_any.append(job)
    return held, waiting, waiting_any


def _who_job(meta: Mapping[str, Any], gpus: Tuple[int, ...]) -> WhoJob:
    running = meta.get("state") == "running"
    return WhoJob(
        job_id=str(meta["id"]),
        name=meta.get("name"),
        user=meta.get("user"),
        state=str(meta.get("state")),
        gpus=gpus,
        gpus_requested=meta.get("gpus_requested"),
        since=meta.get("started_at") if running else meta.get("created_at"),
    )


def jobs_of_pids(
    store: JobStore,
    pids: Iterable[int],
    active: Optional[Sequence[Mapping[str, Any]]] = None,
) -> Dict[int, str]:
    """The running agent job each of ``pids`` belongs to (the process is in the job's session),
    for the pids that belong to one; takes no lock and never starts or reaps anything.

    Cheap enough for every ``status``: nothing is read when ``pids`` is empty; otherwise one
    directory listing plus one small JSON file per unfinished job, and one ``/proc/PID/stat``
    per pid only when some job is running. ``status`` fills ProcessSnapshot.job_id with::

        owners = runner.jobs_of_pids(runner.JobStore.from_env(), [p.pid for p in procs])
        procs = [replace(p, job_id=owners.get(p.pid)) for p in procs]

    ``active`` are the unfinished jobs' metadata when the caller has read them already.
    """
    wanted = list(pids)
    if not wanted:
        return {}
    sessions = {
        int(m["job_pid"]): str(m["id"])
        for m in (store.active_metas() if active is None else active)
        if m.get("state") == "running" and m.get("job_pid")
    }
    if not sessions:
        return {}
    found: Dict[int, str] = {}
    for pid in wanted:
        stat = proc_stat(pid)
        if stat is not None and stat.session in sessions:
            found[pid] = sessions[stat.session]
    return found


def reap_lost(store: JobStore) -> List[str]:
    """Mark ``lost`` every unfinished job whose supervisor is gone and stop what is left of it;
    call with the store locked. Returns the ids marked."""
    lost = []
    for meta in store.active_metas():
        if meta.get("state") in FINAL_JOB_STATES:
            store.finish(meta)
            continue
        if pid_alive(meta.get("supervisor_pid"), meta.get("supervisor_start")):
            continue
        signal_session(meta.get("job_pid"), meta.get("job_start"), signal.SIGKILL)
        now = iso_now()
        meta.update(
            state="lost",
            finished_at=now,
            note=(
                "the job's supervisor process is gone (killed, or the machine rebooted); "
                "what was left of the job was stopped"
            ),
        )
        meta["summary"] = _lost_summary(store, meta, now)
        store.finish(meta)
        lost.append(meta["id"])
    return lost


# --- shared helpers -------------------------------------------------------------------------


def record_of(meta: Mapping[str, Any]) -> JobRecord:
    """The public JobRecord in a job's metadata."""
    return from_dict(JobRecord, dict(meta))


def gpu_indices() -> Tuple[List[int], str]:
    """The GPU indices NVML sees, and why there are none when the list is empty."""
    from agents import nvml

    try:
        with nvml.GpuSampler() as sampler:
            found = [g.index for g in sampler.sample()]
    except nvml.NvmlUnavailable as exc:
        return [], exc.error.message
    return found, "" if found else "NVML lists no GPUs"


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment, else ``default``."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value > 0 else default


def iso_now() -> str:
    """Now, as ISO 8601 UTC with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def parse_iso(text: str) -> datetime:
    """An ISO 8601 time as aware UTC (naive means UTC; a trailing Z is accepted).
    Raises ValueError; an empty string is the earliest time."""
    if not text:
        return datetime.min.replace(tzinfo=timezone.utc)
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    moment = datetime.fromisoformat(raw)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def tail_lines(path: str, lines: int, max_chars: Optional[int] = None) -> str:
    """The last ``lines`` lines of a file (read from its end), at most ``max_chars`` long."""
    if lines <= 0:
        return ""
    block = 64 * 1024
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
        pos = end
        data = b""
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(block, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
            if max_chars is not None and len(data) > max_chars * 4:
                break
    text = data.decode("utf-8", "replace")
    kept = text.splitlines()[-lines:]
    out = "\n".join(kept)
    if text.endswith("\n") and kept:
        out += "\n"
    if max_chars is not None and len(out) > max_chars:
        out = out[-max_chars:]
    return out


def _check_request(request: RunRequest, environ: Mapping[str, str]) -> str:
    if not request.command:
        raise JobRequestError("no command given: put it after --, e.g. run -- python train.py")
    if not 0 <= request.retries <= MAX_RETRIES:
        raise JobRequestError(f"--retries must be between 0 and {MAX_RETRIES}")
    for key, _ in request.env:
        if not _ENV_NAME.match(key):
            raise JobRequestError(f"--env {key!r}: write it as NAME=VALUE")
        if key in _RESERVED_ENV:
            raise JobRequestError(f"--env {key}: the agent sets {key} itself")
    cwd = os.path.abspath(os.path.expanduser(request.cwd or os.getcwd()))
    if not os.path.isdir(cwd):
        raise JobRequestError(f"--cwd {cwd}: no such directory")
    program = request.command[0]
    path = dict(request.env).get("PATH", environ.get("PATH", os.defpath))
    if os.sep in program:
        target = program if os.path.isabs(program) else os.path.join(cwd, program)
        if not (os.path.isfile(target) and os.access(target, os.X_OK)):
            raise JobRequestError(f"{program}: not an executable file (from {cwd})")
    elif shutil.which(program, path=path) is None:
        raise JobRequestError(f"{program}: command not found on PATH")
    return cwd


def _launch_supervisor(store: JobStore, job_id: str) -> Tuple[int, Optional[int]]:
    """Start the job's supervisor in its own session, detached from this one (no terminal,
    no inherited descriptors), whether the agent runs as a zipapp or as a package."""
    import agents

    root = os.path.dirname(os.path.dirname(os.path.abspath(agents.__file__)))
    python = sys.executable or shutil.which("python3") or "python3"
    isolated = ["-I"] if sys.flags.isolated else []  # started as `python -I`: stay isolated
    argv = [python, *isolated, "-c", _BOOT, root, store.home, job_id]
    log = open(os.path.join(store.job_dir(job_id), "supervisor.log"), "ab")  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
            close_fds=True,
            start_new_session=True,
        )
    finally:
        log.close()
    _LAUNCHED.append(proc)  # keeps the handle alive: the child is meant to outlive it
    stat = proc_stat(proc.pid)
    return proc.pid, stat.start_ticks if stat is not None else None


def _await_final(store: JobStore, job_id: str, grace_s: float) -> JobRecord:
    """Wait for the supervisor to record a cancelled job's end; record it ourselves when the
    supervisor is gone."""
    deadline = time.monotonic() + max(2.0, grace_s) + 2.0
    while time.monotonic() < deadline:
        meta = store.read(job_id)
        if meta["state"] in FINAL_JOB_STATES:
            return record_of(meta)
        if not pid_alive(meta.get("supervisor_pid"), meta.get("supervisor_start")):
            break
        time.sleep(0.05)
    with store.locked():
        meta = store.read(job_id)
        if meta["state"] not in FINAL_JOB_STATES:
            if pid_alive(meta.get("supervisor_pid"), meta.get("supervisor_start")):
                return record_of(meta)  # still stopping; `jobs` shows the end
            meta.update(state="cancelled", finished_at=iso_now(), note="cancelled")
            store.finish(meta)
    return record_of(meta)


def _lost_summary(store: JobStore, meta: Mapping[str, Any], now: str) -> Optional[Dict[str, Any]]:
    if not meta.get("started_at"):
        return None
    duration = (parse_iso(now) - parse_iso(meta["started_at"])).total_seconds()
    path = store.log_path(meta["id"])
    log_tail = tail_lines(path, LOG_TAIL_LINES, LOG_TAIL_MAX_CHARS) if os.path.exists(path) else ""
    summary = JobSummary(
        duration_s=round(max(0.0, duration), 3),
        cpu_avg_pct=None,
        gpus=(),
        diagnoses=(),
        log_tail=log_tail,
    )
    from agents.protocol import to_dict

    return to_dict(summary)


def _safe_name(store: JobStore, job_id: str) -> Optional[str]:
    try:
        name = store.read(job_id).get("name")
    except JobError:
        return None
    return name if isinstance(name, str) else None


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _unlink_quietly(path: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)
