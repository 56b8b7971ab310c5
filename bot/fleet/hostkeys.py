"""Host keys as pinned: OpenSSH's ``SHA256:`` fingerprints and the public-key line format."""

from __future__ import annotations

import base64
import binascii
import hashlib

from bot.fleet.base import HostKey

#: Host key algorithms a client may offer to get a key of a given type: RSA keys sign with
#: SHA-2 (the SHA-1 ``ssh-rsa`` signature is retired by OpenSSH and paramiko alike).
_ALGORITHMS_FOR_TYPE = {
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256"),
}


def fingerprint_sha256(key_blob: bytes) -> str:
    """OpenSSH's fingerprint of a public key blob: ``SHA256:`` + base64 without padding."""
    digest = hashlib.sha256(key_blob).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def host_key_from_blob(key_type: str, key_blob: bytes) -> HostKey:
    """A HostKey from the key's type name (e.g. ``ssh-ed25519``) and its wire-format blob."""
    return HostKey(
        key_type=key_type,
        key_b64=base64.b64encode(key_blob).decode("ascii"),
        fingerprint=fingerprint_sha256(key_blob),
    )


def host_key_from_line(line: str) -> HostKey:
    """A HostKey from an OpenSSH public key line ``TYPE BASE64 [COMMENT]``.

    Raises ValueError when the line is not of that form.
    """
    parts = line.split()
    if len(parts) < 2:
        raise ValueError(f"not an OpenSSH public key line: {line[:60]!r}")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"public key is not valid base64: {parts[1][:20]!r}...") from exc
    return host_key_from_blob(parts[0], blob)


def key_blob(host_key: HostKey) -> bytes:
    """The wire-format blob of a pinned key."""
    return base64.b64decode(host_key.key_b64)


def algorithms_for(key_type: str) -> tuple[str, ...]:
    """Host key algorithms that make a server present its key of ``key_type``."""
    return _ALGORITHMS_FOR_TYPE.get(key_type, (key_type,))
