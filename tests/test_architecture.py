"""The floors hold: imports point down, services speak in notices, nothing imports in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.architecture import ROOT, Edge, cycles, edges, floor_of, modules, upward


def test_no_import_points_up_a_floor() -> None:
    assert [_show(e) for e in upward(edges())] == []


def test_no_service_imports_the_presentation_or_command_floors() -> None:
    wrong = [
        _show(e)
        for e in edges()
        if e.source.startswith("bot.services")
        and e.target.startswith(("bot.blocks", "bot.commands", "bot.charts"))
    ]
    assert wrong == []


def test_the_agent_imports_nothing_of_the_bot() -> None:
    wrong = [
        _show(e) for e in edges() if e.source.startswith("agents") and e.target.startswith("bot")
    ]
    assert wrong == []


def test_the_import_graph_has_no_circles() -> None:
    assert cycles(edges()) == []


def test_the_checks_catch_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    for path in ("bot/__init__.py", "bot/services/__init__.py", "bot/blocks/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "agents").mkdir()
    (tmp_path / "bot/services/a.py").write_text("from bot.blocks import b\n")
    (tmp_path / "bot/blocks/b.py").write_text("def f() -> None:\n    from bot.services import a\n")
    found = edges(tmp_path)
    assert [_show(e) for e in upward(found)] == ["bot.services.a -> bot.blocks.b (line 1)"]
    assert cycles(found) == [["bot.blocks.b", "bot.services.a"]]


def test_every_module_stands_on_a_named_floor() -> None:
    loose = [
        name
        for name in modules()
        if name.startswith("bot.")
        and floor_of(name) == "values"
        and name
        not in (
            "bot.values",
            "bot.errors",
            "bot.settings",
            "bot.logging_setup",
            "bot.i18n",
            "bot.text",
        )
    ]
    assert loose == []


def test_no_block_kit_is_built_outside_the_presentation_floor() -> None:
    """A Block Kit block is a dict with a "type" key such as "section"; only bot/blocks builds
    them (the Slack stand-in and the notifier only read them)."""
    kinds = {"section", "actions", "header", "context", "divider", "button", "mrkdwn"}
    wrong = []
    for name, path in modules().items():
        if floor_of(name) not in ("services", "lower", "values"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict) and _builds_block(node, kinds):
                wrong.append(f"{name}:{node.lineno}")
    assert wrong == []


def test_every_block_kit_block_comes_from_the_kit() -> None:
    """Blocks, their elements and views are built by bot.blocks.kit alone, which keeps Slack's
    limits; the Slack stand-in builds only what Slack itself sends (the payload of a click)."""
    kinds = {
        "section",
        "actions",
        "header",
        "context",
        "divider",
        "image",
        "input",
        "button",
        "static_select",
        "checkboxes",
        "plain_text_input",
        "mrkdwn",
        "plain_text",
        "modal",
        "home",
    }
    wrong = []
    for name, path in modules().items():
        if name in ("bot.blocks.kit", "bot.local_slack") or not name.startswith("bot"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict) and _builds_block(node, kinds):
                wrong.append(f"{name}:{node.lineno}")
    assert wrong == []


def _builds_block(node: ast.Dict, kinds: set[str]) -> bool:
    for key, value in zip(node.keys, node.values, strict=True):
        if (
            isinstance(key, ast.Constant)
            and key.value == "type"
            and isinstance(value, ast.Constant)
            and value.value in kinds
        ):
            return True
    return False


def _show(edge: Edge) -> str:
    return f"{edge.source} -> {edge.target} (line {edge.line})"


def test_the_graph_reads_the_whole_tree() -> None:
    found = modules()
    assert {"bot.services.tick", "bot.blocks.kit", "agents.protocol"} <= set(found)
    assert all(path.is_relative_to(ROOT) for path in found.values())
