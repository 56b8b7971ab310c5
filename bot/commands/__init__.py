"""The `/gpu` command language: one registry of commands and button actions.

Each command group lives in its own module (``instances``, ``jobs``, ``deadlines``, ``money``)
and registers its specs; ``bot.commands.load_all()`` imports them all.
"""

from __future__ import annotations
