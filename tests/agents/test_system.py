"""agents.system: device nodes, sshd configuration and listening sockets, read from real files."""

from __future__ import annotations

import os
import socket

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
