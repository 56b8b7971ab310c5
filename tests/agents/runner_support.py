"""Driving the real ``gpu-agent`` job commands in subprocesses, for the runner tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agents import protocol
from agents.jobstore import JobStore
from agents.protocol import FINAL_JOB_STATES, JobList, JobRecord
from agents.sessions import session_members

REPO = Path(__file__).resolve().parents[2]

#: Fast timings for tests: sampling, queue polling and the cancel grace period, in seconds.
FAST_ENV = {
    "GPU_AGENT_SAMPLE_S": "0.1",
    "GPU_AGENT_QUEUE_POLL_S": "0.05",
    "GPU_AGENT_CANCEL_GRACE_S": "0.5",
}


class Agent:
    """One GPU_AGENT_HOME and the environment the agent's subprocesses run with."""

    def __init__(self, home: Path, env: Mapping[str, str]) -> None:
        self.home = home
        self.env = dict(env)
        self.store = JobStore(str(home))

    def cli(
        self, *args: str, timeout: float = 30, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``python -m agents ARGS`` as a separate process."""
        return subprocess.run(
            [sys.executable, "-m", "agents", *args],
            env=dict(env or self.env),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=str(REPO),
            check=False,
        )

    def submit(self, *command: str, options: Sequence[str] = ()) -> JobRecord:
        """``run --json OPTIONS -- COMMAND``; fails the test unless it queued."""
        done = self.cli("run", "--json", *options, "--", *command)
        assert done.returncode == 0, done.stderr
        return protocol.loads(JobRecord, done.stdout)

    def jobs(self, *args: str) -> JobList:
        done = self.cli("jobs", "--json", *args)
        assert done.returncode == 0, done.stderr
        return protocol.loads(JobList, done.stdout)

    def meta(self, job_id: str) -> dict[str, Any]:
        return self.store.read(job_id)

    def wait(
        self, job_id: str, states: Sequence[str] = tuple(FINAL_JOB_STATES), timeout: float = 20
    ):
        """Poll the job's metadata until its state is one of ``states``; returns the record."""
        deadline = time.monotonic() + timeout
        while True:
            meta = self.meta(job_id)
            if meta["state"] in states:
                return protocol.from_dict(JobRecord, meta)
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {meta['state']} after {timeout}s")
            time.sleep(0.05)

    def running(self, job_id: str, timeout: float = 20) -> dict[str, Any]:
        """Wait until the job's command has started; returns its metadata (with ``job_pid``)."""
        deadline = time.monotonic() + timeout
        while True:
            meta = self.meta(job_id)
            if meta["state"] == "running" and meta.get("job_pid"):
                return meta
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} not started after {timeout}s: {meta['state']}")
            time.sleep(0.05)

    def cleanup(self) -> None:
        """Kill whatever a failed test left running: supervisors and job sessions."""
        for job_id in self.store.all_ids():
            try:
                meta = json.loads((self.home / "jobs" / job_id / "meta.json").read_text())
            except (OSError, ValueError):
                continue
            if meta.get("state") in FINAL_JOB_STATES:
                continue
            for pid in (meta.get("supervisor_pid"),):
                if pid:
                    _kill(pid)
            for member in session_members(meta.get("job_pid"), meta.get("job_start")):
                _kill(member.pid)


def make_agent(tmp_path: Path, env: Mapping[str, str] | None = None) -> Agent:
    """An agent with its own home under ``tmp_path`` and fast timings."""
    home = tmp_path / "agent-home"
    merged = dict(os.environ if env is None else env)
    merged.update(FAST_ENV)
    merged["GPU_AGENT_HOME"] = str(home)
    path = merged.get("PYTHONPATH", "")
    if str(REPO) not in path.split(os.pathsep):
        merged["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), path) if p)
    return Agent(home, merged)


def fake_gpu_zipapp(out: Path) -> Path:
    """The agent zipapp with the fake pynvml vendored in place of nvidia-ml-py's, so an agent
    run with ``python -I`` reports the GPUs the test configures (GPUBOT_FAKE_NVML)."""
    import io
    import zipapp
    import zipfile

    from agents.zipapp import collect_entries
    from tests.fixtures.fake_nvml import FAKE_DIR

    entries = collect_entries()
    entries["pynvml.py"] = (FAKE_DIR / "pynvml.py").read_bytes()
    payload = io.BytesIO()
    with zipfile.ZipFile(payload, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries):
            archive.writestr(name, entries[name])
    payload.seek(0)
    zipapp.create_archive(payload, out, interpreter="/usr/bin/env python3")
    return out


def python_job(code: str, *args: str) -> list[str]:
    """A job command running ``code`` in this test's Python."""
    return [sys.executable, "-c", code, *args]


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (exited, or a zombie awaiting its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().decode().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
