"""`/gpu help [COMMAND]`: the list of commands, or one command's usage and examples.

The renderers are pure: specs in, (fallback text, Block Kit blocks) out, built with
bot.blocks.kit and so within Slack's limits. They speak the active language: every summary and
usage line is looked up in the catalogue (each command module marks its own with ``N_``);
commands, options and examples are shown as typed. Their amounts are in the workspace's
currency: the commands write dollar figures, and a workspace that counts in yuan
(GPUBOT_CURRENCY=CNY) reads yuan ones (:func:`in_currency`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from bot.blocks import kit
from bot.blocks.kit import Block
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.i18n import N_, t
from bot.services.access import Caller

if TYPE_CHECKING:
    from bot.runtime import Runtime

HELP_USAGE = "/gpu help [COMMAND]"
#: The order of the overview (DESIGN.md's); commands not named here follow in registration order.
HELP_ORDER = (
    "help",
    "register",
    "status",
    "list",
    "health",
    "extend",
    "release",
    "rent",
    "adopt",
    "policy",
    "cap",
    "run",
    "jobs",
    "logs",
    "cancel",
    "who",
    "allow",
    "deny",
    "spend",
    "budget",
    "bills",
    "fit",
    "estimate",
    "lang",
)
#: The amounts of the commands' examples and usage lines (dollar figures) as a workspace that
#: counts in yuan writes them: prices as the platforms in China list them, budgets in 元.
YUAN_AMOUNTS: Final[Mapping[str, str]] = {
    "--price 2.10/h": "--price ¥3.5/小时",
    "--price 24/h": "--price 160元/小时",
    "--price 0.69/h": "--price 2.2",
    "--price 13.50/h": "--price 1.66元/小时",
    "--price 1.01/h": "--price 7.3元/小时",
    "--storage 0.10/GB-month": "--storage 0.35元/GB/月",
    "--monthly 350": "--monthly 1800",
    "--buy 1800": "--buy 13000",
}
_YUAN_AMOUNT = re.compile("|".join(re.escape(amount) for amount in YUAN_AMOUNTS))
#: A budget's amount at the end of an example (`/gpu budget set user @alice 500`).
_BUDGET_AMOUNT = re.compile(r"^(/gpu budget set \S+ \S+) (\d+)$")
#: Dollars to yuan for a budget (a round figure).
_YUAN_PER_DOLLAR = 6


def help_spec(registry: Registry) -> CommandSpec:
    """The help command for ``registry``: lists what is registered there when it runs."""

    def handle(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
        topic = getattr(args, "topic", None)
        if topic:
            # The parser has resolved the topic to a command's own name.
            spec = registry.commands.get(str(topic)) or help_spec(registry)
            text, blocks = render_command(spec, currency=rt.settings.currency)
        else:
            text, blocks = render_overview(_listed(registry))
            blocks.extend(kit.context(line) for line in billing_notes(rt))
        return Reply(text=text, blocks=tuple(blocks))

    return CommandSpec(
        name="help",
        summary=N_("List the commands, or show one command's usage and examples"),
        usage=HELP_USAGE,
        examples=("/gpu help", "/gpu help register"),
        configure=_configure,
        handler=handle,
    )


def billing_notes(rt: Runtime) -> list[str]:
    """What the overview says of billing rules that are settings rather than documented facts:
    Compshare's increment (GPUBOT_COMPSHARE_BILLING), when Compshare is configured."""
    if "compshare" not in rt.providers.names():
        return []
    unit = t("hour") if rt.settings.compshare_billing == "hour" else t("second")
    return [
        t(
            "优云智算 Compshare is billed here by the {unit} (GPUBOT_COMPSHARE_BILLING): no "
            "Compshare document states its increment, so this rule is unverified.",
            unit=unit,
        )
    ]


