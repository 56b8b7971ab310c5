"""The supervisor of one job: waits for its turn and GPUs, runs every attempt, samples, sums up.

Started by ``gpu-agent run`` (agents.runner) in its own session, with no terminal, so it
outlives the SSH session. It makes itself the "child subreaper" of what the job starts, so
processes the job leaves behind can still be found, stopped and reaped. Standard library only,
Python 3.9, Linux.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from agents import diagnose, messages
from agents.gpu_queue import GpuWatch, busy_of, plan_starts, queue_of
from agents.jobstore import JobStore, iso_now, tail_lines
from agents.protocol import FINAL_JOB_STATES, JobNotFound, JobSummary, to_dict
from agents.runner import (
    DEFAULT_GRACE_S,
    DEFAULT_QUEUE_POLL_S,
    DEFAULT_SAMPLE_S,
    ENV_GRACE_S,
    ENV_QUEUE_POLL_S,
    ENV_SAMPLE_S,
    LOG_TAIL_LINES,
    LOG_TAIL_MAX_CHARS,
    env_seconds,
    note_fields,
    reap_lost,
)
from agents.sessions import (
    proc_stat,
    reap_children,
    session_members,
    signal_session,
    stop_session,
)

_PR_SET_CHILD_SUBREAPER = 36
_LOG_SCAN_BYTES = 256 * 1024


def main(argv: Sequence[str]) -> int:
    """``<home> <job id>``: supervise that job to its end. Returns 0, or 1 on an internal error
    (recorded in the job as ``failed``)."""
    if len(argv) != 2:
        sys.stderr.write("usage: supervisor HOME JOB_ID\n")
        return 2
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    store = JobStore(argv[0])
    supervisor = Supervisor(store, argv[1])
    try:
        supervisor.run()
    except Exception as exc:  # noqa: BLE001 - recorded in the job, not lost in a dead process
        traceback.print_exc()
        supervisor.fail(
            note_fields(messages.NOTE_SUPERVISOR_CRASHED, error=f"{type(exc).__name__}: {exc}")
        )
        return 1
    return 0


class Supervisor:
    """Runs one job: queue wait, attempts with retries, sampling, cancel, the final summary."""

    def __init__(self, store: JobStore, job_id: str) -> None:
        self.store = store
        self.job_id = job_id
        self.sample_s = env_seconds(ENV_SAMPLE_S, DEFAULT_SAMPLE_S)
        self.grace_s = env_seconds(ENV_GRACE_S, DEFAULT_GRACE_S)
        self.queue_poll_s = env_seconds(ENV_QUEUE_POLL_S, DEFAULT_QUEUE_POLL_S)
        self.tick_s = min(0.25, self.sample_s)
        self.series = diagnose.SampleSeries()
        self.mem_total: Dict[int, Optional[int]] = {}
        self.cpu_s = 0.0
        self.started_mono: Optional[float] = None
        self.gpus: Tuple[int, ...] = ()

    def run(self) -> None:
        """Supervise the job from queued to a final state."""
        _become_subreaper()
        gpus = self._wait_for_turn()
        if gpus is None:
            return
        self.gpus = gpus
        self.started_mono = time.monotonic()
        meta = self._read()
        attempts = int(meta.get("retries", 0)) + 1
        exit_code: Optional[int] = None
        note: Dict[str, Any] = {}
        outcome = "failed"
        with _Sampler(self) as sampler:
            for attempt in range(1, attempts + 1):
                if attempt > 1:
                    self._log_line(
                        f"--- gpu-agent: attempt {attempt} of {attempts} "
                        f"(attempt {attempt - 1} exited with {exit_code}) ---"
                    )
                exit_code, note, outcome = self._attempt(attempt, sampler)
                if outcome in ("cancelled", "succeeded", "not_started"):
                    break
        state = {"cancelled": "cancelled", "succeeded": "succeeded"}.get(outcome, "failed")
        self._finish(state, exit_code, note)

    def fail(self, note: Mapping[str, Any]) -> None:
        """Record the job as failed after an internal error (best effort); ``note`` is
        :func:`agents.runner.note_fields`."""
        try:
            with self.store.locked():
                meta = self.store.read(self.job_id)
                if meta.get("state") in FINAL_JOB_STATES:
                    return
                meta.update(state="failed", finished_at=iso_now(), **note)
                self.store.finish(meta)
        except Exception:  # noqa: BLE001 - nothing more can be done
            traceback.print_exc()

    # --- waiting -------------------------------------------------------------------------

    def _wait_for_turn(self) -> Optional[Tuple[int, ...]]:
        """Wait (FIFO) until this job may start; returns its GPUs, or None when it must not
        run (cancelled while queued, declared lost, or no GPU visible for a GPU job). A job
        that asks for any N GPUs gets only GPUs nothing else uses (gpu_queue.gpu_in_use),
        looked at again before every look at the queue."""
        if not int(self._read().get("want_count", 0)):
            return self._wait_with(None)
        from agents import nvml

        try:
            watch = GpuWatch().__enter__()
        except nvml.NvmlUnavailable as exc:
            self.fail(note_fields(messages.NOTE_NO_GPU_VISIBLE, error=exc.error.message))
            return None
        try:
            return self._wait_with(watch)
        finally:
            watch.__exit__(None, None, None)

    def _wait_with(self, watch: Optional[GpuWatch]) -> Optional[Tuple[int, ...]]:
        while True:
            inventory: List[int] = []
            in_use: Set[int] = set()
            if watch is not None:
                inventory, in_use = watch.look()  # outside the lock: NVML can be slow
                if not inventory:
                    self.fail(note_fields(messages.NOTE_NO_GPU_LISTED))
                    return None
            with self.store.locked():
                meta = self.store.read(self.job_id)
                if meta.get("supervisor_pid") != os.getpid() or meta.get("state") != "queued":
                    return None  # cancelled while queued, or declared lost
                reap_lost(self.store)
                active = self.store.active_metas()
                plan = plan_starts(queue_of(active), inventory, busy_of(active), in_use)
                if self.job_id in plan:
                    gpus = plan[self.job_id]
                    meta.update(
                        state="running",
                        gpus_assigned=list(gpus),
                        started_at=iso_now(),
                        gpus_in_use=[],
                    )
                    self.store.write(meta)
                    return gpus
            time.sleep(self.queue_poll_s)

    # --- one attempt ---------------------------------------------------------------------

    def _attempt(
        self, attempt: int, sampler: _Sampler
    ) -> Tuple[Optional[int], Dict[str, Any], str]:
        """Run the command once: (exit code, note, outcome) with outcome one of succeeded,
        failed, cancelled, not_started."""
        meta = self._read()
        env = self._job_env(meta, attempt)
        with self.store.locked():
            meta = self.store.read(self.job_id)
            if meta.get("cancel_requested_at"):
                return None, note_fields(messages.NOTE_CANCELLED_BEFORE_START), "cancelled"
            try:
                with open(self.store.log_path(self.job_id), "ab") as log:
                    proc = subprocess.Popen(
                        meta["command"],
                        cwd=meta.get("cwd") or None,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        close_fds=True,
                        start_new_session=True,
                    )
            except OSError as exc:
                note = note_fields(
                    messages.NOTE_NOT_STARTED,
                    program=repr(meta["command"][0]),
                    error=exc.strerror or exc,
                )
                self._log_line(f"gpu-agent: {note['note']}")
                return (127 if isinstance(exc, FileNotFoundError) else 126), note, "not_started"
            stat = proc_stat(proc.pid)
            start = stat.start_ticks if stat is not None else None
            meta.update(job_pid=proc.pid, job_start=start, attempt=attempt)
            self.store.write(meta)
        status = self._watch(proc.pid, start, sampler)
        proc.returncode = _exit_code(status)  # reaped here with wait4, not by Popen
        stop_session(proc.pid, start, self.grace_s, reap=True)
        self._collect(reap_children(), proc.pid)
        if self._read().get("cancel_requested_at"):
            return _exit_code(status), note_fields(messages.NOTE_CANCELLED), "cancelled"
        code = _exit_code(status)
        return code, _signal_note(status), "succeeded" if code == 0 else "failed"

    def _watch(self, pid: int, start: Optional[int], sampler: _Sampler) -> int:
        """Wait for the job's first process to exit while sampling and honouring a cancel;
        returns its wait status."""
        next_sample = time.monotonic()
        kill_at: Optional[float] = None
        while True:
            status = self._collect(reap_children(), pid)
            if status is not None:
                return status
            now = time.monotonic()
            if now >= next_sample:
                sampler.sample(pid, start)
                next_sample = now + self.sample_s
            if kill_at is None and self._read().get("cancel_requested_at"):
                signal_session(pid, start, signal.SIGTERM)
                kill_at = now + self.grace_s
            elif kill_at is not None and now >= kill_at:
                signal_session(pid, start, signal.SIGKILL)
                kill_at = now + 3600.0
            time.sleep(self.tick_s)

    def _collect(self, reaped: List[Tuple[int, int, float]], leader: int) -> Optional[int]:
        status = None
        for pid, wait_status, cpu_s in reaped:
            self.cpu_s += cpu_s
            if pid == leader:
                status = wait_status
        return status

    # --- the end -------------------------------------------------------------------------

    def _finish(self, state: str, exit_code: Optional[int], note: Mapping[str, Any]) -> None:
        summary = self._summary()
        with self.store.locked():
            meta = self.store.read(self.job_id)
            if meta.get("state") in FINAL_JOB_STATES:
                return
            meta.update(
                state=state,
                exit_code=exit_code,
                finished_at=iso_now(),
                **(note or {"note": None}),
                summary=to_dict(summary),
            )
            self.store.finish(meta)

    def _summary(self) -> JobSummary:
        duration = time.monotonic() - (self.started_mono or time.monotonic())
        cpu_avg = round(self.cpu_s / duration * 100.0, 1) if duration > 0 else None
        samples = self.series.samples()
        log_path = self.store.log_path(self.job_id)
        log_tail = ""
        log_scan = ""
        if os.path.exists(log_path):
            log_tail = tail_lines(log_path, LOG_TAIL_LINES, LOG_TAIL_MAX_CHARS)
            log_scan = _read_end(log_path, _LOG_SCAN_BYTES)
        return JobSummary(
            duration_s=round(duration, 3),
            cpu_avg_pct=cpu_avg,
            gpus=diagnose.gpu_stats(samples, self.gpus),
            diagnoses=diagnose.diagnose(samples, self.gpus, self.mem_total, cpu_avg, log_scan),
            log_tail=log_tail,
        )

    # --- helpers -------------------------------------------------------------------------

    def _read(self) -> Dict[str, Any]:
        try:
            return self.store.read(self.job_id)
        except JobNotFound:
            return {}

    def _job_env(self, meta: Dict[str, Any], attempt: int) -> Dict[str, str]:
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (meta.get("env") or {}).items()})
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbers GPUs as NVML does
        env["GPUBOT_JOB_ID"] = self.job_id
        env["GPUBOT_JOB_DIR"] = self.store.job_dir(self.job_id)
        env["GPUBOT_ATTEMPT"] = str(attempt)
        return env

    def _log_line(self, text: str) -> None:
        with open(self.store.log_path(self.job_id), "ab") as log:
            log.write(text.encode("utf-8") + b"\n")


class _Sampler:
    """Samples the job's GPUs (NVML kept open) and its session's CPU use."""

    def __init__(self, owner: Supervisor) -> None:
        self.owner = owner
        self._nvml: Any = None
        self._t0 = time.monotonic()
        self._last: Optional[Tuple[float, int]] = None
        self._ticks_per_s = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0

    def __enter__(self) -> _Sampler:
        if self.owner.gpus:
            from agents import nvml

            sampler = nvml.GpuSampler()
            try:
                self._nvml = sampler.__enter__()
            except nvml.NvmlUnavailable:
                self._nvml = None
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._nvml is not None:
            self._nvml.__exit__(None, None, None)
            self._nvml = None

    def sample(self, sid: int, start: Optional[int]) -> None:
        """Add one sample of the job's session ``sid`` to the owner's series."""
        now = time.monotonic()
        ticks = sum(m.cpu_ticks for m in session_members(sid, start))
        cpu_pct: Optional[float] = None
        if self._last is not None and now > self._last[0]:
            delta = max(0, ticks - self._last[1]) / self._ticks_per_s
            cpu_pct = round(delta / (now - self._last[0]) * 100.0, 1)
        self._last = (now, ticks)
        self.owner.series.add(
            diagnose.Sample(t_s=now - self._t0, cpu_pct=cpu_pct, gpus=self._gpu_points())
        )

    def _gpu_points(self) -> Tuple[diagnose.GpuPoint, ...]:
        wanted = set(self.owner.gpus)
        if not wanted or self._nvml is None:
            return ()
        try:
            snapshots = self._nvml.sample()
        except Exception:  # noqa: BLE001 - a failed sample is a gap, not the job's end
            return ()
        points = []
        for gpu in snapshots:
            if gpu.index not in wanted:
                continue
            self.owner.mem_total[gpu.index] = gpu.mem_total_bytes
            points.append(
                diagnose.GpuPoint(
                    index=gpu.index,
                    util_pct=None if gpu.util_gpu_pct is None else float(gpu.util_gpu_pct),
                    mem_used_bytes=gpu.mem_used_bytes,
                )
            )
        return tuple(points)


def _exit_code(status: int) -> int:
    """A wait status as a shell would report it: the exit code, or 128 + the signal number."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 255


def _signal_note(status: int) -> Dict[str, Any]:
    """The note of a job killed by a signal (:func:`agents.runner.note_fields`); {} else."""
    if not os.WIFSIGNALED(status):
        return {}
    signum = os.WTERMSIG(status)
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return note_fields(messages.NOTE_KILLED_BY, signal=name)


def _become_subreaper() -> None:
    """Orphans of the job get this process as parent (Linux); silently skipped elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _read_end(path: str, size: int) -> str:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - size))
        return fh.read().decode("utf-8", "replace")
