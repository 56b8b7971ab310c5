"""One word, one meaning: "render" turns a notice into Block Kit, and only bot.blocks does it.

The services say what a prompt says with ``notice_for`` (joined in
bot.services.prompt_kinds.PROMPT_NOTICES); a function named ``render`` there would read as if a
service built Slack messages.
"""

from __future__ import annotations

import ast
from pathlib import Path

from bot.blocks import render
from bot.services import prompt_kinds
from bot.services.instances import deadlines, releases
from tests.architecture import ROOT, modules


def _renders(root: Path = ROOT) -> dict[str, list[str]]:
    """Where each function or method whose name is ``render`` or starts with ``render_`` is
    defined: function name -> ["module:line", ...], over the shipped packages under ``root``."""
    found: dict[str, list[str]] = {}
    for name, path in modules(root).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name == "render" or node.name.startswith("render_"):
                found.setdefault(node.name, []).append(f"{name}:{node.lineno}")
    return found


def _in_services(places: list[str]) -> list[str]:
    return [place for place in places if place.startswith("bot.services")]


def test_no_service_defines_a_function_named_render() -> None:
    wrong = [place for places in _renders().values() for place in _in_services(places)]
    assert wrong == []


def test_render_lives_in_the_presentation_floor() -> None:
    places = _renders()["render"]
    assert places
    assert [place for place in places if not place.startswith("bot.blocks")] == []
    assert render.__module__ == "bot.blocks"


def test_the_prompt_side_says_notice_for() -> None:
    assert deadlines.PROMPT_NOTICES
    assert releases.PROMPT_NOTICES
    assert {f.__name__ for f in deadlines.PROMPT_NOTICES.values()} == {"notice_for"}
    assert {f.__name__ for f in releases.PROMPT_NOTICES.values()} == {"notice_for"}
    assert deadlines.PROMPT_NOTICES.items() <= prompt_kinds.PROMPT_NOTICES.items()
    assert releases.PROMPT_NOTICES.items() <= prompt_kinds.PROMPT_NOTICES.items()


def test_the_rule_catches_a_service_render(tmp_path: Path) -> None:
    for path in ("bot/__init__.py", "bot/services/__init__.py", "bot/blocks/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "agents").mkdir()
    (tmp_path / "bot/services/a.py").write_text(
        "def notice_for() -> None: ...\n\n\nclass A:\n    def render_row(self) -> None: ...\n"
    )
    (tmp_path / "bot/blocks/b.py").write_text("async def render() -> None: ...\n")
    found = _renders(tmp_path)
    assert _in_services(found["render_row"]) == ["bot.services.a:5"]
    assert found["render"] == ["bot.blocks.b:1"]
    assert "notice_for" not in found
