"""Detached jobs on the instance: submit, list, log, cancel, lost jobs and ``who``.

Standard library only, Python 3.9, Linux (``/proc``). The jobs' state files are in
:mod:`agents.jobstore`, their processes in :mod:`agents.sessions` and the GPU queue in
:mod:`agents.gpu_queue`. Every job has a supervisor process (agents.supervisor) in its own
session, so it outlives the SSH session that submitted it. A supervisor whose process is gone
(checked by pid and start time, so a reused pid is not mistaken for it) is noticed by the next
command: its job becomes ``lost`` and stops holding GPUs. Times are ISO 8601 UTC strings;
durations in seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from agents import messages
from agents.gpu_queue import (
    busy_of,
    gpu_in_use,
    gpu_indices,
    plan_starts,
    queue_of,
    reservations,
    resolve_request,
)
from agents.jobstore import JobStore, iso_now, parse_iso, record_of, tail_lines
from agents.protocol import (
    FINAL_JOB_STATES,
    GpuRequest,
    JobError,
    JobList,
    JobRecord,
    JobRequestError,
    JobSummary,
    NvmlError,
    StatusSnapshot,
    WhoGpu,
    WhoJob,
    WhoReport,
    dumps,
    to_dict,
)
from agents.sessions import (
    pid_alive,
    proc_stat,
    process_user,
    signal_session,
    stop_session,
    user_name,
)

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
_LAUNCHED: List[subprocess.Popen] = []  # type: ignore[type-arg]


@dataclass(frozen=True)
class RunRequest:
    """``gpu-agent run``: the command as argv (never given to a shell) and its options."""

    command: Tuple[str, ...]
    gpus: GpuRequest = field(default_factory=GpuRequest)
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
    The record's ``gpus_requested`` is the request as ``--gpus`` writes it, the default
    resolved (``any:1``, or ``none`` where no GPU can be used). A request for any N GPUs
    that cannot start at once records what holds each GPU it cannot have (``gpus_in_use``).
    Raises JobRequestError for a bad request, JobError when it cannot be queued.
    """
    environ = os.environ if environ is None else environ
    cwd = _check_request(request, environ)
    gpus = request.gpus
    snapshot: Optional[StatusSnapshot] = None
    if gpus.count != 0:
        if available_gpus is not None:
            found, why = list(available_gpus), ""
        elif gpus.count > 0 and not gpus.indices:
            # Any N: one look at the GPUs and their processes also says who holds them.
            snapshot, found, why = _look_at_gpus()
        else:
            found, why = gpu_indices()
        gpus = resolve_request(gpus, found, why)
    # The default is recorded as what it became: any:1, or none on a machine without GPUs.
    requested = gpus.text if request.gpus.auto else request.gpus.text
    meta: Dict[str, Any] = {
        "name": request.name,
        "state": "queued",
        "command": list(request.command),
        "user": user_name(),
        "gpus_requested": requested,
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
        if snapshot is not None and gpus.count > 0:
            meta["gpus_in_use"] = _blocking_gpus(store, snapshot, job_id)
        try:
            pid, start = _launch_supervisor(store, job_id)
        except OSError as exc:
            meta.update(
                state="failed",
                finished_at=iso_now(),
                **note_fields(messages.NOTE_SUPERVISOR_FAILED, error=exc),
            )
            store.finish(meta)
            raise JobError.said("supervisor_failed", messages.SUPERVISOR_FAILED, error=exc) from exc
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
            raise JobError.said(
                "job_finished", messages.JOB_FINISHED, job=job_id, state=meta["state"]
            )
        meta["cancel_requested_at"] = iso_now()
        meta["cancel_requested_by"] = by or user_name()
        if meta["state"] == "queued":
            meta.update(
                state="cancelled",
                finished_at=iso_now(),
                **note_fields(messages.NOTE_CANCELLED_QUEUED),
            )
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
        raise nvml_failure(snapshot.nvml_error)
    with store.locked():
        reap_lost(store)
        active = store.active_metas()
    gpus, waiting_any = who_gpus(store, snapshot, active)
    return WhoReport(gpus=gpus, waiting_any=waiting_any)


def who_gpus(
    store: JobStore, snapshot: StatusSnapshot, active: Sequence[Mapping[str, Any]]
) -> Tuple[Tuple[WhoGpu, ...], Tuple[WhoJob, ...]]:
    """Every GPU of ``snapshot`` as ``who`` shows it, with the reservations of the unfinished
    jobs ``active`` and whether a new job may have it (``free_for_jobs``); and the queued jobs
    that asked for a count of GPUs. Reads ``/proc``, takes no lock."""
    owners = jobs_of_pids(store, [p.pid for p in snapshot.processes], active)
    held, waiting, waiting_any = reservations(active)
    gpus = []
    for gpu in snapshot.gpus:
        procs = tuple(
            replace(p, user=p.user or process_user(p.pid), job_id=owners.get(p.pid))
            for p in snapshot.processes
            if p.gpu_index == gpu.index
        )
        used = gpu_in_use(gpu.mem_used_bytes, gpu.util_gpu_pct, [p.used_mem_bytes for p in procs])
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
                free_for_jobs=held.get(gpu.index) is None and not used,
            )
        )
    return tuple(gpus), tuple(waiting_any)


