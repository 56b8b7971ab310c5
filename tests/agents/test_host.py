"""agents.host: facts about the machine, read from /proc and /etc (temporary copies here)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from agents import __version__, host


def _tree(tmp_path: Path, files: dict[str, str]) -> tuple[str, str]:
    proc = tmp_path / "proc"
    root = tmp_path / "root"
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    proc.mkdir(exist_ok=True)
    root.mkdir(exist_ok=True)
    return str(proc), str(root)


def test_reads_a_bare_metal_linux_host(tmp_path):
    proc, root = _tree(
        tmp_path,
        {
            "proc/meminfo": "MemTotal:       263854952 kB\nMemFree:        1000 kB\n",
            "proc/uptime": "12345.67 54321.00\n",
            "proc/version": "Linux version 6.5.0-41-generic (buildd@lcy02) gcc 12.3.0\n",
            "proc/1/cgroup": "0::/init.scope\n",
            "root/etc/os-release": 'NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n',
        },
    )
    info = host.collect_host(proc=proc, root=root)
    assert info.os == "Ubuntu 22.04.4 LTS"
    assert info.mem_total_bytes == 263854952 * 1024
    assert info.uptime_s == 12345.67
    assert info.in_container is False
    assert info.is_wsl is False
    assert info.agent_version == __version__
    assert info.python_version == ".".join(map(str, sys.version_info[:3]))
    assert info.hostname == os.uname().nodename
    assert info.kernel == os.uname().release
    assert info.cpu_count == len(os.sched_getaffinity(0))


def test_detects_containers(tmp_path):
    proc, root = _tree(tmp_path, {"proc/1/cgroup": "12:devices:/docker/0123abcd\n"})
    assert host.in_container(proc, root) is True
    proc, root = _tree(tmp_path / "b", {"root/.dockerenv": ""})
    assert host.in_container(proc, root) is True
    proc, root = _tree(tmp_path / "c", {"proc/1/environ": "PATH=/bin\0container=podman\0"})
    assert host.in_container(proc, root) is True
    proc, root = _tree(tmp_path / "d", {"proc/1/cgroup": "0::/\n"})
    assert host.in_container(proc, root) is False


def test_detects_wsl(tmp_path):
    version = tmp_path / "version"
    version.write_text("Linux version 5.15.153.1-microsoft-standard-WSL2 (root@...)\n")
    assert host.is_wsl(str(version)) is True
    version.write_text("Linux version 6.8.0-45-generic\n")
    assert host.is_wsl(str(version)) is False


def test_unreadable_files_give_none(tmp_path):
    proc, root = _tree(tmp_path, {"proc/meminfo": "MemTotal: lots\n", "proc/uptime": ""})
    info = host.collect_host(proc=proc, root=root)
    assert info.mem_total_bytes is None
    assert info.uptime_s is None
    assert info.os == os.uname().sysname
    assert info.is_wsl is False
    assert host.mem_total_bytes(str(tmp_path / "missing")) is None


def test_reads_this_machine():
    info = host.collect_host()
    assert info.mem_total_bytes is not None
    assert info.mem_total_bytes > 64 * 1024**2
    assert info.uptime_s is not None
    assert info.uptime_s > 0
    assert info.cpu_count >= 1
