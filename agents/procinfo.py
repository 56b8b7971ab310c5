"""GPU processes as ``/proc`` sees them: CPU use, resident memory and age.

Standard library only and cheap to import: ``gpu-agent status`` joins these into its process
list. Linux only; where ``/proc/<pid>`` cannot be read (another container's process, another
system) every value is None.

CPU use needs two looks: :func:`join` reads each process's CPU time, waits until the window
(``GPU_AGENT_CPU_WINDOW_S`` seconds, default 0.2) has passed, and reads it again. 100 % is one
CPU core kept busy, as top and nvitop count it.
"""

from __future__ import annotations

import os
import time

# ``typing`` is needed by type checkers only: not importing it keeps the agent's start fast.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

#: Environment variable: seconds over which status measures a process's CPU use.
ENV_CPU_WINDOW_S = "GPU_AGENT_CPU_WINDOW_S"
DEFAULT_CPU_WINDOW_S = 0.2
#: The longest window the variable may ask for, in seconds.
MAX_CPU_WINDOW_S = 5.0


def join(
    processes: List[Dict[str, Any]],
    *,
    window_s: Optional[float] = None,
    proc: str = "/proc",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Fill ``cpu_pct``, ``rss_bytes`` and ``elapsed_s`` of status process documents in place.

    ``window_s`` defaults to :func:`cpu_window_s`; ``proc`` is the /proc to read, ``clock``
    and ``sleep`` measure and wait out the window (tests pass their own).
    """
    pids = sorted({int(p["pid"]) for p in processes})
    found = sample(pids, window_s=window_s, proc=proc, clock=clock, sleep=sleep)
    for doc in processes:
        values = found.get(int(doc["pid"]))
        if values is not None:
            doc.update(values)


def sample(
    pids: Iterable[int],
    *,
    window_s: Optional[float] = None,
    proc: str = "/proc",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Dict[int, Dict[str, Any]]:
    """pid -> ``{"cpu_pct", "rss_bytes", "elapsed_s"}`` for each pid still readable at the end
    of the window; pids that cannot be read are left out."""
    window = cpu_window_s() if window_s is None else max(0.0, window_s)
    wanted = list(pids)
    began = clock()
    first = {pid: read_stat(pid, proc) for pid in wanted}
    left = window - (clock() - began)
    if left > 0 and any(v is not None for v in first.values()):
        sleep(left)
    ended = clock()
    spent = ended - began
    hz, page, uptime = _clock_ticks(), _page_size(), _uptime_s(proc)
    out: Dict[int, Dict[str, Any]] = {}
    for pid in wanted:
        second = read_stat(pid, proc)
        if second is None:
            continue
        before = first.get(pid)
        cpu: Optional[float] = None
        if before is not None and before[1] == second[1] and spent > 0:
            cpu = round(max(0, second[0] - before[0]) / hz / spent * 100.0, 1)
        rss = _rss_pages(pid, proc)
        out[pid] = {
            "cpu_pct": cpu,
            "rss_bytes": None if rss is None else rss * page,
            "elapsed_s": None if uptime is None else round(max(0.0, uptime - second[1] / hz), 1),
        }
    return out


def cpu_window_s() -> float:
    """The CPU window from GPU_AGENT_CPU_WINDOW_S (0 to MAX_CPU_WINDOW_S), else the default."""
    raw = os.environ.get(ENV_CPU_WINDOW_S)
    if not raw:
        return DEFAULT_CPU_WINDOW_S
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_CPU_WINDOW_S
    if value != value or value < 0:
        return DEFAULT_CPU_WINDOW_S
    return min(value, MAX_CPU_WINDOW_S)


def read_stat(pid: int, proc: str = "/proc") -> Optional[Tuple[int, int]]:
    """(CPU ticks used by the process itself, its start time in ticks after boot) from
    ``proc``/<pid>/stat; None when it cannot be read or parsed."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    try:
        rest = raw[raw.rindex(")") + 2 :].split()
        # Fields after the command: state(3) ... utime(14) stime(15) ... starttime(22).
        return int(rest[11]) + int(rest[12]), int(rest[19])
    except (ValueError, IndexError):
        return None


def _rss_pages(pid: int, proc: str) -> Optional[int]:
    try:
        with open(f"{proc}/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _uptime_s(proc: str) -> Optional[float]:
    try:
        with open(f"{proc}/uptime", "rb") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (AttributeError, ValueError, OSError):
        return 100


def _page_size() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) or 4096
    except (AttributeError, ValueError, OSError):
        return 4096
