"""Turning the text after `/gpu` into a command spec and its parsed arguments.

Every mistake raises bot.errors.UsageError carrying the command's usage line; nothing else
escapes :func:`parse`, whatever the text.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
from collections.abc import Sequence
from typing import NoReturn

from bot.commands.registry import CommandSpec, Registry
from bot.errors import UsageError

HELP_COMMAND = "help"
_HELP_FLAGS = frozenset({"-h", "--help"})
# Slack escapes these three in slash-command text; phones turn quotes into typographic ones.
_SLACK_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&"))
_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2018": "'", "\u2019": "'"})


class CommandArgumentParser(argparse.ArgumentParser):
    """An argparse parser that raises UsageError instead of printing and exiting."""

    def __init__(self, spec: CommandSpec) -> None:
        super().__init__(
            prog=f"/gpu {spec.name}",
            add_help=False,
            exit_on_error=False,
            allow_abbrev=False,
        )
        self.spec_usage = spec.usage

    def error(self, message: str) -> NoReturn:
        """Raise UsageError with argparse's message and the spec's usage line."""
        raise UsageError(_sentence(message), usage=self.spec_usage)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        """argparse never exits the bot: turn it into a UsageError."""
        raise UsageError(_sentence(message or "invalid command"), usage=self.spec_usage)


def parse(text: str, registry: Registry) -> tuple[CommandSpec, argparse.Namespace]:
    """Parse `/gpu` text. Empty text and ``help [CMD]`` give the help command.

    Raises UsageError for unbalanced quotes, an unknown command (suggesting the closest),
    a missing ``--`` command for remainder commands, and anything argparse rejects.
    """
    tokens = tokenize(text)
    if not tokens:
        return help_spec_for(registry), argparse.Namespace(topic=None)
    name, rest = tokens[0].lower(), tokens[1:]
    if name in _HELP_FLAGS:
        name = HELP_COMMAND
    if name == HELP_COMMAND:
        return _parse_help(rest, registry)
    spec = lookup(name, registry)
    options, remainder = _split_remainder(rest) if spec.remainder else (rest, None)
    if _HELP_FLAGS.intersection(_before_double_dash(options)):
        return help_spec_for(registry), argparse.Namespace(topic=spec.name)
    args = _run_argparse(spec, options)
    if spec.remainder:
        if not remainder:
            raise UsageError(
                "Nothing to run after `--`.",
                usage=spec.usage,
                hint="Put the command after a double dash, like `-- python train.py`.",
            )
        args.command = remainder
    return spec, args


def tokenize(text: str) -> list[str]:
    """Shell-like words of Slack text (entities unescaped, typographic quotes made plain).

    Raises UsageError for unbalanced quotes or a trailing backslash.
    """
    cleaned = text
    for entity, char in _SLACK_ENTITIES:
        cleaned = cleaned.replace(entity, char)
    cleaned = cleaned.translate(_QUOTES)
    try:
        return shlex.split(cleaned, comments=False, posix=True)
    except ValueError as exc:
        raise UsageError(
            f"Could not read the command: {str(exc).lower()}.",
            hint="Close every quote you open; quote a backslash as '\\\\'.",
        ) from exc


def lookup(name: str, registry: Registry) -> CommandSpec:
    """The spec named ``name`` (or an alias). Raises UsageError naming the closest command."""
    key = name.lower()
    if key == HELP_COMMAND:
        return help_spec_for(registry)
    spec = registry.commands.get(key)
    if spec is not None:
        return spec
    names = sorted({*registry.commands, HELP_COMMAND})
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    shown = name if len(name) <= 40 else name[:40] + "…"
    suggestion = f" Did you mean `{close[0]}`?" if close else ""
    raise UsageError(
        f"Unknown command `{shown}`.{suggestion}",
        hint="Type `/gpu help` for the list of commands.",
    )


def help_spec_for(registry: Registry) -> CommandSpec:
    """The registry's help command, or one built for it (registries in tests may lack one)."""
    spec = registry.commands.get(HELP_COMMAND)
    if spec is not None:
        return spec
    from bot.commands.help import help_spec

    return help_spec(registry)


def _parse_help(rest: list[str], registry: Registry) -> tuple[CommandSpec, argparse.Namespace]:
    spec = help_spec_for(registry)
    if len(rest) > 1:
        raise UsageError("`help` takes at most one command name.", usage=spec.usage)
    if not rest:
        return spec, argparse.Namespace(topic=None)
    topic = lookup(rest[0], registry)
    return spec, argparse.Namespace(topic=topic.name)


def _split_remainder(tokens: list[str]) -> tuple[list[str], list[str] | None]:
    if "--" not in tokens:
        return tokens, None
    at = tokens.index("--")
    return tokens[:at], tokens[at + 1 :]


def _before_double_dash(tokens: Sequence[str]) -> list[str]:
    return list(tokens[: tokens.index("--")]) if "--" in tokens else list(tokens)


def _run_argparse(spec: CommandSpec, tokens: list[str]) -> argparse.Namespace:
    parser = CommandArgumentParser(spec)
    spec.configure(parser)
    try:
        return parser.parse_args(tokens)
    except UsageError as exc:
        if not exc.usage:
            exc.usage = spec.usage
        raise
    except argparse.ArgumentError as exc:
        raise UsageError(_sentence(str(exc)), usage=spec.usage) from exc


def _sentence(message: str) -> str:
    text = message.strip()
    if not text:
        return "Invalid command."
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "?", "!")) else text + "."
