"""The `/gpu` parser: tokenizing, help, suggestions, remainder commands, argparse errors."""

from __future__ import annotations

import argparse
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.commands import build_registry
from bot.commands.help import HELP_ORDER, _listed, render_command, render_overview, sentence
from bot.commands.parser import parse, tokenize
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.errors import UsageError
from bot.local_slack import check_blocks
from bot.services.access import Caller
from bot.values import parse_duration

REGISTRY = build_registry()


def _reply(rt: object, caller: Caller, args: argparse.Namespace) -> Reply:
    return Reply(text=repr(vars(args)))


def _extend_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("duration", type=parse_duration, metavar="DURATION")


def _run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--gpus", default=None)
    parser.add_argument("--retries", type=int, default=0)


def _status_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", metavar="NAME")


@pytest.fixture
def registry() -> Registry:
    reg = Registry()
    reg.command(
        CommandSpec(
            name="extend",
            summary="Move the deadline",
            usage="/gpu extend NAME DURATION",
            examples=("/gpu extend box 2h",),
            configure=_extend_args,
            handler=_reply,
        )
    )
    reg.command(
        CommandSpec(
            name="run",
            summary="Queue a job",
            usage="/gpu run NAME [--gpus 0,1|N] [--retries N] -- CMD ...",
            examples=("/gpu run box -- python train.py",),
            configure=_run_args,
            handler=_reply,
            remainder=True,
        )
    )
    reg.command(
        CommandSpec(
            name="status",
            summary="Fleet overview",
            usage="/gpu status [NAME]",
            examples=("/gpu status",),
            configure=_status_args,
            handler=_reply,
            aliases=("st",),
        )
    )
    return reg


def test_plain_command_is_parsed_with_typed_values(registry: Registry) -> None:
    spec, args = parse("extend box 1h30m", registry)
    assert spec.name == "extend"
    assert args.name == "box"
    assert args.duration.total_seconds() == 5400


def test_alias_and_case_reach_the_same_command(registry: Registry) -> None:
    assert parse("ST box", registry)[0].name == "status"
    assert parse("Status", registry)[0].name == "status"


@pytest.mark.parametrize("text", ["", "   ", "help", "HELP", "-h", "--help"])
def test_empty_text_and_help_give_the_overview(registry: Registry, text: str) -> None:
    spec, args = parse(text, registry)
    assert spec.name == "help"
    assert args.topic is None


def test_help_with_a_command_names_it(registry: Registry) -> None:
    spec, args = parse("help extend", registry)
    assert (spec.name, args.topic) == ("help", "extend")
    spec, args = parse("help st", registry)
    assert args.topic == "status"


def test_help_flag_after_a_command_gives_its_help(registry: Registry) -> None:
    spec, args = parse("extend --help", registry)
    assert (spec.name, args.topic) == ("help", "extend")


def test_help_for_an_unknown_command_suggests_the_closest(registry: Registry) -> None:
    with pytest.raises(UsageError, match="Did you mean `extend`"):
        parse("help extnd", registry)


def test_unknown_command_suggests_the_closest(registry: Registry) -> None:
    with pytest.raises(UsageError) as err:
        parse("stauts", registry)
    assert "Unknown command `stauts`" in err.value.message
    assert "Did you mean `status`?" in err.value.message
    assert "/gpu help" in err.value.hint


def test_unknown_command_far_from_any_gets_no_guess(registry: Registry) -> None:
    with pytest.raises(UsageError) as err:
        parse("zzzzzzzz", registry)
    assert "Did you mean" not in err.value.message


def test_unbalanced_quote_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no closing quotation"):
        tokenize('run box -- echo "hi')
    with pytest.raises(UsageError, match="no escaped character"):
        tokenize("run box -- echo \\")


def test_slack_entities_and_typographic_quotes_are_undone() -> None:
    assert tokenize("run box -- echo a &gt; b &amp;&amp; c &lt; d") == [
        "run",
        "box",
        "--",
        "echo",
        "a",
        ">",
        "b",
        "&&",
        "c",
        "<",
        "d",
    ]
    assert tokenize("run box -- echo \u201chello world\u201d \u2018x y\u2019") == [
        "run",
        "box",
        "--",
        "echo",
        "hello world",
        "x y",
    ]


