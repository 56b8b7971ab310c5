"""`/gpu help [COMMAND]`: the list of commands, or one command's usage and examples.

The renderers are pure: specs in, (fallback text, Block Kit blocks) out, built with
bot.blocks.kit and so within Slack's limits.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bot.blocks import kit
from bot.blocks.kit import Block
from bot.commands.registry import CommandSpec, Registry, Reply
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
    "fit",
    "estimate",
    "lang",
)


def help_spec(registry: Registry) -> CommandSpec:
    """The help command for ``registry``: lists what is registered there when it runs."""

    def handle(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
        topic = getattr(args, "topic", None)
        if topic:
            # The parser has resolved the topic to a command's own name.
            spec = registry.commands.get(str(topic)) or help_spec(registry)
            text, blocks = render_command(spec)
        else:
            text, blocks = render_overview(_listed(registry))
        return Reply(text=text, blocks=tuple(blocks))

    return CommandSpec(
        name="help",
        summary="List the commands, or show one command's usage and examples",
        usage=HELP_USAGE,
        examples=("/gpu help", "/gpu help register"),
        configure=_configure,
        handler=handle,
    )


def render_overview(specs: Sequence[CommandSpec]) -> tuple[str, list[Block]]:
    """Every command with its summary: fallback text and blocks (sections packed under 3000)."""
    lines = [f"`{_slash(spec.name)}` {sentence(spec.summary)}" for spec in specs]
    text = "gpubot commands:\n" + "\n".join(
        f"{_slash(spec.name)}: {sentence(spec.summary)}" for spec in specs
    )
    blocks: list[Block] = [kit.header("gpubot: the /gpu commands")]
    blocks.extend(kit.section(chunk) for chunk in kit.pack(lines, kit.SECTION_TEXT_MAX))
    blocks.append(
        kit.context(
            "Type `/gpu help COMMAND` for its usage and examples. "
            "Durations read like `90m`, `2h`, `1h30m`, `3d`; times like `18:00` or ISO 8601."
        )
    )
    return text, blocks


def render_command(spec: CommandSpec) -> tuple[str, list[Block]]:
    """One command: summary, usage and examples, as fallback text and blocks."""
    summary = sentence(spec.summary)
    usage = _slash_line(spec.usage)
    examples = [_slash_line(example) for example in spec.examples]
    text = f"{_slash(spec.name)}: {summary}\nUsage: {usage}"
    if examples:
        text += "\nExamples:\n" + "\n".join(examples)
    blocks: list[Block] = [
        kit.header(_slash(spec.name)),
        kit.section(summary),
        kit.section(_code("Usage", [usage])),
    ]
    if examples:
        blocks.append(kit.section(_code("Examples", examples)))
    if spec.aliases:
        blocks.append(kit.context("Also: " + ", ".join(f"`{alias}`" for alias in spec.aliases)))
    return text, blocks


def usage_text(usage: str) -> str:
    """A usage line as shown after a mistake: ``Usage: `/gpu ...` ``."""
    return f"Usage: `{_slash_line(usage)}`" if usage else ""


def sentence(summary: str) -> str:
    """A summary as the help shows it: trimmed, no final full stop, its first word capitalised
    (after a leading tag like ``(admin)``), so every module's summaries read alike."""
    text = " ".join(summary.split()).rstrip(".")
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
