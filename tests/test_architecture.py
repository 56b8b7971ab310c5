"""The floors hold: imports point down, services speak in notices, nothing imports in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.architecture import (
    ROOT,
    Edge,
    cycles,
    edges,
    floor_of,
    modules,
    service_floor_of,
    upward,
    upward_in_services,
)


def test_no_import_points_up_a_floor() -> None:
    assert [_show(e) for e in upward(edges())] == []


def test_no_service_imports_up_the_services_floors() -> None:
    """Compositions over jobs over an instance's life over money over speaking over access."""
    assert [_show(e) for e in upward_in_services(edges())] == []


def test_every_service_module_sits_in_a_domain() -> None:
    """bot/services holds the domain packages and the compositions; a new flat module must
    choose its domain."""
    flat = [
        name
        for name in modules()
        if name.startswith("bot.services.")
        and name.count(".") == 2
        and name
        not in (
            "bot.services.access",
            "bot.services.tick",
            "bot.services.home",
            "bot.services.prompt_kinds",
            "bot.services.speaking",
            "bot.services.money",
            "bot.services.instances",
            "bot.services.jobs",
        )
    ]
    assert flat == []


def test_the_services_check_catches_an_upward_import(tmp_path: Path) -> None:
    for path in (
        "bot/__init__.py",
        "bot/services/__init__.py",
        "bot/services/money/__init__.py",
        "bot/services/jobs/__init__.py",
    ):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "agents").mkdir()
    (tmp_path / "bot/services/money/ledger.py").write_text("from bot.services.jobs import runs\n")
    (tmp_path / "bot/services/jobs/runs.py").write_text("from bot.services.money import ledger\n")
    found = edges(tmp_path)
    assert [_show(e) for e in upward_in_services(found)] == [
        "bot.services.money.ledger -> bot.services.jobs.runs (line 1)"
    ]
    assert service_floor_of("bot.services.jobs.runs") == "jobs"
    assert service_floor_of("bot.blocks.kit") is None


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
    limits; bot.slack_requests builds only what Slack itself sends (the payload of a click)."""
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
        if name in ("bot.blocks.kit", "bot.slack_requests") or not name.startswith("bot"):
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
    assert {"bot.services.tick", "bot.services.jobs.runs", "bot.blocks.kit"} <= set(found)
    assert all(path.is_relative_to(ROOT) for path in found.values())


#: The size past which a module says in its docstring why it is one module.
LONG_MODULE_LINES = 800


def test_a_long_module_says_why_it_is_one() -> None:
    unexplained = [
        f"{name} ({lines} lines)"
        for name, path in modules().items()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > LONG_MODULE_LINES
        and "Why one module of this size" not in (_docstring(path) or "")
    ]
    assert unexplained == []


def _docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
