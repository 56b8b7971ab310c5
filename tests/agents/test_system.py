"""agents.system: device nodes, sshd configuration and listening sockets, read from real files."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from agents import system

_TAIL = (
    "00000000:00000000 00:00000000 00000000  1000        0 {inode} 1 0000000000000000 100 0 0 10 0"
)


def proc_net(header: str, rows: list[tuple[str, str, str, int]]) -> str:
    """A /proc/net/tcp(6) table as the kernel writes it: (local, remote, state, inode) rows."""
    lines = [header]
    for number, (local, remote, state, inode) in enumerate(rows):
        lines.append(f"{number:4}: {local} {remote} {state} " + _TAIL.format(inode=inode))
    return "\n".join(lines) + "\n"


# 0.0.0.0:8888, 127.0.0.1:6006 and 0.0.0.0:22 listening, and one established connection.
PROC_NET_TCP = proc_net(
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout",
    [
        ("00000000:22B8", "00000000:0000", "0A", 31337),
        ("0100007F:1776", "00000000:0000", "0A", 31338),
        ("00000000:0016", "00000000:0000", "0A", 12000),
        ("0100007F:0016", "0100007F:D3A2", "01", 12001),
    ],
)
# [::]:7860 and [::1]:8265 listening.
PROC_NET_TCP6 = proc_net(
    "  sl  local_address                         remote_address                        st",
    [
        (
            "00000000000000000000000000000000:1EB4",
            "00000000000000000000000000000000:0000",
            "0A",
            41000,
        ),
        (
            "00000000000000000000000001000000:2049",
            "00000000000000000000000000000000:0000",
            "0A",
            41001,
        ),
    ],
)


# --- device nodes -----------------------------------------------------------------------------


def test_scan_dev_nodes_finds_control_gpu_and_uvm_nodes(tmp_path):
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia10", "nvidia-uvm", "nvidia-modeset"):
        (tmp_path / name).write_text("")
    (tmp_path / "nvidia-caps").mkdir()
    facts = system.scan_dev_nodes(str(tmp_path))
    assert facts.control.exists
    assert facts.control.usable
    assert [os.path.basename(n.path) for n in facts.gpus] == ["nvidia0", "nvidia1", "nvidia10"]
    assert all(n.usable for n in facts.gpus)
    assert facts.uvm.exists
    assert not facts.dxg.exists


def test_scan_dev_nodes_with_nothing_there(tmp_path):
    facts = system.scan_dev_nodes(str(tmp_path))
    assert not facts.control.exists
    assert not facts.control.usable
    assert facts.gpus == ()
    assert not facts.uvm.exists


# --- sshd configuration -----------------------------------------------------------------------


def write_sshd(tmp_path, main: str, **included: str) -> str:
    conf_dir = tmp_path / "sshd_config.d"
    conf_dir.mkdir(exist_ok=True)
    for name, text in included.items():
        (conf_dir / f"{name}.conf").write_text(text)
    path = tmp_path / "sshd_config"
    path.write_text(main)
    return str(path)


def test_missing_sshd_config_is_not_found(tmp_path):
    config = system.read_sshd_config(str(tmp_path / "nope"))
    assert not config.found
    assert config.settings == {}


def test_first_value_wins_across_includes_in_lexical_order(tmp_path):
    path = write_sshd(
        tmp_path,
        "Include sshd_config.d/*.conf\n# a comment\nPasswordAuthentication no\nPort 22\n",
        **{
            "50-cloud-init": "PasswordAuthentication yes\n",
            "10-first": "  passwordauthentication   no  \nUsePAM yes\n",
        },
    )
    config = system.read_sshd_config(path)
    assert config.found
    assert config.get("PasswordAuthentication") == "no"
    assert config.sources["passwordauthentication"].endswith("10-first.conf")
    assert config.get("usepam") == "yes"
    assert config.get("port") == "22"
    assert [os.path.basename(f) for f in config.files_read] == [
        "sshd_config",
        "10-first.conf",
        "50-cloud-init.conf",
    ]


def test_equals_sign_quotes_and_old_spelling(tmp_path):
    path = write_sshd(
        tmp_path, 'ChallengeResponseAuthentication=no\nAuthenticationMethods "publickey"\n'
    )
    config = system.read_sshd_config(path)
    assert config.get("KbdInteractiveAuthentication") == "no"
    assert config.get("authenticationmethods") == "publickey"


def test_settings_after_match_are_not_global(tmp_path):
    path = write_sshd(
        tmp_path,
        "Match User deploy\n  PasswordAuthentication yes\nPermitRootLogin no\n",
    )
    config = system.read_sshd_config(path)
    assert config.get("PasswordAuthentication") is None
    assert config.get("PermitRootLogin") is None


def test_absolute_include_and_unreadable_files_are_reported(tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "keys.conf").write_text("PasswordAuthentication no\n")
    (other / "broken.conf").mkdir()  # a directory cannot be read as a file
    path = write_sshd(tmp_path, f"Include {other}/*.conf\n")
    config = system.read_sshd_config(path)
    assert config.get("passwordauthentication") == "no"
    assert config.unreadable == (str(other / "broken.conf"),)


def test_include_loops_stop(tmp_path):
    path = write_sshd(tmp_path, "Include sshd_config\nUsePAM no\n")
    config = system.read_sshd_config(path)
    assert config.get("usepam") == "no"
    assert len(config.files_read) > 1


# --- listening sockets ------------------------------------------------------------------------


def test_parse_proc_net_tcp_keeps_listeners_only():
    found = system.parse_proc_net_tcp(PROC_NET_TCP, "ipv4")
    assert [(s.address, s.port, s.inode) for s in found] == [
        ("0.0.0.0", 8888, 31337),
        ("127.0.0.1", 6006, 31338),
        ("0.0.0.0", 22, 12000),
    ]
    assert [s.all_interfaces for s in found] == [True, False, True]


def test_parse_proc_net_tcp6():
    found = system.parse_proc_net_tcp(PROC_NET_TCP6, "ipv6")
    assert [(s.address, s.port) for s in found] == [("::", 7860), ("::1", 8265)]
    assert [s.all_interfaces for s in found] == [True, False]


def test_parse_skips_malformed_rows():
    text = PROC_NET_TCP.splitlines()[0] + "\n   9: nonsense\n   8: ZZZZ:1 0:0 0A a b c d e f\n"
    assert system.parse_proc_net_tcp(text, "ipv4") == []


def test_listening_sockets_reads_a_proc_tree_and_names_owners(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(PROC_NET_TCP)
    (tmp_path / "net" / "tcp6").write_text(PROC_NET_TCP6)
    fd_dir = tmp_path / "4242" / "fd"
    fd_dir.mkdir(parents=True)
    os.symlink("socket:[31337]", fd_dir / "3")
    os.symlink("/dev/null", fd_dir / "0")
    (tmp_path / "4242" / "cmdline").write_bytes(b"/usr/bin/python3\0-m\0jupyter\0lab\0")
    found = {s.port: s for s in system.listening_sockets(str(tmp_path))}
    assert set(found) == {8888, 6006, 22, 7860, 8265}
    assert found[8888].pid == 4242
    assert found[8888].command == "/usr/bin/python3 -m jupyter lab"
    assert found[22].pid is None
    assert found[7860].family == "ipv6"


def test_listening_sockets_without_proc_files(tmp_path):
    assert system.listening_sockets(str(tmp_path)) == ()


@pytest.mark.integration
def test_a_real_socket_on_all_interfaces_is_seen_with_this_process_as_owner():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("0.0.0.0", 0))
        server.listen(1)
        port = server.getsockname()[1]
        found = [s for s in system.listening_sockets() if s.port == port]
    assert len(found) == 1
    assert found[0].all_interfaces
    assert found[0].pid == os.getpid()
    assert found[0].command


@pytest.mark.integration
def test_a_real_loopback_socket_is_not_on_all_interfaces():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        found = [s for s in system.listening_sockets(owners=False) if s.port == port]
    assert [(s.address, s.all_interfaces, s.pid) for s in found] == [("127.0.0.1", False, None)]


# --- disk space ---------------------------------------------------------------------------------


def test_disk_facts_group_directories_by_filesystem(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    facts = system.disk_facts(
        [("home", str(home)), ("jobs", str(home / "not" / "yet")), ("temp", str(tmp_path))]
    )
    (only,) = facts  # one filesystem holds all three
    assert only.roles == ("home", "jobs", "temp")
    assert only.path == str(home)
    vfs = os.statvfs(tmp_path)
    assert only.total_bytes == vfs.f_blocks * vfs.f_frsize
    assert only.free_bytes is not None
    assert 0 < only.free_bytes <= only.total_bytes
    assert only.read_only is False
    assert only.error is None


def test_disk_facts_of_separate_filesystems(tmp_path):
    facts = system.disk_facts([("temp", str(tmp_path)), ("shm", "/dev/shm"), ("proc", "/proc")])
    assert [f.roles for f in facts] == [("temp",), ("shm",), ("proc",)]
    assert facts[2].read_only or facts[2].total_bytes == 0  # /proc holds no data


def test_default_disk_dirs_follow_the_agent_home(monkeypatch, tmp_path):
    dirs = dict(system.default_disk_dirs({"GPU_AGENT_HOME": str(tmp_path / "agent")}))
    assert dirs["jobs"] == str(tmp_path / "agent")
    assert dirs["home"] == os.path.expanduser("~")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    assert dict(system.default_disk_dirs({}))["temp"] == str(tmp_path)
    assert dict(system.default_disk_dirs({}))["jobs"].endswith(".gpu-agent")


# --- /dev/shm -----------------------------------------------------------------------------------


def test_shm_facts_of_a_directory_and_its_mount_type(tmp_path):
    shm = tmp_path / "my shm"
    shm.mkdir()
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "tmpfs /dev/shm tmpfs rw,nosuid,nodev,size=65536k 0 0\n"
        f"tmpfs {str(shm).replace(' ', chr(92) + '040')} tmpfs rw,size=1024k 0 0\n"
    )
    facts = system.shm_facts(str(shm), str(mounts))
    assert facts.exists
    assert facts.fs_type == "tmpfs"
    assert facts.total_bytes is not None
    assert facts.free_bytes is not None
    assert system.shm_facts(str(shm), str(tmp_path / "nothing")).fs_type is None


def test_no_shm_at_all(tmp_path):
    facts = system.shm_facts(str(tmp_path / "missing"))
    assert not facts.exists
    assert facts.total_bytes is None
    assert "does not exist" in (facts.error or "")


SMALL_SHM_CODE = """
import json, os
from agents import system
from agents.checks.resources import check_shm
from agents.protocol import HostInfo
host = HostInfo("box", "Linux", "6.8", "3.11", "0", 8, None, None, True, False)
before = system.shm_facts()
with open("/dev/shm/batch", "wb") as fh:
    fh.write(b"x" * (40 * 2**20))
