"""The `/gpu` command language: commands and button actions, one module per group.

Each module adds its specs with its own ``register(registry)``; :func:`build_registry` calls
them, in the order `/gpu help` lists the commands. A module that is not called here has no
command.
"""

from __future__ import annotations

from bot.commands import (
    bills,
    deadlines,
    help,
    home,
    identities,
    instances,
    jobs,
    keys,
    lang,
    money,
    policy,
    rent,
)
from bot.commands.registry import Registry


def build_registry() -> Registry:
    """A registry holding every command and button the bot answers."""
    registry = Registry()
    help.register(registry)
    instances.register(registry)
    rent.register(registry)
    policy.register(registry)
    jobs.register(registry)
    money.register(registry)
    bills.register(registry)
    deadlines.register(registry)
    keys.register(registry)
    identities.register(registry)
    lang.register(registry)
    home.register(registry)
    return registry
