"""Turning the text after `/gpu` into a command spec and its parsed arguments.

Every mistake raises bot.errors.UsageError carrying the command's usage line; nothing else
escapes :func:`parse`, whatever the text. A value that starts with a minus and a digit (``-1h``,
``-5``) is a value, never an option, and is refused as negative. A word of the user's is echoed
at most :data:`bot.services.lookup.ECHO_MAX` characters long.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from bot.commands.registry import CommandSpec, Registry
from bot.errors import UsageError
from bot.services.lookup import ECHO_MAX, echo

HELP_COMMAND = "help"
_HELP_FLAGS = frozenset({"-h", "--help"})
# Slack escapes these three in slash-command text; phones turn quotes into typographic ones.
_SLACK_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&"))
_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2018": "'", "\u2019": "'"})
#: The longest error message the parser gives (argparse may list every surplus word).
MESSAGE_MAX = 300
#: A minus then a digit: a negative value (``-1h``, ``-5m``, ``-2.5``), not an option.
_NEGATIVE = re.compile(r"-\d")
_LONG_WORD = re.compile(rf"\S{{{ECHO_MAX + 1},}}")
#: What a value parser reads, by its function's name, for the refusal of a negative value.
_KINDS = {
    "parse_duration": "duration",
    "_duration_or_off": "duration",
    "_duration_or_none": "duration",
    "parse_price": "price",
    "parse_storage_price": "price",
    "parse_money": "amount",
    "parse_size_gb": "size",
}


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
        # argparse takes only plain numbers (-1, -.5) for values; -1h would read as an option.
        self._negative_number_matcher = _NEGATIVE

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
    cleaned = cleaned.translate(_QUOTES).replace("\u3000", " ")  # the ideographic space
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
    shown = echo(name)
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


def refuse_negatives(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """``convert`` that first refuses a negative value (``-1h``) with UsageError saying so and
    showing the positive one, and refuses a value too large for it (OverflowError)."""
    kind = _KINDS.get(getattr(convert, "__name__", ""), "value")

    def check(text: str) -> Any:
        raw = text.strip()
        if _NEGATIVE.match(raw):
            like = f" like {echo(raw[1:])}" if _converts(convert, raw[1:]) else ""
            raise UsageError(f"{echo(raw)} is negative: give a positive {kind}{like}.")
        try:
            return convert(text)
        except OverflowError as exc:
            raise UsageError(f"{echo(raw)} is too large.", hint=f"Give a smaller {kind}.") from exc

    check.__name__ = getattr(convert, "__name__", "check")
    return check


def _converts(convert: Callable[[str], Any], text: str) -> bool:
    try:
        convert(text)
    except (UsageError, ValueError, TypeError, ArithmeticError, argparse.ArgumentTypeError):
        return False
    return True


def _run_argparse(spec: CommandSpec, tokens: list[str]) -> argparse.Namespace:
    parser = CommandArgumentParser(spec)
    spec.configure(parser)
    for action in parser._actions:
        if callable(action.type):
            action.type = refuse_negatives(action.type)
    try:
        return parser.parse_args(tokens)
    except UsageError as exc:
        raise UsageError(
            _clipped(exc.message), usage=exc.usage or spec.usage, hint=exc.hint
        ) from exc
    except argparse.ArgumentError as exc:
        raise UsageError(_sentence(str(exc)), usage=spec.usage) from exc


def _clipped(message: str) -> str:
    """``message`` with every long word of the user's cut (:func:`echo`), at most
    :data:`MESSAGE_MAX` characters."""
    text = _LONG_WORD.sub(lambda match: echo(match.group(0)), message)
    return echo(text, MESSAGE_MAX - 1)


def _sentence(message: str) -> str:
    text = _clipped(message.strip())
    if not text:
        return "Invalid command."
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "?", "!", "…")) else text + "."
