"""The `/gpu` command language: one registry of commands and button actions.

Each command group lives in its own module (``instances``, ``jobs``, ``deadlines``, ``money``)
and registers its specs; ``bot.commands.load_all()`` imports them all.
"""

from __future__ import annotations

from bot.commands.registry import REGISTRY, Registry


def load_all() -> Registry:
    """Import every command module so that its specs are in REGISTRY; returns REGISTRY."""
    import bot.commands.deadlines
    import bot.commands.help
    import bot.commands.instances
    import bot.commands.jobs
    import bot.commands.money  # noqa: F401

    return REGISTRY