def test_remainder_goes_to_args_command_exactly(registry: Registry) -> None:
    spec, args = parse(
        "run box --gpus 0,1 --retries 2 -- python train.py --lr 3e-4 -- 'a b' \"$HOME\"",
        registry,
    )
    assert spec.name == "run"
    assert (args.name, args.gpus, args.retries) == ("box", "0,1", 2)
    assert args.command == ["python", "train.py", "--lr", "3e-4", "--", "a b", "$HOME"]


def test_remainder_flags_after_double_dash_are_not_help(registry: Registry) -> None:
    spec, args = parse("run box -- python -h", registry)
    assert spec.name == "run"
    assert args.command == ["python", "-h"]


@pytest.mark.parametrize("text", ["run box", "run box --", "run box --gpus 1 --"])
def test_remainder_command_needs_something_after_double_dash(registry: Registry, text: str) -> None:
    with pytest.raises(UsageError) as err:
        parse(text, registry)
    assert "after `--`" in err.value.message
    assert err.value.usage.startswith("/gpu run NAME")


def test_missing_argument_carries_the_usage(registry: Registry) -> None:
    with pytest.raises(UsageError) as err:
        parse("extend box", registry)
    assert "required: DURATION" in err.value.message
    assert err.value.usage == "/gpu extend NAME DURATION"


def test_unrecognized_option_is_a_usage_error(registry: Registry) -> None:
    with pytest.raises(UsageError, match="Unrecognized arguments: --nope"):
        parse("status --nope", registry)


def test_bad_int_is_a_usage_error(registry: Registry) -> None:
    with pytest.raises(UsageError, match="invalid int value"):
        parse("run box --retries many -- true", registry)


def test_value_parser_message_reaches_the_user(registry: Registry) -> None:
    with pytest.raises(UsageError) as err:
        parse("extend box soon", registry)
    assert err.value.message == "'soon' is not a duration"
    assert "90m" in err.value.hint
    assert err.value.usage == "/gpu extend NAME DURATION"


def test_abbreviated_options_are_not_guessed(registry: Registry) -> None:
    with pytest.raises(UsageError):
        parse("run box --gp 1 -- true", registry)


def test_help_renderers_stay_within_slack_limits(registry: Registry) -> None:
    text, blocks = render_overview(registry.primary_commands())
    assert "/gpu extend" in text
    assert not check_blocks(blocks)
    long = CommandSpec(
        name="x" * 300,
        summary="s" * 5000,
        usage="/gpu " + "u" * 5000,
        examples=tuple("/gpu " + "e" * 100 for _ in range(100)),
        configure=_status_args,
        handler=_reply,
    )
    _, blocks = render_command(long)
    assert not check_blocks(blocks)
    many = [CommandSpec(f"c{i}", "s" * 200, "/gpu c", (), _status_args, _reply) for i in range(200)]
    _, blocks = render_overview(many)
    assert not check_blocks(blocks)
    assert sum(b["text"]["text"].count("`/gpu c") for b in blocks if b["type"] == "section") == 200


def test_help_summaries_read_alike_whatever_module_wrote_them() -> None:
    assert sentence("rent an instance, then register it") == "Rent an instance, then register it"
    assert sentence("(admin) the longest an instance may live.") == (
        "(admin) The longest an instance may live"
    )
    assert sentence("  Already  fine ") == "Already fine"
    text, _ = render_overview(REGISTRY.primary_commands())
    summaries = [line.split(": ", 1)[1] for line in text.splitlines()[1:]]
    assert len(summaries) == len(REGISTRY.primary_commands())
    assert all(s.removeprefix("(admin) ")[:1].isupper() for s in summaries), summaries
    one, blocks = render_command(REGISTRY.commands["rent"])
    assert one.startswith("/gpu rent: Rent ")
    assert blocks[1]["text"]["text"].startswith("Rent ")


def test_help_lists_every_command_once_in_the_design_order() -> None:
    text, _ = render_overview(_listed(REGISTRY))
    listed = [line.split(":", 1)[0].removeprefix("/gpu ") for line in text.splitlines()[1:]]
    assert sorted(listed) == sorted(spec.name for spec in REGISTRY.primary_commands())
    known = [name for name in HELP_ORDER if name in listed]
    assert listed[: len(known)] == known
    assert listed[:7] == ["help", "register", "status", "list", "health", "extend", "release"]


# --- property-based: nothing but UsageError escapes, on the full registry ---------------------

