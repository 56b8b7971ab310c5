"""bot.blocks.render, the one door from a service's notice to a Slack message."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import bot.services
from bot import blocks
from bot.notify import Notice


def service_notices() -> set[type[Notice]]:
    """Every notice type a module of bot.services (or of one of its packages) defines."""
    found: set[type[Notice]] = set()
    for info in pkgutil.walk_packages(bot.services.__path__, "bot.services."):
        module = importlib.import_module(info.name)
        found |= {
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, Notice)
            and value is not Notice
            and value.__module__ == module.__name__
        }
    return found


def test_every_notice_a_service_defines_has_a_renderer() -> None:
    notices = service_notices()
    assert len(notices) > 30
    assert sorted(n.__qualname__ for n in notices - set(blocks.RENDERERS)) == []


def test_a_notice_without_a_renderer_is_refused_by_name() -> None:
    class Unknown(Notice):
        pass

    with pytest.raises(TypeError, match="no renderer for the notice Unknown"):
        blocks.render(Unknown())
