"""Facts about the machine the agent runs on (standard library only, Linux first).

Everything that cannot be read is None or False rather than an error.
"""

from __future__ import annotations

import os
import sys

from agents import __version__

# ``typing`` is needed by type checkers only: not importing it keeps the agent's start fast.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional

    from agents.protocol import HostInfo


def collect_host(proc: str = "/proc", root: str = "/") -> HostInfo:
    """The host: name, OS, kernel, Python, agent version, CPUs, memory, uptime, container, WSL.

    ``proc`` and ``root`` point at the /proc and / to read (tests pass temporary directories).
    """
    from agents.protocol import HostInfo

    return HostInfo(**host_document(proc, root))


def host_document(proc: str = "/proc", root: str = "/") -> Dict[str, Any]:
    """:func:`collect_host` as the plain ``host`` document of a status (no dataclasses loaded)."""
    uname = os.uname()
    return {
        "hostname": uname.nodename,
        "os": os_name(os.path.join(root, "etc/os-release"), default=uname.sysname),
        "kernel": uname.release,
        "python_version": python_version(),
        "agent_version": __version__,
        "cpu_count": cpu_count(),
        "mem_total_bytes": mem_total_bytes(os.path.join(proc, "meminfo")),
        "uptime_s": uptime_s(os.path.join(proc, "uptime")),
        "in_container": in_container(proc, root),
        "is_wsl": is_wsl(os.path.join(proc, "version")),
    }


def os_name(os_release: str = "/etc/os-release", default: str = "Linux") -> str:
    """PRETTY_NAME from os-release, e.g. "Ubuntu 22.04.4 LTS"; else ``default``."""
    text = _read(os_release)
    for line in (text or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PRETTY_NAME" and value.strip():
            return value.strip().strip("\"'")
    return default


def python_version() -> str:
    """This interpreter's version, e.g. "3.11.7" (cheaper than importing platform)."""
    major, minor, micro, level, serial = sys.version_info
    suffix = "" if level == "final" else f"{level[0]}{serial}".replace("c", "rc")
    return f"{major}.{minor}.{micro}{suffix}"


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, as a container's cpuset limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def mem_total_bytes(meminfo: str = "/proc/meminfo") -> Optional[int]:
    """MemTotal from /proc/meminfo in bytes (the file gives kB), or None."""
    for line in (_read(meminfo) or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            try:
                return int(parts[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


def uptime_s(uptime: str = "/proc/uptime") -> Optional[float]:
    """Seconds since boot from /proc/uptime, or None."""
    text = _read(uptime)
    if not text:
        return None
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def in_container(proc: str = "/proc", root: str = "/") -> bool:
    """Heuristics: /.dockerenv, /run/.containerenv, a container name in PID 1's cgroup or env."""
    for marker in (".dockerenv", "run/.containerenv"):
        if os.path.exists(os.path.join(root, marker)):
            return True
    cgroup = _read(os.path.join(proc, "1/cgroup")) or ""
    if any(word in cgroup for word in ("docker", "kubepods", "containerd", "lxc", "libpod")):
        return True
    environ = _read(os.path.join(proc, "1/environ")) or ""
    return "container=" in environ


def is_wsl(version: str = "/proc/version") -> bool:
    """Whether this is Windows Subsystem for Linux (/proc/version mentions Microsoft)."""
    return "microsoft" in (_read(version) or "").lower()


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(65536)
    except OSError:
        return None
