"""ssh_password_login and exposed_ports, over configurations parsed from real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.checks import security
from agents.system import ListeningSocket, SshdConfig, read_sshd_config


def sshd(tmp_path: Path, main: str, **included: str) -> SshdConfig:
    conf_dir = tmp_path / "sshd_config.d"
    conf_dir.mkdir(exist_ok=True)
    for name, text in included.items():
        (conf_dir / f"{name}.conf").write_text(text)
    (tmp_path / "sshd_config").write_text(main)
    return read_sshd_config(str(tmp_path / "sshd_config"))


KEYS_ONLY = "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"

# --- ssh_password_login -----------------------------------------------------------------------


def test_defaults_allow_passwords(tmp_path):
    result = security.check_ssh_password_login(sshd(tmp_path, "Port 22\n"))
    assert result.status == "warn"
    assert "PasswordAuthentication yes (sshd's default)" in result.summary
    assert str(tmp_path / "sshd_config") in result.hint
    assert "PasswordAuthentication no" in result.hint


def test_keys_only_passes(tmp_path):
    config = sshd(
        tmp_path, "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM yes\n"
    )
    result = security.check_ssh_password_login(config)
    assert result.status == "pass"
    assert result.hint == ""


def test_keyboard_interactive_counts_only_with_pam(tmp_path):
    no_pam = sshd(tmp_path, "PasswordAuthentication no\n")
    assert security.check_ssh_password_login(no_pam).status == "pass"
    with_pam = sshd(tmp_path, "PasswordAuthentication no\nUsePAM yes\n")
    result = security.check_ssh_password_login(with_pam)
    assert result.status == "warn"
    assert "KbdInteractiveAuthentication yes with UsePAM yes" in result.summary


def test_a_drop_in_file_that_enables_passwords_wins_and_is_named(tmp_path):
    config = sshd(
        tmp_path,
        "Include sshd_config.d/*.conf\n" + KEYS_ONLY,
        **{"50-cloud-init": "PasswordAuthentication yes\n"},
    )
    result = security.check_ssh_password_login(config)
    assert result.status == "warn"
    drop_in = str(tmp_path / "sshd_config.d" / "50-cloud-init.conf")
    assert drop_in in result.summary
    assert drop_in in result.hint


def test_a_drop_in_that_disables_passwords_first_wins(tmp_path):
    config = sshd(
        tmp_path,
        "Include sshd_config.d/*.conf\nPasswordAuthentication yes\n",
        **{"00-keys": "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"},
    )
    assert security.check_ssh_password_login(config).status == "pass"


@pytest.mark.parametrize(
    ("methods", "expected"),
    [
        ("publickey", "pass"),
        ("publickey,password", "pass"),  # a password is never enough on its own
        ("publickey password", "warn"),
        ("keyboard-interactive:pam", "warn"),
        ("any", "warn"),
    ],
)
def test_authentication_methods(tmp_path, methods, expected):
    config = sshd(tmp_path, f"AuthenticationMethods {methods}\n")
    assert security.check_ssh_password_login(config).status == expected


def test_missing_config_skips(tmp_path):
    result = security.check_ssh_password_login(read_sshd_config(str(tmp_path / "none")))
    assert result.status == "skip"


def test_unreadable_drop_in_cannot_confirm(tmp_path):
    (tmp_path / "sshd_config.d").mkdir()
    (tmp_path / "sshd_config.d" / "secret.conf").mkdir()
    config = sshd(
        tmp_path,
        "Include sshd_config.d/*.conf\n" + KEYS_ONLY,
    )
    result = security.check_ssh_password_login(config)
    assert result.status == "skip"
    assert "secret.conf" in result.summary
    assert "root" in result.hint


# --- exposed_ports ----------------------------------------------------------------------------


def listener(port: int, address: str = "0.0.0.0", command: str | None = None) -> ListeningSocket:
    family = "ipv6" if ":" in address else "ipv4"
    return ListeningSocket(family=family, address=address, port=port, inode=port, command=command)


def test_ssh_alone_is_fine():
    result = security.check_exposed_ports([listener(22), listener(22, "::")])
    assert result.status == "pass"
    assert result.summary == "nothing but SSH listens on all interfaces"


def test_nothing_listening_passes():
    assert security.check_exposed_ports([]).status == "pass"


def test_jupyter_and_tensorboard_on_all_interfaces_warn():
    result = security.check_exposed_ports(
        [listener(22), listener(8888), listener(6006, "::"), listener(6007, "127.0.0.1")]
    )
    assert result.status == "warn"
    assert "Jupyter on 8888" in result.summary
    assert "TensorBoard on 6006" in result.summary
    assert "6007" not in result.summary
    assert "ssh -L 6006:localhost:6006" in result.hint
    assert [row["port"] for row in result.details["all_interfaces"]] == [6006, 8888]


def test_loopback_services_are_fine():
    sockets = [listener(8888, "127.0.0.1"), listener(8265, "::1"), listener(7860, "10.0.0.5")]
    assert security.check_exposed_ports(sockets).status == "pass"


def test_a_service_on_an_odd_port_is_recognised_by_its_command():
    sock = listener(9999, command="/opt/conda/bin/python /opt/conda/bin/jupyter-lab --ip 0.0.0.0")
    result = security.check_exposed_ports([sock])
    assert result.status == "warn"
    assert "Jupyter on 9999" in result.summary


def test_unknown_ports_are_listed_but_pass():
    result = security.check_exposed_ports([listener(2024), listener(111, command="/sbin/rpcbind")])
    assert result.status == "pass"
    assert "also open: 111, 2024" in result.summary


@pytest.mark.parametrize(
    ("port", "command", "name"),
    [
        (7860, None, "Gradio"),
        (8265, None, "Ray dashboard"),
        (8000, None, "HTTP server (vLLM, FastAPI)"),
        (12345, "ray::IDLE", "Ray"),
        (12345, "/usr/bin/python -m ray.util.client.server", "Ray"),
        (12345, "/usr/bin/python -m http.server 12345", "python http.server"),
        (12345, "/usr/lib/array-daemon", None),
    ],
)
def test_service_names(port, command, name):
    assert security.service_name(listener(port, command=command)) == name
