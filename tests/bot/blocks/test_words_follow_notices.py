"""Words follow notices: the renderer of a notice lives in the module of bot.blocks declared for
the service module that defines the notice, so the words for what ``bot.services.X`` says are
found in ``bot.blocks.X``.

:data:`WORDS_FOR` declares that module for every service module that defines a notice. The rule
it follows: the module of the same name (``bot.services.instances.releases`` is worded in
``bot.blocks.releases``); a service module with a notice or two is worded with the views of its
domain (``bot.services.money.budgets`` in ``bot.blocks.money``, ``bot.services.jobs.runs`` in
``bot.blocks.jobs``); ``instance_trust`` in ``bot.blocks.trust``. A new notice from a service
module not in the table fails here until the table says where its words live.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from bot import blocks
from bot.blocks import rent as rent_blocks
from bot.notify import Notice
from bot.services.instances.deadlines import DeadlineWarning
from bot.services.instances.rent import RentStarted
from tests.bot.blocks.test_render import service_notices

#: The module of bot.blocks that words the notices of each service module.
WORDS_FOR: dict[str, str] = {
    "bot.services.instances.answers": "bot.blocks.answers",
    "bot.services.instances.deadlines": "bot.blocks.deadlines",
    "bot.services.instances.instance_trust": "bot.blocks.trust",
    "bot.services.instances.lookup": "bot.blocks.instances",
    "bot.services.instances.reconcile": "bot.blocks.reconcile",
    "bot.services.instances.registration": "bot.blocks.instances",
    "bot.services.instances.releases": "bot.blocks.releases",
    "bot.services.instances.rent": "bot.blocks.rent",
    "bot.services.jobs.runs": "bot.blocks.jobs",
    "bot.services.money.bills": "bot.blocks.bills",
    "bot.services.money.budgets": "bot.blocks.money",
    "bot.services.money.digest": "bot.blocks.money",
    "bot.services.speaking.outbox": "bot.blocks.outbox",
}

Renderers = Mapping[type[Notice], Callable[[Any], object]]


def misplaced(renderers: Renderers, words_for: Mapping[str, str]) -> list[str]:
    """Every renderer of ``renderers`` not in the module ``words_for`` declares for its notice's
    service module, and every notice whose module declares none, as sentences (sorted)."""
    found = []
    for notice, renderer in renderers.items():
        defined_in = notice.__module__
        home = words_for.get(defined_in)
        worded_in = getattr(renderer, "__module__", None)
        if home is None:
            found.append(f"{notice.__qualname__} ({defined_in}): no module declared for its words")
        elif worded_in != home:
            found.append(f"{notice.__qualname__} ({defined_in}): worded in {worded_in}, not {home}")
    return sorted(found)


def test_every_renderer_lives_in_the_module_declared_for_its_notice_s_service() -> None:
    assert misplaced(blocks.RENDERERS, WORDS_FOR) == []
    assert misplaced(blocks.FILE_RENDERERS, WORDS_FOR) == []


def test_the_table_names_exactly_the_service_modules_with_notices_and_real_modules() -> None:
    defining = {notice.__module__ for notice in service_notices()}
    assert set(WORDS_FOR) == defining
    for words in set(WORDS_FOR.values()):
        assert hasattr(importlib.import_module(words), "RENDERERS"), words


def test_a_renderer_in_another_module_is_named_with_where_it_belongs() -> None:
    wrong = {DeadlineWarning: rent_blocks.rent_started, RentStarted: rent_blocks.rent_started}
    assert misplaced(wrong, WORDS_FOR) == [
        "DeadlineWarning (bot.services.instances.deadlines): worded in bot.blocks.rent, "
        "not bot.blocks.deadlines"
    ]


def test_a_notice_of_an_undeclared_service_module_is_named() -> None:
    stray = type("Stray", (Notice,), {"__module__": "bot.services.instances.stray"})
    assert misplaced({stray: rent_blocks.rent_started}, WORDS_FOR) == [
        "Stray (bot.services.instances.stray): no module declared for its words"
    ]


def test_every_renderers_table_of_a_blocks_module_is_joined_in_the_one_door() -> None:
    joined = 0
    for info in pkgutil.iter_modules(blocks.__path__, "bot.blocks."):
        table = getattr(importlib.import_module(info.name), "RENDERERS", None)
        if table is None:
            continue
        joined += 1
        assert table.items() <= blocks.RENDERERS.items(), info.name
    assert joined == len(set(WORDS_FOR.values()))
