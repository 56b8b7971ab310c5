"""SSH private keys chosen by name from the directory an admin configures (GPUBOT_SSH_KEY_DIR).

A user never gives the bot a path: ``--key NAME`` picks the file ``NAME`` in that directory, and
a name that is not there gets the same answer whatever exists elsewhere on the bot's machine.
"""

from __future__ import annotations

import re
from pathlib import Path

from bot.errors import UsageError
from bot.i18n import t
from bot.settings import Settings

KEY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
KEY_NAME_HINT = "Key names are 1-100 letters, digits, dots, dashes and underscores."
#: Names shown when a key is not found.
_SHOWN = 10


def check_key_name(name: str) -> str:
    """``name`` when it can name a key. Raises UsageError."""
    if not KEY_NAME_RE.fullmatch(name) or ".." in name:
        raise UsageError(t("{value!r} is not a key name.", value=name[:60]), hint=KEY_NAME_HINT)
    return name


def key_path(settings: Settings, name: str, *, names_shown: bool = False) -> Path:
    """The private key called ``name`` in GPUBOT_SSH_KEY_DIR. Raises UsageError when there is
    no key directory or no such key there; the message names the keys that exist only with
    ``names_shown`` (for admins: bot.services.instances.key_grants), and never says what exists
    elsewhere."""
    check_key_name(name)
    directory = settings.ssh_key_dir
    if directory is None:
        raise UsageError(
            t("No SSH keys can be chosen by name here: GPUBOT_SSH_KEY_DIR is not set."),
            hint=t(
                "Leave --key out to use the bot's default key, or ask an admin "
                "to set up a key directory."
            ),
        )
    base = directory.resolve()
    candidate = (base / name).resolve()
    if candidate.parent != base or not candidate.is_file():
        if not names_shown:
            raise no_such_key(name)
        names = key_names(settings)
        known = ", ".join(names[:_SHOWN]) if names else "none"
        raise UsageError(
            t("There is no SSH key called {name!r} in the bot's key directory.", name=name),
            hint=t("Keys it has: {known}. Leave --key out to use the default key.", known=known),
        )
    return candidate


def no_such_key(name: str) -> UsageError:
    """What a member is told of a key that is not there or not granted to them (one answer
    for both, naming no other key)."""
    return UsageError(
        t("You have no SSH key called {name!r}.", name=name),
        hint=t(
            "Leave --key out to use the default key, or ask an admin to grant you a key "
            "(/gpu keys allow KEY @you)."
        ),
    )


def stored_key_path(settings: Settings, name: str) -> Path:
    """The path of the key a stored registration names, without checking it is still there
    (the dial then fails for that instance alone). Never raises."""
    directory = settings.ssh_key_dir
    if directory is None or not KEY_NAME_RE.fullmatch(name) or ".." in name:
        return Path("/nonexistent/gpubot-key") / name.replace("/", "_")
    return directory / name


def key_names(settings: Settings) -> list[str]:
    """The key names in GPUBOT_SSH_KEY_DIR, sorted (public keys ``*.pub`` left out)."""
    directory = settings.ssh_key_dir
    if directory is None or not directory.is_dir():
        return []
    return sorted(
        entry.name
        for entry in directory.iterdir()
        if entry.is_file() and KEY_NAME_RE.fullmatch(entry.name) and not entry.name.endswith(".pub")
    )
