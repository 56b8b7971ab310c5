"""The command layer in Chinese: the help, the parser's refusals (argparse's own included), the
values people type, and the money commands' own sentences, with English left as it was."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import pytest

from bot.commands import build_registry
from bot.commands.help import _listed, render_command, render_overview, usage_text
from bot.commands.parser import parse
from bot.commands.registry import Reply, button_number
from bot.errors import UsageError
from bot.i18n import speaking
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.store.db import Database
from bot.values import parse_duration, parse_money, parse_price, parse_size_gb, whole_number
from tests.bot.services.support import Clock, make_runtime
from tests.chinese import assert_chinese

REGISTRY = build_registry()
OWNER = Caller("UOWNER", "COPS")
#: The commands whose summaries this layer's modules write (help, jobs, money, policy).
OWN_COMMANDS = (
    "help",
    "run",
    "jobs",
    "logs",
    "cancel",
    "who",
    "allow",
    "deny",
    "spend",
    "budget",
    "fit",
    "estimate",
    "policy",
    "cap",
)


def refusal(text: str) -> UsageError:
    """The UsageError that parsing ``text`` raises."""
    with pytest.raises(UsageError) as caught:
        parse(text, REGISTRY)
    return caught.value


def run(rt: Runtime, text: str) -> Reply:
    spec, args = parse(text, REGISTRY)
    return spec.handler(rt, OWNER, args)


# --- help ---------------------------------------------------------------------------------------


def test_the_overview_is_chinese() -> None:
    specs = [spec for spec in _listed(REGISTRY) if spec.name in OWN_COMMANDS]
    with speaking("zh"):
        text, blocks = render_overview(specs)
    assert_chinese(text, blocks)
    assert text.startswith("gpubot 命令：\n/gpu help: 列出所有命令")
    assert "/gpu fit: 模型需要多少显存" in text
    assert blocks[0]["text"]["text"] == "gpubot：/gpu 命令一览"


@pytest.mark.parametrize("name", OWN_COMMANDS)
def test_each_command_s_help_is_chinese(name: str) -> None:
    with speaking("zh"):
        text, blocks = render_command(REGISTRY.commands[name])
    assert_chinese(text, blocks)
    assert f"/gpu {name}" in text
    assert "用法：" in text


def test_a_command_s_help_keeps_its_usage_and_examples_as_typed() -> None:
    with speaking("zh"):
        text, blocks = render_command(REGISTRY.commands["budget"])
    assert "用法：/gpu budget list | /gpu budget set user @USER AMOUNT" in text
    assert "示例：\n/gpu budget list\n/gpu budget set user @alice 500" in text
    assert blocks[-1]["elements"][0]["text"] == "别名：`budgets`"
    with speaking("zh"):
        estimate, _ = render_command(REGISTRY.commands["estimate"])
    assert "[--buy PRICE]（--hours：每张卡每月的使用时长" in estimate


def test_the_help_stays_english_by_default() -> None:
    text, blocks = render_command(REGISTRY.commands["cap"])
    assert text.startswith("/gpu cap: (admin) The longest an instance may live")
    assert blocks[2]["text"]["text"].startswith("*Usage*\n```")
    assert "\nUsage: /gpu cap NAME 3d|none\nExamples:\n" in text
    assert usage_text("/gpu cap NAME 3d|none") == "Usage: `/gpu cap NAME 3d|none`"


# --- the parser's refusals ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "chinese", "english"),
    [
        (
            "policy box1 --nope",
            "无法识别的参数：--nope。",
            "Unrecognized arguments: --nope.",
        ),
        ("policy", "缺少必需的参数：NAME。", "The following arguments are required: NAME."),
        (
            "policy box1 --at-deadline maybe",
            "参数 --at-deadline：无效的选项：'maybe'（可选：'release', 'wait-for-jobs', 'stop'）。",
            "Argument --at-deadline: invalid choice: 'maybe' "
            "(choose from 'release', 'wait-for-jobs', 'stop').",
        ),
        (
            "policy box1 --max-grace",
            "参数 --max-grace：需要一个参数值。",
            "Argument --max-grace: expected one argument.",
        ),
        (
            "spend --share=yes",
            "参数 --share：此选项不接受值：'yes'。",
            "Argument --share: ignored explicit argument 'yes'.",
        ),
        (
            "policy box1 --max-grace -2h",
            "-2h 是负数：请给出正的时长，例如 2h。",
            "-2h is negative: give a positive duration like 2h.",
        ),
        ("cap box1", "缺少必需的参数：3d|none。", "The following arguments are required: 3d|none."),
        ("stauts", "未知命令 `stauts`。你是想用 `status` 吗？", "Unknown command `stauts`."),
        ("zzzzzzzz", "未知命令 `zzzzzzzz`。", "Unknown command `zzzzzzzz`."),
        ("help a b", "`help` 最多只接受一个命令名。", "`help` takes at most one command name."),
        ("run box1", "`--` 后面没有要运行的命令。", "Nothing to run after `--`."),
        ('run box1 -- echo "hi', "无法读取命令：引号没有闭合。", "Could not read the command"),
        ("logs 42 --tail many", "--tail 'many' 不是整数。", "--tail 'many' is not a whole number."),
        ("fit 7b lora --bits 3", "不支持 --bits '3'。", "--bits '3' is not supported."),
    ],
)
def test_refusals_speak_chinese_and_english_is_unchanged(
    text: str, chinese: str, english: str
) -> None:
    with speaking("zh"):
        refused = refusal(text)
    assert refused.message == chinese
    assert_chinese(refused.user_text(), usage_text(refused.usage))
    assert refusal(text).message.startswith(english)


def test_the_usage_line_after_a_mistake_is_introduced_in_chinese() -> None:
    with speaking("zh"):
        refused = refusal("policy box1 --max-grace soon")
        usage = usage_text(refused.usage)
    assert refused.message == "'soon' 不是有效的时长"
    assert refused.hint == "时长写作 90m、2h、1h30m、3d，或 2小时、半小时、30分钟、1天。"
    assert usage.startswith("用法：`/gpu policy NAME [--at-deadline")


def test_a_long_word_is_cut_but_a_chinese_sentence_is_not() -> None:
    word = "x" * 60
    with speaking("zh"):
        refused = refusal(f"policy box1 --at-deadline {word}")
    assert refused.message == (
        "参数 --at-deadline：无效的选项：'"
        + "x" * 39
        + "…（可选：'release', 'wait-for-jobs', 'stop'）。"
    )


def test_a_broken_button_is_refused_in_chinese() -> None:
    with speaking("zh"), pytest.raises(UsageError) as caught:
        button_number("x1")
    assert caught.value.message == "这个按钮已失效；请重新运行命令。"


# --- values -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("read", "text", "quoted"),
    [
        (parse_duration, "两周", "'两周'"),
        (parse_duration, "0s", "'0s'"),
        (parse_duration, "400d", "'400d'"),
        (lambda text: parse_price(text, "CNY"), "2元/月", "'2元/月'"),
        (lambda text: parse_money(text, "CNY"), "1,2,3", "'1,2,3'"),
        (lambda text: parse_money(text, "CNY"), "abc", "'abc'"),
        (lambda text: parse_money(text, "CNY"), "1.1234567", "'1.1234567'"),
        (parse_size_gb, "big", "'big'"),
        (whole_number("--count", 1, 8), "9", "9"),
    ],
)
def test_value_refusals_are_chinese(read: Callable[[str], object], text: str, quoted: str) -> None:
    with speaking("zh"), pytest.raises(UsageError) as caught:
        read(text)
    assert quoted in caught.value.message
    assert_chinese(caught.value.user_text())


@pytest.mark.parametrize(
    ("command", "currency", "named"),
    [
        ("estimate --gpu 4090 --hours 10 --price $1.98/h", "CNY", "美元（$）"),
        ("estimate --gpu 4090 --hours 10 --price ¥2/h", "USD", "人民币或日元（¥）"),
        ("estimate --gpu 4090 --hours 10 --price 2元/小时", "USD", "CNY (元)"),
    ],
)
def test_a_price_in_another_currency_is_refused_in_chinese(
    sqlite_db: Database, command: str, currency: str, named: str
) -> None:
    rt = make_runtime(sqlite_db, Clock(datetime(2026, 12, 2, 12, 0)), currency=currency)
    with speaking("zh"), pytest.raises(UsageError) as caught:
        run(rt, command)
    message = caught.value.message
    assert message.endswith(
        f"的币种是{named}，但这里的金额以 {currency}（GPUBOT_CURRENCY）计，所以没有采用。"
    )
    assert (caught.value.hint or "").startswith(f"请以 {currency} 给出，例如 ")
    assert_chinese(caught.value.user_text())


def test_the_cny_price_hint_shows_what_chinese_users_type() -> None:
    with speaking("zh"), pytest.raises(UsageError) as caught:
        parse_price("2元/月", "CNY")
    assert caught.value.hint == "价格写作 1.98/h、¥1.98/h、1.98元/小时、0.03元/分钟 或 40元/天。"


# --- the money commands' own sentences ----------------------------------------------------------


def test_budget_mistakes_are_chinese(sqlite_db: Database) -> None:
    rt = make_runtime(sqlite_db, Clock(datetime(2026, 12, 2, 12, 0)))
    with speaking("zh"):
        for command, message in (
            ("budget list extra", "`budget list` 不接受参数。"),
            ("budget set user", "`budget set` 需要类型、对象和金额。"),
            ("budget rm user", "`budget rm` 需要类型和对象。"),
            ("budget grow", "没有 `budget grow` 这个操作。"),
        ):
            with pytest.raises(UsageError) as caught:
                run(rt, command)
            assert caught.value.message == message
            assert_chinese(caught.value.user_text())


def test_no_price_table_is_said_in_chinese(sqlite_db: Database) -> None:
    rt = make_runtime(sqlite_db, Clock(datetime(2026, 12, 2, 12, 0)), currency="EUR")
    with speaking("zh"), pytest.raises(UsageError) as caught:
        run(rt, "estimate --gpu 4090 --hours 10")
    assert caught.value.message.startswith("gpubot 没有以 EUR（GPUBOT_CURRENCY）计价的价格表")
    assert_chinese(caught.value.user_text())
