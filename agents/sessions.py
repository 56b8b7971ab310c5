"""A job's processes as ``/proc`` sees them: its session, its signals, its exited children.

Standard library only, Python 3.9, Linux. A job runs in its own session whose id is its first
process's pid; a process is told apart from a later one with the same pid by its start time
(clock ticks after boot). Durations in seconds.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import List, Optional, Tuple

_HAS_PROC = os.path.exists("/proc/self/stat")


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
