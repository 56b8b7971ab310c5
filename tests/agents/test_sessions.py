"""A job's processes from /proc: this process, odd names, a session stopped whole."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from agents import sessions


def test_proc_stat_of_this_process():
    me = sessions.proc_stat(os.getpid())
    assert me is not None
    assert me.running
    assert me.ppid == os.getppid()
    assert me.session == os.getsid(0)
    assert me.pgrp == os.getpgrp()
    assert sessions.pid_alive(os.getpid(), me.start_ticks)
    assert not sessions.pid_alive(os.getpid(), me.start_ticks + 1)  # a reused pid is not ours
    assert not sessions.pid_alive(None, None)


def test_proc_stat_parses_names_with_spaces_and_parentheses(tmp_path: Path):
    odd = tmp_path / "odd) name ("
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "5"])
    try:
        stat = sessions.proc_stat(proc.pid)
        assert stat is not None
        assert stat.ppid == os.getpid()
    finally:
        proc.kill()
        proc.wait()
    assert sessions.proc_stat(proc.pid) is None


def test_session_members_and_stop_session():
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    try:
        start = sessions.proc_stat(proc.pid).start_ticks
        for _ in range(100):
            if len(sessions.session_members(proc.pid, start)) == 3:
                break
            threading.Event().wait(0.02)
        assert len(sessions.session_members(proc.pid, start)) == 3
        assert sessions.session_members(proc.pid, start + 1) == []  # leader pid reused: not ours
        sessions.stop_session(proc.pid, start, grace_s=2.0)
        proc.wait(timeout=5)
        assert sessions.session_members(proc.pid, start) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
