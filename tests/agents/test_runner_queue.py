"""Lost jobs: a job whose supervisor is gone (or whose pid was reused) is marked lost."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from agents import jobstore, runner, sessions
from agents.jobstore import JobStore


def test_reap_lost_marks_jobs_without_a_live_supervisor(tmp_path: Path):
    store = JobStore(str(tmp_path / "home"))
    dead = subprocess.Popen(["true"])
    dead.wait()
    me = sessions.proc_stat(os.getpid())
    with store.locked():
        orphan = store.create({"state": "queued", "supervisor_pid": None})
        gone = store.create(
            {"state": "running", "supervisor_pid": dead.pid, "started_at": jobstore.iso_now()}
        )
        alive = store.create(
            {"state": "queued", "supervisor_pid": os.getpid(), "supervisor_start": me.start_ticks}
        )
        reused = store.create(
            {
                "state": "queued",
                "supervisor_pid": os.getpid(),
                "supervisor_start": me.start_ticks - 1,
            }
        )
        assert sorted(runner.reap_lost(store)) == sorted([orphan, gone, reused])
        assert runner.reap_lost(store) == []
    assert store.read(alive)["state"] == "queued"
    assert [m["id"] for m in store.active_metas()] == [alive]
    lost = store.read(gone)
    assert lost["state"] == "lost"
    assert lost["finished_at"]
    assert lost["summary"]["duration_s"] >= 0
    assert lost["summary"]["log_tail"] == ""
    assert store.read(orphan)["summary"] is None
