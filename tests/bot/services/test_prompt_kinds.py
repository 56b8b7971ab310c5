"""The table of prompt kinds holds every kind a service creates, so none is silently never
posted."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import bot.services
from bot.services import prompt_kinds

SERVICES = Path(bot.services.__file__).parent


def _created_kinds() -> set[str]:
    """The kinds passed to ``ensure_prompt(kind=...)`` anywhere under bot/services."""
    found: set[str] = set()
    for path in sorted(SERVICES.rglob("*.py")):
        dotted = ".".join(path.relative_to(SERVICES.parent.parent).with_suffix("").parts)
        module = importlib.import_module(dotted)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and _named(node.func, "ensure_prompt")):
                continue
            for keyword in node.keywords:
                if keyword.arg == "kind" and isinstance(keyword.value, ast.Name):
                    found.add(getattr(module, keyword.value.id))
                elif keyword.arg == "kind" and isinstance(keyword.value, ast.Constant):
                    found.add(keyword.value.value)
    return found


def _named(func: ast.expr, name: str) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == name
    return isinstance(func, ast.Name) and func.id == name


def test_every_kind_a_service_creates_says_something() -> None:
    created = _created_kinds()
    assert {"deadline_warning", "release_manual", "host_key_changed"} <= created
    assert created <= set(prompt_kinds.PROMPT_NOTICES)