def render_overview(specs: Sequence[CommandSpec]) -> tuple[str, list[Block]]:
    """Every command with its summary: fallback text and blocks (sections packed under 3000)."""
    summaries = [(_slash(spec.name), sentence(t(spec.summary))) for spec in specs]
    lines = [f"`{slash}` {summary}" for slash, summary in summaries]
    text = (
        t("gpubot commands:")
        + "\n"
        + "\n".join(f"{slash}: {summary}" for slash, summary in summaries)
    )
    blocks: list[Block] = [kit.header(t("gpubot: the /gpu commands"))]
    blocks.extend(kit.section(chunk) for chunk in kit.pack(lines, kit.SECTION_TEXT_MAX))
    blocks.append(
        kit.context(
            t(
                "Type `/gpu help COMMAND` for its usage and examples. "
                "Durations read like `90m`, `2h`, `1h30m`, `3d`; times like `18:00` or ISO 8601."
            )
        )
    )
    return text, blocks


def render_command(spec: CommandSpec, *, currency: str = "USD") -> tuple[str, list[Block]]:
    """One command: summary, usage and examples, as fallback text and blocks; amounts in
    ``currency`` (:func:`in_currency`)."""
    summary = sentence(t(spec.summary))
    usage = in_currency(_slash_line(t(spec.usage)), currency)
    examples = [in_currency(_slash_line(example), currency) for example in spec.examples]
    text = f"{_slash(spec.name)}: {summary}\n" + t("Usage: {usage}", usage=usage)
    if examples:
        text += "\n" + t("Examples:") + "\n" + "\n".join(examples)
    blocks: list[Block] = [
        kit.header(_slash(spec.name)),
        kit.section(summary),
        kit.section(_code(t("Usage"), [usage])),
    ]
    if examples:
        blocks.append(kit.section(_code(t("Examples"), examples)))
    if spec.aliases:
        aliases = ", ".join(f"`{alias}`" for alias in spec.aliases)
        blocks.append(kit.context(t("Also: {aliases}", aliases=aliases)))
    return text, blocks


def usage_text(usage: str) -> str:
    """A usage line as shown after a mistake: ``Usage: `/gpu ...` ``, in the active language."""
    return t("Usage: `{usage}`", usage=_slash_line(t(usage))) if usage else ""


def in_currency(line: str, currency: str) -> str:
    """An example or usage line with its amounts as ``currency`` writes them: in yuan (CNY)
    the dollar figures of :data:`YUAN_AMOUNTS` become yuan ones (``--price ¥3.5/小时``,
    ``--storage 0.35元/GB/月``) and a budget is in 元 (``/gpu budget set user @alice 3000元``);
    any other currency keeps the line as written (plain figures read in its own unit)."""
    if currency.upper() != "CNY":
        return line
    line = _YUAN_AMOUNT.sub(lambda match: YUAN_AMOUNTS[match.group(0)], line)
    return _BUDGET_AMOUNT.sub(
        lambda match: f"{match.group(1)} {int(match.group(2)) * _YUAN_PER_DOLLAR}元", line
    )


def sentence(summary: str) -> str:
    """A summary as the help shows it: trimmed, no final full stop, its first word capitalised
    (after a leading tag like ``(admin)``), so every module's summaries read alike."""
    text = " ".join(summary.split()).rstrip(".。")
    tag = ""
    if text.startswith("(") and ") " in text:
        tag, text = text.split(") ", 1)
        tag += ") "
    return tag + text[:1].upper() + text[1:]


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic", nargs="?", metavar="COMMAND")


def _listed(registry: Registry) -> list[CommandSpec]:
    specs = registry.primary_commands()
    if not any(spec.name == "help" for spec in specs):
        specs.insert(0, help_spec(registry))
    rank = {name: i for i, name in enumerate(HELP_ORDER)}
    return sorted(specs, key=lambda spec: rank.get(spec.name, len(rank)))


def _slash(name: str) -> str:
    return f"/gpu {name}"


def _slash_line(line: str) -> str:
    stripped = line.strip()
    return stripped if stripped.startswith("/gpu") else f"/gpu {stripped}"


def _code(title: str, lines: Sequence[str]) -> str:
    fence = "```"
    budget = kit.SECTION_TEXT_MAX - len(title) - 3 - 2 * len(fence) - 2
    body = kit.clip("\n".join(line.replace(fence, "'''") for line in lines), budget)
    return f"*{title}*\n{fence}\n{body}\n{fence}"


def register(registry: Registry) -> None:
    """Add `/gpu help` to ``registry``: it lists every command the registry holds when asked."""
    registry.command(help_spec(registry))
