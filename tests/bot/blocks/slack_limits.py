"""Checking a rendered message against Slack's rules with slack_sdk's own models, plus the limits
those models do not check on nested objects (buttons inside actions, confirm dialogs)."""

from __future__ import annotations

from typing import Any

from slack_sdk.models.blocks import Block, BlockElement

Message = tuple[str, tuple[dict[str, Any], ...]]


def check_message(message: Message) -> list[dict[str, Any]]:
    """Assert ``(text, blocks)`` is a message Slack accepts; returns the blocks."""
    text, blocks = message
    assert text.strip(), "a message needs a fallback text"
    assert len(blocks) <= 50, f"{len(blocks)} blocks"
    for block in blocks:
        check_block(block)
    return list(blocks)


def check_block(block: dict[str, Any]) -> None:
    """One block, with everything nested in it."""
    model = Block.parse(block)
    assert model is not None, block
    model.validate_json()
    assert model.to_dict() == block, "slack_sdk reads the block differently"
    kind = block["type"]
    if kind == "section":
        assert "text" in block or "fields" in block
        if "text" in block:
            assert 0 < len(block["text"]["text"]) <= 3000
        for item in block.get("fields", []):
            assert 0 < len(item["text"]) <= 2000
        assert len(block.get("fields", [])) <= 10
        if "accessory" in block:
            _check_element(block["accessory"])
    elif kind == "header":
        assert 0 < len(block["text"]["text"]) <= 150
    elif kind == "context":
        assert 0 < len(block["elements"]) <= 10
    elif kind == "actions":
        assert 0 < len(block["elements"]) <= 25
        for element in block["elements"]:
            _check_element(element)


def _check_element(element: dict[str, Any]) -> None:
    model = BlockElement.parse(element)
    assert model is not None, element
    model.validate_json()
    if element["type"] == "button":
        assert 0 < len(element["text"]["text"]) <= 75
        assert len(element.get("value", "")) <= 2000
        assert len(element["action_id"]) <= 255
    confirm = element.get("confirm")
    if confirm is not None:
        assert 0 < len(confirm["title"]["text"]) <= 100
        assert 0 < len(confirm["text"]["text"]) <= 300
        assert len(confirm["confirm"]["text"]) <= 30
        assert len(confirm["deny"]["text"]) <= 30


def all_text(blocks: list[dict[str, Any]]) -> str:
    """Every piece of text in the blocks, joined (for asserting what a reader sees)."""
    parts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("text"), str):
                parts.append(value["text"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(blocks)
    return "\n".join(parts)


def buttons(blocks: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(action_id, value) of every button."""
    found: list[tuple[str, str]] = []
    for block in blocks:
        elements = block.get("elements", []) if block["type"] == "actions" else []
        if "accessory" in block:
            elements = [*elements, block["accessory"]]
        found.extend(
            (e["action_id"], e.get("value", "")) for e in elements if e["type"] == "button"
        )
    return found