_NAMES = sorted(REGISTRY.commands)
_FLAGS = [
    "--",
    "-h",
    "--help",
    "--count",
    "--gpu",
    "--price",
    "--release-in",
    "--release-at",
    "--provider",
    "--billing",
    "--full",
    "--tail",
    "--by",
    "--gpus",
    "-",
    "-1",
    "1e999",
]
_WORDS = st.one_of(
    st.sampled_from(_NAMES + _FLAGS),
    st.text(alphabet=string.printable, max_size=12),
    st.text(max_size=8),
    st.sampled_from(
        ["2h", "0s", "90m", "18:00", "25:61", "2.10/h", "-3", "nan", "inf", "a@b:99999"]
    ),
)


def _check(text: str) -> None:
    try:
        spec, args = parse(text, REGISTRY)
    except UsageError as exc:
        message = exc.message
    else:
        assert spec.name in REGISTRY.commands or spec.name == "help"
        assert isinstance(args, argparse.Namespace)
        return
    assert message.strip(), f"an empty usage message for {text!r}"


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=200))
def test_any_text_parses_or_gives_a_usage_error(text: str) -> None:
    _check(text)


@settings(max_examples=600, deadline=None)
@given(st.lists(_WORDS, max_size=10))
def test_any_command_like_words_parse_or_give_a_usage_error(words: list[str]) -> None:
    _check(" ".join(words))


# --- negative values and long words -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("extend local -1h", "-1h is negative: give a positive duration like 1h."),
        ("extend local -90m", "-90m is negative: give a positive duration like 90m."),
        (
            "register box root@h --gpu a100 --price 1/h --min-charge -5m",
            "-5m is negative: give a positive duration like 5m.",
        ),
        (
            "register box root@h --gpu a100 --price 1/h --min-charge=-5m",
            "-5m is negative: give a positive duration like 5m.",
        ),
        (
            "register box root@h --gpu a100 --price 1/h --release-in -2h",
            "-2h is negative: give a positive duration like 2h.",
        ),
        ("register box root@h --gpu a100 --price 1/h --disk -5", "-5 is negative: give a positive"),
        ("policy box --max-grace -2h", "-2h is negative: give a positive duration like 2h."),
        ("policy box --idle-release -1h", "-1h is negative: give a positive duration like 1h."),
        ("cap box -3d", "-3d is negative: give a positive duration like 3d."),
        ("extend local -1x", "-1x is negative: give a positive duration."),
    ],
)
def test_a_negative_value_reaches_its_parser_and_is_refused_as_negative(
    text: str, message: str
) -> None:
    with pytest.raises(UsageError) as err:
        parse(text, REGISTRY)
    assert err.value.message.startswith(message)
    assert "required" not in err.value.message
    assert "expected one argument" not in err.value.message
    assert err.value.usage == REGISTRY.commands[text.split()[0]].usage


def test_dashes_still_mean_options_and_help(registry: Registry) -> None:
    spec, args = parse("run box --retries 2 -- python train.py --lr -3e-4", registry)
    assert args.command == ["python", "train.py", "--lr", "-3e-4"]
    spec, args = parse("extend box -h", registry)
    assert spec.name == "help"
    with pytest.raises(UsageError, match="Unrecognized arguments: -x"):
        parse("status box -x", registry)


LONG = "a" * 10_000


@pytest.mark.parametrize(
    "text",
    [
        LONG,
        f"help {LONG}",
        f"status {LONG} {LONG}",
        f"status box {'x ' * 5000}",
        f"extend box {LONG}",
        f"register box root@h --gpu a100 --price 1/h --provider {LONG}",
        f"register box root@h --gpu a100 --price 1/h --{LONG} 1",
        f"register box root@h --gpu a100 --price 1/h --min-charge {LONG}",
        f"register box root@h --gpu a100 --price 1/h --count {LONG}",
        f"policy box --release-when-done {LONG}",
        f"extend box -{'1' * 10_000}h",
        f"extend box {'1' * 10_000}h",
    ],
)
def test_a_long_word_is_echoed_cut(text: str) -> None:
    with pytest.raises(UsageError) as err:
        parse(text, REGISTRY)
    assert len(err.value.message) <= 300, err.value.message[:400]
    assert "a" * 41 not in err.value.message
    assert "1" * 41 not in err.value.message
    assert len(err.value.hint) <= 300
