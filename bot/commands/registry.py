"""Command and action specs, and the registry the Slack app and the console dispatch through.

A handler is thin: it takes the parsed arguments, calls a service and renders blocks. It knows
nothing of Bolt; the app and the console turn a :class:`Reply` into Slack calls or text.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bot.errors import UsageError
from bot.i18n import t
from bot.services.access import Caller
from bot.store.models import MAX_ROW_ID

if TYPE_CHECKING:
    from bot.runtime import Runtime


@dataclass(frozen=True)
class Reply:
    """What a command or click answers. ``ephemeral`` replies are seen by the caller only;
    ``replace_original`` replaces the message that held the clicked button."""

    text: str
    blocks: tuple[dict[str, Any], ...] = ()
    ephemeral: bool = True
    replace_original: bool = False


#: The largest id a button may carry (a larger one overflows an id column on PostgreSQL).
MAX_BUTTON_ID = MAX_ROW_ID
_BUTTON_ID = re.compile(r"[1-9][0-9]{0,9}")


def button_id(value: str) -> int | None:
    """A button's value as an id: digits without a leading zero, 1 to :data:`MAX_BUTTON_ID`;
    None for anything else (the listeners answer such a click before any handler runs)."""
    if _BUTTON_ID.fullmatch(value) is None:
        return None
    number = int(value)
    return number if number <= MAX_BUTTON_ID else None


def button_number(value: str) -> int:
    """A button's value as the id it carries (read as :func:`button_id` reads it). Raises
    UsageError for anything else (a button edited by hand or left over from an older
    message)."""
    number = button_id(value)
    if number is None:
        raise UsageError(t("This button is broken; run the command again."))
    return number


CommandHandler = Callable[["Runtime", Caller, argparse.Namespace], Reply]
ActionHandler = Callable[["Runtime", Caller, str], Reply]
Configure = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class CommandSpec:
    """One `/gpu NAME ...` command. ``configure`` adds its arguments to an argparse parser;
    ``remainder`` commands take everything after ``--`` as ``args.command`` (a list)."""

    name: str
    summary: str
    usage: str
    examples: tuple[str, ...]
    configure: Configure
    handler: CommandHandler
    remainder: bool = False
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class ActionSpec:
    """A button: ``action_id`` as in the block; the handler gets the button's ``value``."""

    action_id: str
    handler: ActionHandler


@dataclass
class Registry:
    """Commands by name (aliases included) and actions by id."""

    commands: dict[str, CommandSpec] = field(default_factory=dict)
    actions: dict[str, ActionSpec] = field(default_factory=dict)

    def command(self, spec: CommandSpec) -> CommandSpec:
        """Add a command. Raises ValueError when the name is taken."""
        for name in (spec.name, *spec.aliases):
            if name in self.commands:
                raise ValueError(f"command {name!r} registered twice")
            self.commands[name] = spec
        return spec

    def action(self, spec: ActionSpec) -> ActionSpec:
        """Add a button action. Raises ValueError when the id is taken."""
        if spec.action_id in self.actions:
            raise ValueError(f"action {spec.action_id!r} registered twice")
        self.actions[spec.action_id] = spec
        return spec

    def primary_commands(self) -> list[CommandSpec]:
        """Each command once, in registration order."""
        seen: dict[str, CommandSpec] = {}
        for spec in self.commands.values():
            seen.setdefault(spec.name, spec)
        return list(seen.values())