def _look_at_gpus() -> Tuple[Optional[StatusSnapshot], List[int], str]:
    """One status snapshot (None when NVML failed), the GPU indices in it, and why there are
    none when the list is empty."""
    from agents import nvml

    snapshot = nvml.collect_status()
    found = [g.index for g in snapshot.gpus]
    if found:
        return snapshot, found, ""
    why = snapshot.nvml_error.message if snapshot.nvml_error is not None else "NVML lists no GPUs"
    return None, found, why


def _blocking_gpus(store: JobStore, snapshot: StatusSnapshot, job_id: str) -> List[Dict[str, Any]]:
    """When job ``job_id`` (just queued, for any N GPUs) cannot start now: every GPU it cannot
    have, as ``who`` shows it without command lines or queued jobs; [] when it can start.
    Call with the store locked."""
    active = store.active_metas()
    in_use = {
        g.index
        for g in snapshot.gpus
        if gpu_in_use(
            g.mem_used_bytes,
            g.util_gpu_pct,
            [p.used_mem_bytes for p in snapshot.processes if p.gpu_index == g.index],
        )
    }
    inventory = [g.index for g in snapshot.gpus]
    if job_id in plan_starts(queue_of(active), inventory, busy_of(active), in_use):
        return []
    gpus, _ = who_gpus(store, snapshot, active)
    shown = [
        replace(gpu, processes=tuple(replace(p, command=None) for p in gpu.processes), waiting=())
        for gpu in gpus
        if not gpu.free
    ]
    return [json.loads(dumps(gpu)) for gpu in shown]  # as JSON has it: lists, not tuples


def nvml_failure(error: NvmlError) -> JobError:
    """Why this machine's GPUs cannot be read (code ``nvml_failed``), leading with what it
    means ("No NVIDIA driver on this machine ...") and ending with what to do (the NVML
    error's hint); short enough for the bot to show whole (under 600 characters)."""
    if error.code == "library_not_found" and "pynvml" not in error.message:
        template = messages.NVML_NO_DRIVER
    elif error.code == "driver_not_loaded":
        template = messages.NVML_NOT_LOADED
    else:
        template = messages.NVML_FAILED
    return JobError.said(
        "nvml_failed",
        template,
        sentence=True,
        name=messages.THIS_MACHINE,
        code=error.code,
        error=error.message,
        hint=error.hint,
    )


def note_fields(template: str, **params: Any) -> Dict[str, Any]:
    """A job's note as its metadata holds it: the English (``note``) and what it was made of
    (``note_template``, ``note_params``)."""
    values = messages.params_of(**params)
    return {
        "note": messages.english(template, values),
        "note_template": template,
        "note_params": values,
    }


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

        owners = runner.jobs_of_pids(jobstore.JobStore.from_env(), [p.pid for p in procs])
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
        meta.update(state="lost", finished_at=now, **note_fields(messages.NOTE_SUPERVISOR_GONE))
        meta["summary"] = _lost_summary(store, meta, now)
        store.finish(meta)
        lost.append(meta["id"])
    return lost


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


def _check_request(request: RunRequest, environ: Mapping[str, str]) -> str:
    if not request.command:
        raise JobRequestError.said("no_command", messages.NO_COMMAND)
    if not 0 <= request.retries <= MAX_RETRIES:
        raise JobRequestError.said("retries_range", messages.RETRIES_RANGE, most=MAX_RETRIES)
    for key, _ in request.env:
        if not _ENV_NAME.match(key):
            raise JobRequestError.said("env_form", messages.ENV_FORM, item=repr(key))
        if key in _RESERVED_ENV:
            raise JobRequestError.said("env_reserved", messages.ENV_RESERVED, key=key)
    cwd = os.path.abspath(os.path.expanduser(request.cwd or os.getcwd()))
    if not os.path.isdir(cwd):
        raise JobRequestError.said("cwd_missing", messages.CWD_MISSING, path=cwd)
    program = request.command[0]
    path = dict(request.env).get("PATH", environ.get("PATH", os.defpath))
    if os.sep in program:
        target = program if os.path.isabs(program) else os.path.join(cwd, program)
        if not (os.path.isfile(target) and os.access(target, os.X_OK)):
            raise JobRequestError.said(
                "not_executable", messages.NOT_EXECUTABLE, program=program, path=cwd
            )
    elif shutil.which(program, path=path) is None:
        raise JobRequestError.said("command_not_found", messages.COMMAND_NOT_FOUND, program=program)
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
            meta.update(
                state="cancelled", finished_at=iso_now(), **note_fields(messages.NOTE_CANCELLED)
            )
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
    return to_dict(summary)