after = system.shm_facts()
check = check_shm(before, host, 1)
print(json.dumps({"before": [before.total_bytes, before.free_bytes, before.fs_type],
                  "after_free": after.free_bytes, "status": check.status,
                  "summary": check.summary, "hint": check.hint}))
"""


def test_a_real_small_dev_shm_fails_the_check(tmp_path):
    """A 64 MiB tmpfs, Docker's default size, mounted over /dev/shm in a mount namespace of
    its own (nothing outside it changes): the check fails and says how to fix it."""
    import json
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a tmpfs in a private mount namespace")
    user_ns = [] if os.geteuid() == 0 else ["--map-root-user"]
    script = 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" -c "$1"'
    argv = ["unshare", "--mount", "--propagation", "private", *user_ns]
    argv += ["sh", "-c", script, sys.executable, SMALL_SHM_CODE]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(Path(__file__).resolve().parents[2]),
        check=False,
    )
    if done.returncode != 0 and not done.stdout:
        pytest.skip(f"mounting a tmpfs is not allowed here: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["before"] == [64 * 2**20, 64 * 2**20, "tmpfs"]
    assert result["after_free"] == 24 * 2**20
    assert result["status"] == "fail"
    assert "64 MiB free of 64 MiB" in result["summary"]
    assert "bus error" in result["summary"]
    assert "--shm-size" in result["hint"]
    assert not os.path.exists("/dev/shm/batch")  # it was written to the private tmpfs only


# --- Xid errors in the kernel log ---------------------------------------------------------------

KMSG = (
    "6,1,1000000,-;Linux version 6.8.0\n"
    "4,812,3000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"
    " SUBSYSTEM=pci\n"
    " DEVICE=+pci:0000:3b:00.0\n"
    "4,900,3500000000,-;NVRM: Xid (PCI:0000:5e:00): 13, pid='<unknown>', name=python, "
    "Graphics SM Warp Exception\n"
    "6,901,3500000001,-;nvidia-modeset: not an Xid\n"
)


def test_kernel_xids_from_a_kmsg_stream_with_ages(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(KMSG)
    uptime = tmp_path / "uptime"
    uptime.write_text("3600.00 100.00\n")
    facts = system.kernel_xids(str(kmsg), (), str(uptime))
    assert facts.readable
    assert facts.source == str(kmsg)
    assert [(x.pci_bus_id, x.xid, x.age_s) for x in facts.xids] == [
        ("0000:3b:00", 79, 3597.0),
        ("0000:5e:00", 13, 100.0),
    ]
    assert facts.xids[0].message == "pid=0, GPU has fallen off the bus."


def test_kernel_xids_fall_back_to_a_log_file(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(
        "Mar  1 10:00:00 box kernel: [ 12.5] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n"
        "Mar  1 11:00:00 box kernel: [3612.5] NVRM: Xid (PCI:0000:18:00): 48, pid=77, "
        "name=python, DBE (0x1)\n"
    )
    missing = tmp_path / "no-kmsg"
    facts = system.kernel_xids(str(missing), (str(tmp_path / "absent.log"), str(log)))
    assert facts.source == str(log)
    assert [(x.xid, x.age_s) for x in facts.xids] == [(48, None)]
    assert str(missing) in facts.unreadable[0]


def test_kernel_xids_when_nothing_can_be_read(tmp_path):
    facts = system.kernel_xids(str(tmp_path / "kmsg"), (str(tmp_path / "kern.log"),))
    assert not facts.readable
    assert facts.xids == ()
    assert len(facts.unreadable) == 1  # a missing log file is not worth naming


def test_the_real_kernel_log_reads_or_says_why():
    facts = system.kernel_xids()
    if facts.readable:
        assert all(x.xid > 0 for x in facts.xids)
    else:
        assert facts.unreadable
