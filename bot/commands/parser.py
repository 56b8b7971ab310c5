"""Turning the text after `/gpu` into a command spec and its parsed arguments.

Every mistake raises bot.errors.UsageError carrying the command's usage line; nothing else
escapes :func:`parse`, whatever the text. A value that starts with a minus and a digit (``-1h``,
``-5``) is a value, never an option, and is refused as negative. A word of the user's is echoed
at most :data:`bot.services.instances.lookup.ECHO_MAX` characters long.
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
from bot.i18n import N_, nt, t
from bot.services.instances.lookup import ECHO_MAX, echo

HELP_COMMAND = "help"
_HELP_FLAGS = frozenset({"-h", "--help"})
# Slack escapes these three in slash-command text; phones turn quotes into typographic ones.
_SLACK_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&"))
_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2018": "'", "\u2019": "'"})
#: The longest error message the parser gives (argparse may list every surplus word).
MESSAGE_MAX = 300
#: A minus then a digit: a negative value (``-1h``, ``-5m``, ``-2.5``), not an option.
_NEGATIVE = re.compile(r"-\d")
#: A long word of the user's: more than ECHO_MAX characters without a space. Chinese characters
#: and full-width punctuation end a word (a Chinese sentence has no spaces to end one).
_LONG_WORD = re.compile(rf"[^\s\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]{{{ECHO_MAX + 1},}}")
#: Quotes and punctuation a message puts around a word it echoes.
_AROUND_WORD = "'\"`*_.,:;!?()[]{}<>@"
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
#: The refusals of a value by its kind: (negative, showing the positive one; negative; too large).
_REFUSALS = {
    "duration": (
        N_("{value} is negative: give a positive duration like {positive}."),
        N_("{value} is negative: give a positive duration."),
        N_("Give a smaller duration."),
    ),
    "price": (
        N_("{value} is negative: give a positive price like {positive}."),
        N_("{value} is negative: give a positive price."),
        N_("Give a smaller price."),
    ),
    "amount": (
        N_("{value} is negative: give a positive amount like {positive}."),
        N_("{value} is negative: give a positive amount."),
        N_("Give a smaller amount."),
    ),
    "size": (
        N_("{value} is negative: give a positive size like {positive}."),
        N_("{value} is negative: give a positive size."),
        N_("Give a smaller size."),
    ),
    "value": (
        N_("{value} is negative: give a positive value like {positive}."),
        N_("{value} is negative: give a positive value."),
        N_("Give a smaller value."),
    ),
}
#: argparse's own messages (its Python 3.11 wording), in the catalogue with their values named.
_ARGPARSE_MESSAGES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.DOTALL), message)
    for pattern, message in (
        (
            r"the following arguments are required: (?P<names>.+)",
            N_("the following arguments are required: {names}"),
        ),
        (r"unrecognized arguments: (?P<words>.*)", N_("unrecognized arguments: {words}")),
        (r"expected one argument", N_("expected one argument")),
        (r"expected at most one argument", N_("expected at most one argument")),
        (r"expected at least one argument", N_("expected at least one argument")),
        (
            r"invalid choice: (?P<value>.+) \(choose from (?P<choices>.*)\)",
            N_("invalid choice: {value} (choose from {choices})"),
        ),
        (r"invalid (?P<kind>\S+) value: (?P<value>.+)", N_("invalid {kind} value: {value}")),
        (r"not allowed with argument (?P<other>.+)", N_("not allowed with argument {other}")),
        (r"ignored explicit argument (?P<value>.+)", N_("ignored explicit argument {value}")),
        (
            r"one of the arguments (?P<names>.+) is required",
            N_("one of the arguments {names} is required"),
        ),
        (
            r"ambiguous option: (?P<option>\S+) could match (?P<matches>.+)",
            N_("ambiguous option: {option} could match {matches}"),
        ),
        (r"invalid command", N_("invalid command")),
    )
)
_ARGUMENT_MESSAGE = re.compile(r"argument (?P<argument>.+?): (?P<message>.+)", re.DOTALL)
_EXPECTED_ARGUMENTS = re.compile(r"expected (?P<n>\d+) arguments?")
#: What shlex says of text it cannot split, in the catalogue.
_SHLEX_PROBLEMS = {
    "no closing quotation": N_("no closing quotation"),
    "no escaped character": N_("no escaped character"),
}
#: The marks that end a sentence, in English and in Chinese.
_SENTENCE_ENDS = (".", "?", "!", "…", "。", "\uff1f", "\uff01")


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
                t("Nothing to run after `--`."),
                usage=spec.usage,
                hint=t("Put the command after a double dash, like `-- python train.py`."),
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
        problem = str(exc).lower()
        raise UsageError(
            t(
                "Could not read the command: {problem}.",
                problem=t(_SHLEX_PROBLEMS[problem]) if problem in _SHLEX_PROBLEMS else problem,
            ),
            hint=t("Close every quote you open; quote a backslash as '\\\\'."),
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
    message = (
        t("Unknown command `{name}`. Did you mean `{command}`?", name=shown, command=close[0])
        if close
        else t("Unknown command `{name}`.", name=shown)
    )
    raise UsageError(message, hint=t("Type `/gpu help` for the list of commands."))


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
        raise UsageError(t("`help` takes at most one command name."), usage=spec.usage)
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
    showing, negative, smaller = _REFUSALS[_KINDS.get(getattr(convert, "__name__", ""), "value")]

    def check(text: str) -> Any:
        raw = text.strip()
        if _NEGATIVE.match(raw):
            if _converts(convert, raw[1:]):
                raise UsageError(t(showing, value=echo(raw), positive=echo(raw[1:])))
            raise UsageError(t(negative, value=echo(raw)))
        try:
            return convert(text)
        except OverflowError as exc:
            raise UsageError(t("{value} is too large.", value=echo(raw)), hint=t(smaller)) from exc

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


def cut_echoes(message: str, typed: str) -> str:
    """``message`` with each long word it repeats of what the user ``typed`` cut to its first
    :data:`ECHO_MAX` characters and "…" (quotes and punctuation around it kept), however the
    handler that refused it worded it: a 10 kB name is never sent back whole."""
    said = typed.lower()

    def cut(match: re.Match[str]) -> str:
        word = match.group(0)
        inner = word.strip(_AROUND_WORD)
        if len(inner) <= ECHO_MAX or inner[:ECHO_MAX].lower() not in said:
            return word
        start = word.index(inner)
        return word[:start] + echo(inner) + word[start + len(inner) :]

    return _LONG_WORD.sub(cut, message)


def _clipped(message: str) -> str:
    """``message`` with every long word of the user's cut (:func:`echo`), at most
    :data:`MESSAGE_MAX` characters."""
    text = _LONG_WORD.sub(lambda match: echo(match.group(0)), message)
    return echo(text, MESSAGE_MAX - 1)


def _sentence(message: str) -> str:
    """argparse's ``message`` as a sentence in the active language: translated where its
    wording is known, clipped, capitalised, with a final full stop."""
    text = _clipped(_translated(message.strip()))
    if not text:
        return t("Invalid command.")
    text = text[0].upper() + text[1:]
    return text if text.endswith(_SENTENCE_ENDS) else text + "."


def _translated(message: str) -> str:
    """argparse's ``message`` in the active language; as it is where its wording is unknown."""
    argument = _ARGUMENT_MESSAGE.fullmatch(message)
    if argument is not None:
        return t(
            "argument {argument}: {message}",
            argument=argument.group("argument"),
            message=_translated(argument.group("message")),
        )
    expected = _EXPECTED_ARGUMENTS.fullmatch(message)
    if expected is not None:
        count = int(expected.group("n"))
        return nt("expected {n} argument", "expected {n} arguments", count, n=count)
    for pattern, sentence in _ARGPARSE_MESSAGES:
        match = pattern.fullmatch(message)
        if match is not None:
            return t(sentence, **match.groupdict())
    return message
