"""Host key fingerprints agree with OpenSSH's own tools."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bot.fleet.hostkeys import algorithms_for, host_key_from_line, key_blob


@pytest.mark.parametrize("key_type", ["ed25519", "ecdsa", "rsa"])
def test_fingerprint_matches_ssh_keygen(tmp_path: Path, key_type: str) -> None:
    path = tmp_path / f"id_{key_type}"
    subprocess.run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-f", str(path)], check=True)
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", f"{path}.pub"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()[1]

    key = host_key_from_line(path.with_suffix(".pub").read_text())

    assert key.fingerprint == listed
    assert key.fingerprint.startswith("SHA256:")
    assert not key.fingerprint.endswith("=")
    assert key.key_type == path.with_suffix(".pub").read_text().split()[0]
    assert key_blob(key)[4:].startswith(key.key_type.encode())


@pytest.mark.parametrize("line", ["", "ssh-ed25519", "ssh-ed25519 not*base64!"])
def test_bad_lines_are_rejected(line: str) -> None:
    with pytest.raises(ValueError, match="public key"):
        host_key_from_line(line)


def test_rsa_keys_are_asked_for_with_sha2_signatures() -> None:
    assert algorithms_for("ssh-rsa")[0] == "rsa-sha2-512"
    assert algorithms_for("ssh-ed25519") == ("ssh-ed25519",)
